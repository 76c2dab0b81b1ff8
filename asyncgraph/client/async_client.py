"""The async client: one view over all partitions, whether served remotely or held locally.

Every partition is a ``Partition``: a ``RemotePartition`` over a connection, or a
``LocalPartition`` over an in-process store (a co-located server's memory, or, standalone, the
partition itself). A call that spans partitions is validated, split by owner through the
partition book and handed to ``scatter``, which reassembles it in the caller's order. Standalone
is simply "every partition is local", so standalone results equal served results.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import as_id_array, check_rows
from asyncgraph.env import ENV_MALLOC_TUNING
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, UnknownTensorError
from asyncgraph.kernels.sparse_optim import validate_spec
from asyncgraph.malloc import retain_large_allocations
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.protocol.ops import BarrierArgs, Op
from asyncgraph.service import LocalPartition, Partition, PartitionService
from asyncgraph.service.base import SampledRows
from asyncgraph.storage.store import PartitionStore, TensorMeta

from .cache import FeatureCache, Traffic
from .connection import Connection
from .partitions import open_partitions
from .scatter import broadcast, gather_rows, scatter, split_by_owner, take

DEFAULT_CALL_TIMEOUT = 60.0


def meta_row_bytes(meta: TensorMeta) -> int:
    """Bytes of one row of ``meta``'s tensor."""
    return int(np.dtype(meta.dtype).itemsize * int(np.prod(meta.row_shape, dtype=np.int64)))


class AsyncClient:
    """Typed async access to a partitioned graph's tensors, structure and barriers."""

    def __init__(
        self,
        graph_name: str,
        book: RangePartitionBook,
        partitions: Sequence[Partition],
        *,
        connections: Sequence[Connection] = (),
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        num_clients: int = 1,
    ) -> None:
        self.graph_name = graph_name
        self.book = book
        self.partitions = list(partitions)
        self.connections = list(connections)
        self.call_timeout = call_timeout
        self.num_clients = num_clients
        self._metas: dict[str, TensorMeta] = {}
        self._caches: dict[str, FeatureCache] = {}

    # --- construction -----------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        servers: Sequence[tuple[str, int]],
        *,
        graph_name: str | None = None,
        secret: bytes | None = None,
        connect_timeout: float = 30.0,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        use_shared_memory: bool = True,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_inflight: int = 32,
        local_partitions: Sequence[int] | None = None,
    ) -> AsyncClient:
        """Connect to every server (one per partition, in partition order) concurrently.

        With ``use_shared_memory`` (the default), partitions whose server runs on this host are
        read and written through shared memory instead of the socket. ``local_partitions``
        restricts that to the listed partition IDs (e.g. a trainer's own partition, as DGL
        does); ``None`` attaches every co-located partition, ``[]`` none. Partition IDs outside
        ``[0, num_partitions)`` raise ``InvalidRequestError``.

        Connecting also tunes glibc malloc to recycle large buffers (``retain_large_allocations``:
        big pulls otherwise pay a page fault per 4 KiB of every result); set the environment
        variable ``ASYNCGRAPH_MALLOC_TUNING=0`` to leave malloc alone.
        """
        if os.environ.get(ENV_MALLOC_TUNING, "1") != "0":
            retain_large_allocations()
        served = await open_partitions(
            servers,
            graph_name=graph_name,
            secret=secret,
            connect_timeout=connect_timeout,
            call_timeout=call_timeout,
            use_shared_memory=use_shared_memory,
            max_frame_size=max_frame_size,
            max_inflight=max_inflight,
            local_partitions=local_partitions,
        )
        client = cls(
            served.graph_name,
            served.book,
            served.partitions,
            connections=served.connections,
            call_timeout=call_timeout,
            num_clients=served.num_clients,
        )
        client._remember(served.tensors)
        return client

    @classmethod
    def standalone(cls, part_config: str | Path) -> AsyncClient:
        """Every partition of ``part_config`` held in this process: no server, same API."""
        from asyncgraph.partition import PartitionConfig, load_partition

        config = PartitionConfig.load(part_config)
        services = [
            PartitionService(PartitionStore.from_partition(load_partition(part_config, p), shared=False))
            for p in range(config.num_parts)
        ]
        client = cls(config.graph_name, config.book(), [LocalPartition(s) for s in services])
        client._remember(services[0].list_tensors())
        return client

    # --- metadata ---------------------------------------------------------------------------
    @property
    def num_partitions(self) -> int:
        return self.book.num_partitions()

    @property
    def is_standalone(self) -> bool:
        """True when no server is involved: every partition is held in this process."""
        return not self.connections

    def local_partitions(self) -> list[int]:
        return [p.part_id for p in self.partitions if p.store is not None]

    def tensor_names(self) -> list[str]:
        return sorted(self._metas)

    def cached_meta(self, name: str) -> TensorMeta | None:
        return self._metas.get(name)

    async def tensor_meta(self, name: str) -> TensorMeta:
        meta = self._metas.get(name)
        if meta is None:
            await self.refresh_tensors()
            meta = self._metas.get(name)
        if meta is None:
            raise UnknownTensorError(f"no tensor named {name!r}; known: {sorted(self._metas)}")
        return meta

    async def refresh_tensors(self) -> list[TensorMeta]:
        metas = await self.partitions[0].list_tensors()
        self._metas.clear()
        self._remember(metas)
        return list(self._metas.values())

    def _remember(self, metas: Sequence[TensorMeta]) -> None:
        for meta in metas:
            self._metas[meta.name] = meta

    async def info(self, part_id: int = 0) -> dict[str, Any]:
        """Partition ``part_id``'s description, as its server (or, standalone, its store) gives it."""
        return await self.partitions[part_id].info()

    # --- tensors ----------------------------------------------------------------------------
    async def pull(self, name: str, ids: Any) -> torch.Tensor:
        """Rows ``ids`` (global, any order, duplicates allowed) of tensor ``name``."""
        return torch.from_numpy(await self.pull_numpy(name, ids))

    async def pull_numpy(self, name: str, ids: Any, traffic: Traffic | None = None) -> np.ndarray:
        """Rows ``ids`` of ``name`` as numpy; served from the tensor's feature cache where it holds
        them. ``traffic`` (optional) accumulates remote rows/bytes/requests and cache hits/misses."""
        meta = await self.tensor_meta(name)
        gids = as_id_array(ids)
        cache = self._caches.get(name)
        if cache is None:
            return await self._pull_uncached(name, meta, gids, traffic)
        hit, slot = cache.lookup(gids)
        hits = int(np.count_nonzero(hit))
        before = traffic.remote_rows if traffic is not None else 0
        if hits == 0:
            out = await self._pull_uncached(name, meta, gids, traffic)
        else:
            out = np.empty((gids.size, *meta.row_shape), dtype=meta.dtype)
            out[hit] = cache.rows[slot[hit]]
            if hits < gids.size:
                miss = np.flatnonzero(~hit)
                out[miss] = await self._pull_uncached(name, meta, gids[miss], traffic)
        if traffic is not None:
            traffic.cache_hits += hits
            traffic.cache_misses += traffic.remote_rows - before
        return out

    async def _pull_uncached(
        self, name: str, meta: TensorMeta, gids: np.ndarray, traffic: Traffic | None
    ) -> np.ndarray:
        parts = split_by_owner(self.book.owner(gids, meta.policy), self.num_partitions)
        if traffic is not None:
            rows = self._count_remote(parts, Op.PULL, traffic)
            traffic.remote_rows += rows
            traffic.remote_bytes += rows * meta_row_bytes(meta)
        rows_by_part = await scatter(
            self.partitions, parts, Op.PULL, lambda p, pos: p.pull(name, take(gids, pos))
        )
        return gather_rows(rows_by_part, gids.size, meta.row_shape, meta.dtype)

    def _count_remote(self, parts: Sequence[np.ndarray], op: Op, traffic: Traffic) -> int:
        """Count the requests of ``parts`` that go over a socket in ``traffic``; their rows."""
        rows = 0
        for part, pos in zip(self.partitions, parts, strict=True):
            if pos.size and not part.runs_here(op):
                rows += int(pos.size)
                traffic.remote_requests += 1
        return rows

    def remote_ids(self, policy: str = "node") -> np.ndarray:
        """Global IDs owned by partitions reached over a socket (candidates for a feature cache)."""
        book = self.book
        ranges = []
        for part in self.partitions:
            if not part.runs_here(Op.PULL):
                lo, hi = book.node_range(part.part_id) if policy == "node" else book.edge_range(part.part_id)
                ranges.append(np.arange(lo, hi, dtype=np.int64))
        return np.concatenate(ranges) if ranges else np.empty(0, np.int64)

    # --- feature cache ------------------------------------------------------------------------
    async def build_cache(self, name: str, ids: Any) -> FeatureCache:
        """Cache rows ``ids`` of read-only tensor ``name`` in this process (replacing its cache).

        Later pulls of ``name`` read cached rows here; this client's own writes to ``name`` drop
        the cache. Only cache tensors no other process writes while the cache is in use.
        """
        meta = await self.tensor_meta(name)
        gids = np.unique(as_id_array(ids))
        self._caches.pop(name, None)
        rows = await self._pull_uncached(name, meta, gids, None)
        cache = FeatureCache(name, gids, np.ascontiguousarray(rows))
        self._caches[name] = cache
        return cache

    def feature_cache(self, name: str) -> FeatureCache | None:
        return self._caches.get(name)

    def drop_cache(self, name: str) -> None:
        self._caches.pop(name, None)

    async def push(self, name: str, ids: Any, values: Any, op: str = "assign") -> None:
        """Write rows: ``op="assign"`` replaces, ``"add"`` accumulates (duplicates add up).

        Everything is validated before any partition is written, so a bad push changes nothing.
        """
        if op not in ("assign", "add"):
            raise InvalidRequestError(f"push: op must be 'assign' or 'add', got {op!r}")
        self._caches.pop(name, None)
        meta = await self.tensor_meta(name)
        gids = as_id_array(ids)
        _, vals = check_rows(f"push to {name!r}", gids, values, dtype=meta.dtype, row_shape=meta.row_shape)
        parts = split_by_owner(self.book.owner(gids, meta.policy), self.num_partitions)
        await scatter(
            self.partitions, parts, Op.PUSH, lambda p, pos: p.push(name, take(gids, pos), take(vals, pos), op)
        )

    async def create_tensor(
        self,
        name: str,
        policy: str,
        shape: Sequence[int],
        dtype: str,
        init: Mapping[str, Any] | None = None,
    ) -> TensorMeta:
        """Create (or get, if identical) a tensor sharded by node or edge ranges on every partition."""
        self._caches.pop(name, None)
        dims = [int(d) for d in shape]
        dt = np.dtype(dtype).name
        spec = dict(init) if init else None
        metas = await broadcast(self.partitions, lambda p: p.create_tensor(name, policy, dims, dt, spec))
        self._metas[name] = metas[0]
        return metas[0]

    async def delete_tensor(self, name: str) -> None:
        self._caches.pop(name, None)
        await broadcast(self.partitions, lambda p: p.delete_tensor(name))
        self._metas.pop(name, None)

    # --- structure ----------------------------------------------------------------------------
    async def sample_neighbors(
        self,
        seeds: Any,
        fanout: int,
        *,
        replace: bool = False,
        seed: int | None = None,
        traffic: Traffic | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample in-edges of global ``seeds``: each owner samples its seeds, all concurrently.

        Returns global ``(src, dst, eids)``, grouped by owning partition in partition order.
        ``traffic`` (optional) counts the requests sent over a socket.
        """
        gids = as_id_array(seeds, "seeds")
        parts = split_by_owner(self.book.owner(gids, "node"), self.num_partitions)
        if traffic is not None:
            self._count_remote(parts, Op.SAMPLE, traffic)
        fan, rep = int(fanout), bool(replace)
        results = await scatter(
            self.partitions, parts, Op.SAMPLE, lambda p, pos: p.sample(take(gids, pos), fan, rep, seed)
        )
        if len(results) == 1:
            return results[0][1]
        if not results:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        src, dst, eids = (np.concatenate([r[1][k] for r in results]) for k in range(3))
        return src, dst, eids

    async def sample_with_features(
        self,
        seeds: Any,
        fanout: int,
        features: Sequence[str],
        *,
        replace: bool = False,
        seed: int | None = None,
        traffic: Traffic | None = None,
    ) -> SampledRows:
        """``sample_neighbors`` whose answers also carry the rows of ``features`` (tensor keys) of
        the sampled nodes each owner holds (its seeds and the sources in its range).

        ``ids`` (sorted) and ``rows[k]`` cover those nodes of every owner together; the rows are
        what ``pull_numpy`` would return (caches are not consulted). When some owners are held in
        this process, they sample first and the sources they sample that a remote owner holds are
        added to that owner's request, so its answer carries their rows too (except rows every
        named tensor's feature cache holds: those are read here by the pull that follows).
        ``traffic`` counts the requests, and the rows and bytes that crossed a socket.
        """
        gids = as_id_array(seeds, "seeds")
        names = list(features)
        metas = [await self.tensor_meta(name) for name in names]
        for meta in metas:
            if meta.policy != "node":
                raise InvalidRequestError(f"sample_with_features: {meta.name!r} is not a node tensor")
        parts = split_by_owner(self.book.owner(gids, "node"), self.num_partitions)
        fan, rep = int(fanout), bool(replace)
        if traffic is not None:
            self._count_remote(parts, Op.SAMPLE, traffic)
        owners = [i for i, pos in enumerate(parts) if pos.size]
        local = [i for i in owners if self.partitions[i].runs_here(Op.SAMPLE)]
        done: dict[int, SampledRows] = {}
        extra: dict[int, np.ndarray] = {}
        results: list[tuple[np.ndarray | None, SampledRows]]
        if local and len(local) < len(owners):
            # sample here first: the sources we sample that a remote owner holds ride in its answer
            for i in local:
                done[i] = await self.partitions[i].sample_with_features(gids[parts[i]], fan, rep, seed, names)
            src_here = np.concatenate([done[i].src for i in local])
            owner_here = self.book.owner(src_here, "node")
            caches = [self._caches.get(name) for name in names]
            for i in owners:
                if i not in done:
                    ids_i = np.unique(src_here[owner_here == i])
                    if ids_i.size and all(c is not None for c in caches):  # cached rows stay here
                        cached = np.ones(ids_i.size, dtype=bool)
                        for c in caches:
                            assert c is not None
                            cached &= c.lookup(ids_i)[0]
                        ids_i = ids_i[~cached]
                    extra[i] = ids_i
            todo = [pos if i not in done else pos[:0] for i, pos in enumerate(parts)]
            answered = await scatter(
                self.partitions,
                todo,
                Op.SAMPLE,
                lambda p, _: p.sample_with_features(
                    gids[parts[p.part_id]], fan, rep, seed, names, extra[p.part_id]
                ),
            )
            remote = [i for i in owners if i not in done]
            for i, (_, r) in zip(remote, answered, strict=True):
                done[i] = r
            results = [(parts[i], done[i]) for i in owners]
        else:
            results = await scatter(
                self.partitions,
                parts,
                Op.SAMPLE,
                lambda p, pos: p.sample_with_features(take(gids, pos), fan, rep, seed, names),
            )
        if traffic is not None:  # results are in partition order
            row_bytes = sum(meta_row_bytes(m) for m in metas)
            for i, (_, r) in zip(owners, results, strict=True):
                if not self.partitions[i].runs_here(Op.SAMPLE):
                    traffic.remote_rows += int(r.ids.size)
                    traffic.remote_bytes += int(r.ids.size) * row_bytes
        if len(results) == 1:
            return results[0][1]
        if not results:
            empty = np.empty(0, np.int64)
            rows = [np.empty((0, *m.row_shape), m.dtype) for m in metas]
            return SampledRows(empty, empty, empty, empty, rows)
        src, dst, eids, ids = (np.concatenate([r[1][k] for r in results]) for k in range(4))
        order = np.argsort(ids, kind="stable")
        rows = [np.concatenate([r[1].rows[k] for r in results])[order] for k in range(len(names))]
        return SampledRows(src, dst, eids, ids[order], rows)

    async def find_edges(self, eids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Global int64 ``(src, dst)`` of global edge IDs, in the caller's order.

        Duplicates are allowed; an ID outside ``[0, num_edges)`` raises ``OutOfRangeError``
        before any request is sent.
        """
        gids = as_id_array(eids, "eids")
        parts = split_by_owner(self.book.owner(gids, "edge"), self.num_partitions)
        results = await scatter(
            self.partitions, parts, Op.FIND_EDGES, lambda p, pos: p.find_edges(take(gids, pos))
        )
        src = gather_rows([(pos, r[0]) for pos, r in results], gids.size, (), np.int64)
        dst = gather_rows([(pos, r[1]) for pos, r in results], gids.size, (), np.int64)
        return src, dst

    # --- sparse optimizers --------------------------------------------------------------------
    async def sparse_update(self, name: str, ids: Any, grads: Any, spec: Mapping[str, Any]) -> None:
        """One sparse optimizer step on rows ``ids`` of float tensor ``name``, run on the owners.

        ``spec`` is ``{"kind": "adagrad", "lr": ..., "eps": ...}`` or ``{"kind": "adam", "lr": ...,
        "betas": [b1, b2], "eps": ...}`` (see ``asyncgraph.kernels.sparse_optim``); ``grads`` has the
        tensor's dtype and shape ``(len(ids), *row_shape)``; duplicate IDs' gradients are summed.
        Each owner reads, updates and writes its rows and their optimizer state under its write
        lock: one round trip per server, and concurrent trainers never lose an update. A
        co-located partition is updated through its server (an attached store cannot create the
        state tensors). Everything is validated before any partition is touched.
        """
        self._caches.pop(name, None)
        opts = validate_spec(spec)
        meta = await self.tensor_meta(name)
        if np.dtype(meta.dtype).kind != "f":
            raise DTypeMismatchError(
                f"sparse_update {name!r}: the tensor is {meta.dtype}; optimizers need a floating-point tensor"
            )
        gids = as_id_array(ids)
        what, row_shape = f"sparse_update {name!r}", meta.row_shape
        _, grad = check_rows(what, gids, grads, dtype=meta.dtype, row_shape=row_shape, values_name="grads")
        parts = split_by_owner(self.book.owner(gids, meta.policy), self.num_partitions)
        await scatter(
            self.partitions,
            parts,
            Op.SPARSE_UPDATE,
            lambda p, pos: p.sparse_update(name, take(gids, pos), take(grad, pos), opts),
        )

    # --- coordination -------------------------------------------------------------------------
    async def barrier(self, name: str = "default", timeout: float = 300.0) -> None:
        """Wait until every client of the job reaches this barrier (held by server 0)."""
        if self.connections:
            args = BarrierArgs(name, float(timeout)).encode()
            await self.connections[0].call(Op.BARRIER, args, timeout + 10.0)

    async def server_stats(self) -> list[dict[str, Any]]:
        return await broadcast(self.connections, lambda c: c.call(Op.STATS, {}, self.call_timeout))

    async def shutdown_servers(self) -> None:
        """Ask every server to stop (after answering)."""
        calls = [c.call(Op.SHUTDOWN, {}, self.call_timeout) for c in self.connections]
        await asyncio.gather(*calls, return_exceptions=True)

    async def close(self) -> None:
        for part in self.partitions:
            part.close()
