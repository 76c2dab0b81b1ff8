"""The async client: one view over all partitions, whether served remotely or held locally.

A call that spans partitions is split by owner through the partition book, sent to every owner
concurrently, and reassembled in the caller's order. A partition whose server runs on this host
is read and written through shared memory (the server hands over its memfds); in standalone mode
every partition is an in-process store and no server exists. Either way the same code runs, so
standalone results equal served results.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncgraph.env import ENV_MALLOC_TUNING
from asyncgraph.errors import (
    AsyncGraphError,
    DTypeMismatchError,
    InvalidRequestError,
    ServerUnavailableError,
    ShapeMismatchError,
    UnknownTensorError,
)
from asyncgraph.kernels.edges import find_edges_partition
from asyncgraph.kernels.partition_sampling import sample_partition
from asyncgraph.kernels.sparse_optim import apply_sparse_update, validate_spec
from asyncgraph.malloc import retain_large_allocations
from asyncgraph.partition.book import RangePartitionBook, as_id_array
from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.storage.store import PartitionStore, TensorMeta

from .connection import Connection

log = logging.getLogger("asyncgraph.client")

DEFAULT_CALL_TIMEOUT = 60.0
# sample_neighbors splits seeds by owner with one scan per partition up to this many partitions.
_SAMPLE_SCAN_MAX_PARTS = 8
_FEW_PARTS = 8  # split_by_owner: up to this many partitions, one pass per partition


@dataclass
class PartitionEndpoint:
    """How this client reaches one partition: a connection, a local store, or both."""

    part_id: int
    conn: Connection | None = None
    store: PartitionStore | None = None
    shm: Mapping[str, Any] | None = None  # {"address", "token"} to fetch tensors created later

    @property
    def is_local(self) -> bool:
        return self.store is not None


def split_by_owner(owner: np.ndarray, num_parts: int) -> list[np.ndarray]:
    """Positions of each partition's IDs, in input order within a partition (vectorised).

    Few partitions (the usual case) take one ``flatnonzero`` pass each, several times faster
    than a stable argsort; many partitions take the argsort.
    """
    if owner.size and int(owner.min()) == int(owner.max()):
        positions = [np.empty(0, dtype=np.int64)] * num_parts
        positions[int(owner[0])] = np.arange(owner.size, dtype=np.int64)
        return positions
    if num_parts <= _FEW_PARTS:
        return [np.flatnonzero(owner == p) for p in range(num_parts)]
    order = np.argsort(owner, kind="stable")
    bounds = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=num_parts), out=bounds[1:])
    return [order[bounds[p] : bounds[p + 1]] for p in range(num_parts)]


def to_numpy(values: Any) -> np.ndarray:
    """numpy view of a torch tensor or array-like (no copy for CPU tensors)."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


class AsyncClient:
    """Typed async access to a partitioned graph's tensors, structure and barriers."""

    def __init__(
        self,
        graph_name: str,
        book: RangePartitionBook,
        endpoints: list[PartitionEndpoint],
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        num_clients: int = 1,
        standalone: bool = False,
    ) -> None:
        self.graph_name = graph_name
        self.book = book
        self.endpoints = endpoints
        self.call_timeout = call_timeout
        self.num_clients = num_clients
        self.is_standalone = standalone
        self._metas: dict[str, TensorMeta] = {}

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
        if not servers:
            raise InvalidRequestError("no servers given")
        wanted: frozenset[int] | None = None
        if local_partitions is not None:
            if isinstance(local_partitions, (str, bytes)) or not all(
                isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in local_partitions
            ):
                raise InvalidRequestError(
                    f"local_partitions must be a sequence of partition IDs, got {local_partitions!r}"
                )
            wanted = frozenset(int(p) for p in local_partitions)
            bad = sorted(p for p in wanted if not 0 <= p < len(servers))
            if bad:
                raise InvalidRequestError(
                    f"local_partitions {bad} out of range [0, {len(servers)}) for {len(servers)} servers"
                )
        conns = await asyncio.gather(
            *(
                Connection.open(
                    host,
                    port,
                    graph_name=graph_name,
                    secret=secret,
                    timeout=connect_timeout,
                    max_frame_size=max_frame_size,
                    max_inflight=max_inflight,
                )
                for host, port in servers
            ),
            return_exceptions=True,
        )
        failures = [c for c in conns if isinstance(c, BaseException)]
        if failures:
            for c in conns:
                if isinstance(c, Connection):
                    c.close()
            raise failures[0]
        opened = [c for c in conns if isinstance(c, Connection)]
        try:
            infos = await asyncio.gather(*(c.call("info", {}, connect_timeout) for c in opened))
            return await cls._from_infos(
                opened, infos, call_timeout, use_shared_memory, connect_timeout, wanted
            )
        except BaseException:
            for c in opened:
                c.close()
            raise

    @classmethod
    async def _from_infos(
        cls,
        conns: list[Connection],
        infos: list[dict[str, Any]],
        call_timeout: float,
        use_shared_memory: bool,
        timeout: float,
        local_partitions: frozenset[int] | None = None,
    ) -> AsyncClient:
        first = infos[0]
        book = RangePartitionBook.from_dict(first["book"])
        if len(conns) != book.num_partitions():
            raise InvalidRequestError(
                f"graph {first['graph_name']!r} has {book.num_partitions()} partitions "
                f"but {len(conns)} servers were given"
            )
        for i, info in enumerate(infos):
            if info["part_id"] != i:
                raise InvalidRequestError(
                    f"server {conns[i].name} serves partition {info['part_id']}, expected {i}: "
                    "list servers in partition order"
                )
            if (
                info["graph_name"] != first["graph_name"]
                or RangePartitionBook.from_dict(info["book"]) != book
            ):
                raise InvalidRequestError(f"server {conns[i].name} serves a different graph or partitioning")
        from asyncgraph.server.handlers import boot_id

        here = boot_id()
        endpoints: list[PartitionEndpoint] = []
        for conn, info in zip(conns, infos, strict=True):
            endpoint = PartitionEndpoint(info["part_id"], conn=conn)
            if (
                use_shared_memory
                and info.get("shm")
                and info.get("boot_id") == here
                and (local_partitions is None or info["part_id"] in local_partitions)
            ):
                endpoint.store, endpoint.shm = await _try_attach(info["shm"], timeout)
            endpoints.append(endpoint)
        client = cls(
            first["graph_name"], book, endpoints, call_timeout=call_timeout, num_clients=first["num_clients"]
        )
        client._remember(first["tensors"])
        return client

    @classmethod
    def standalone(cls, part_config: str | Path) -> AsyncClient:
        """Every partition of ``part_config`` held in this process: no server, same API."""
        from asyncgraph.partition import PartitionConfig, load_partition

        config = PartitionConfig.load(part_config)
        endpoints = [
            PartitionEndpoint(
                p, store=PartitionStore.from_partition(load_partition(part_config, p), shared=False)
            )
            for p in range(config.num_parts)
        ]
        client = cls(config.graph_name, config.book(), endpoints, standalone=True)
        client._remember([m.to_dict() for m in endpoints[0].store.list_tensors()])  # type: ignore[union-attr]
        return client

    # --- metadata ---------------------------------------------------------------------------
    @property
    def num_partitions(self) -> int:
        return self.book.num_partitions()

    def local_partitions(self) -> list[int]:
        return [e.part_id for e in self.endpoints if e.is_local]

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
        endpoint = self.endpoints[0]
        if endpoint.conn is not None:
            self._metas.clear()
            self._remember(await endpoint.conn.call("list_tensors", {}, self.call_timeout))
        else:
            assert endpoint.store is not None
            self._metas.clear()
            self._remember([m.to_dict() for m in endpoint.store.list_tensors()])
        return list(self._metas.values())

    def _remember(self, metas: list[dict[str, Any]]) -> None:
        for data in metas:
            meta = TensorMeta.from_dict(data)
            self._metas[meta.name] = meta

    async def info(self, part_id: int = 0) -> dict[str, Any]:
        endpoint = self.endpoints[part_id]
        if endpoint.conn is None:
            return {
                "graph_name": self.graph_name,
                "part_id": part_id,
                "num_parts": self.num_partitions,
                "num_nodes": self.book.num_nodes,
                "num_edges": self.book.num_edges,
                "book": self.book.to_dict(),
                "tensors": [m.to_dict() for m in self._metas.values()],
                "standalone": True,
            }
        result: dict[str, Any] = await endpoint.conn.call("info", {}, self.call_timeout)
        return result

    # --- tensors ----------------------------------------------------------------------------
    async def pull(self, name: str, ids: Any) -> torch.Tensor:
        """Rows ``ids`` (global, any order, duplicates allowed) of tensor ``name``."""
        return torch.from_numpy(await self.pull_numpy(name, ids))

    async def pull_numpy(self, name: str, ids: Any) -> np.ndarray:
        meta = await self.tensor_meta(name)
        gids = as_id_array(ids)
        owner = self.book.owner(gids, meta.policy)
        row_shape = tuple(meta.shape[1:])
        parts = split_by_owner(owner, self.num_partitions)
        remote: list[tuple[np.ndarray, asyncio.Task[Any]]] = []
        local: list[tuple[np.ndarray, PartitionEndpoint]] = []
        for endpoint, pos in zip(self.endpoints, parts, strict=True):
            if pos.size == 0:
                continue
            if endpoint.store is not None:
                local.append((pos, endpoint))
            else:
                assert endpoint.conn is not None
                call = endpoint.conn.call("pull", {"name": name, "ids": gids[pos]}, self.call_timeout)
                remote.append((pos, asyncio.ensure_future(call)))
        single = len(remote) + len(local) == 1
        out = None if single else np.empty((gids.size, *row_shape), dtype=meta.dtype)
        try:
            if remote and local:
                # Let the request tasks run up to their first real wait, i.e. write their
                # requests, so the servers gather while we gather locally.
                await asyncio.sleep(0)
            for pos, endpoint in local:  # the local gather overlaps the remote round trips
                rows = await self._local_pull(endpoint, name, gids if single else gids[pos])
                if out is None:
                    return rows
                out[pos] = rows
            for pos, task in remote:
                rows = await task
                if out is None:
                    return np.asarray(rows)
                out[pos] = rows
        finally:
            for _, task in remote:
                if not task.done():
                    task.cancel()
        if out is None:  # no IDs at all
            return np.empty((0, *row_shape), dtype=meta.dtype)
        return out

    async def push(self, name: str, ids: Any, values: Any, op: str = "assign") -> None:
        """Write rows: ``op="assign"`` replaces, ``"add"`` accumulates (duplicates add up).

        Everything is validated before any partition is written, so a bad push changes nothing.
        """
        if op not in ("assign", "add"):
            raise InvalidRequestError(f"push: op must be 'assign' or 'add', got {op!r}")
        meta = await self.tensor_meta(name)
        gids = as_id_array(ids)
        vals = to_numpy(values)
        if vals.dtype != np.dtype(meta.dtype):
            raise DTypeMismatchError(
                f"push to {name!r}: values have dtype {vals.dtype}, tensor has {meta.dtype}"
            )
        expected = (gids.size, *meta.shape[1:])
        if tuple(vals.shape) != expected:
            raise ShapeMismatchError(
                f"push to {name!r}: values have shape {tuple(vals.shape)}, expected {expected}"
            )
        owner = self.book.owner(gids, meta.policy)
        parts = split_by_owner(owner, self.num_partitions)
        whole = sum(1 for pos in parts if pos.size) == 1
        remote: list[asyncio.Task[Any]] = []
        local: list[tuple[PartitionEndpoint, np.ndarray, np.ndarray]] = []
        try:
            for endpoint, pos in zip(self.endpoints, parts, strict=True):
                if pos.size == 0:
                    continue
                part_ids = gids if whole else gids[pos]
                part_vals = vals if whole else vals[pos]
                if endpoint.store is not None:
                    local.append((endpoint, part_ids, part_vals))
                else:
                    assert endpoint.conn is not None
                    args = {"name": name, "ids": part_ids, "values": part_vals, "op": op}
                    remote.append(asyncio.ensure_future(endpoint.conn.call("push", args, self.call_timeout)))
            if remote and local:
                await asyncio.sleep(0)  # requests written first: servers apply while we do
            for endpoint, part_ids, part_vals in local:
                await self._local_push(endpoint, name, part_ids, part_vals, op)
        except BaseException:
            for task in remote:
                task.cancel()
            raise
        if remote:
            await _gather_all(remote)

    async def create_tensor(
        self,
        name: str,
        policy: str,
        shape: Sequence[int],
        dtype: str,
        init: Mapping[str, Any] | None = None,
    ) -> TensorMeta:
        """Create (or get, if identical) a tensor sharded by node or edge ranges on every partition."""
        shape = [int(d) for d in shape]
        dtype = np.dtype(dtype).name
        if self.is_standalone:
            metas = [
                e.store.create_tensor(name, policy, shape, dtype, dict(init) if init else None)  # type: ignore[arg-type,union-attr]
                for e in self.endpoints
            ]
            meta = metas[0]
        else:
            args = {
                "name": name,
                "policy": policy,
                "shape": shape,
                "dtype": dtype,
                "init": dict(init) if init else None,
            }
            results = await _gather_all(
                [e.conn.call("create_tensor", args, self.call_timeout) for e in self.endpoints if e.conn]
            )
            meta = TensorMeta.from_dict(results[0])
        self._metas[name] = meta
        return meta

    async def delete_tensor(self, name: str) -> None:
        if self.is_standalone:
            for e in self.endpoints:
                assert e.store is not None
                e.store.delete_tensor(name)
        else:
            await _gather_all(
                [
                    e.conn.call("delete_tensor", {"name": name}, self.call_timeout)
                    for e in self.endpoints
                    if e.conn
                ]
            )
            for e in self.endpoints:
                if e.store is not None:
                    e.store.forget_tensor(name)
        self._metas.pop(name, None)

    # --- structure ----------------------------------------------------------------------------
    async def sample_neighbors(
        self, seeds: Any, fanout: int, *, replace: bool = False, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample in-edges of global ``seeds``: each owner samples its seeds, all concurrently.

        Returns global ``(src, dst, eids)``, grouped by owning partition.
        """
        gids = as_id_array(seeds, "seeds")
        owner = self.book.owner(gids, "node")
        if self.num_partitions <= _SAMPLE_SCAN_MAX_PARTS:  # a few linear scans beat a sort
            parts = [np.flatnonzero(owner == p) for p in range(self.num_partitions)]
        else:
            parts = split_by_owner(owner, self.num_partitions)
        pending: list[Any] = []
        local_results: list[dict[str, np.ndarray]] = []
        for endpoint, pos in zip(self.endpoints, parts, strict=True):
            if pos.size == 0 or endpoint.store is not None:
                continue
            assert endpoint.conn is not None
            args = {"seeds": gids[pos], "fanout": int(fanout), "replace": bool(replace), "seed": seed}
            pending.append(asyncio.ensure_future(endpoint.conn.call("sample", args, self.call_timeout)))
        try:
            for endpoint, pos in zip(self.endpoints, parts, strict=True):
                if pos.size and endpoint.store is not None:
                    _check_alive(endpoint)
                    local_results.append(
                        sample_partition(endpoint.store, gids[pos], int(fanout), replace, seed)
                    )
            remote_results = await _gather_all(pending) if pending else []
        finally:
            for task in pending:
                if not task.done():
                    task.cancel()
        results = local_results + list(remote_results)
        if not results:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty.copy(), empty.copy()
        if len(results) == 1 and local_results:  # fresh arrays already: no copy needed
            only = local_results[0]
            return only["src"], only["dst"], only["eids"]
        src = np.concatenate([np.asarray(r["src"]) for r in results])
        dst = np.concatenate([np.asarray(r["dst"]) for r in results])
        eids = np.concatenate([np.asarray(r["eids"]) for r in results])
        return src, dst, eids

    # --- coordination -------------------------------------------------------------------------
    async def barrier(self, name: str = "default", timeout: float = 300.0) -> None:
        """Wait until every client of the job reaches this barrier (held by server 0)."""
        conn = self.endpoints[0].conn
        if conn is None:
            return
        await conn.call("barrier", {"name": name, "timeout": float(timeout)}, timeout + 10.0)

    async def server_stats(self) -> list[dict[str, Any]]:
        return list(
            await _gather_all([e.conn.call("stats", {}, self.call_timeout) for e in self.endpoints if e.conn])
        )

    async def shutdown_servers(self) -> None:
        """Ask every server to stop (after answering)."""
        calls = [e.conn.call("shutdown", {}, self.call_timeout) for e in self.endpoints if e.conn]
        await asyncio.gather(*calls, return_exceptions=True)

    async def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint.conn is not None:
                endpoint.conn.close()
            if endpoint.store is not None and not self.is_standalone:
                endpoint.store.close()
            endpoint.store = None if not self.is_standalone else endpoint.store

    # --- local partitions -------------------------------------------------------------------
    async def _local_store_with(self, endpoint: PartitionEndpoint, name: str) -> PartitionStore:
        store = endpoint.store
        assert store is not None
        _check_alive(endpoint)
        if endpoint.shm is not None and not store.has_tensor(name):
            from asyncgraph.storage.fdpass import fetch_tensors

            descriptor, fds = await asyncio.to_thread(
                fetch_tensors, endpoint.shm["address"], endpoint.shm["token"], [name], 10.0
            )
            store.add_attached(descriptor, fds)
        return store

    async def _local_pull(self, endpoint: PartitionEndpoint, name: str, ids: np.ndarray) -> np.ndarray:
        store = await self._local_store_with(endpoint, name)
        return store.pull(name, ids)

    async def _local_push(
        self, endpoint: PartitionEndpoint, name: str, ids: np.ndarray, values: np.ndarray, op: str
    ) -> None:
        store = await self._local_store_with(endpoint, name)
        store.push(name, ids, values, op)


    # --- sparse optimizers --------------------------------------------------------------------
    async def sparse_update(self, name: str, ids: Any, grads: Any, spec: Mapping[str, Any]) -> None:
        """One sparse optimizer step on rows ``ids`` of float tensor ``name``, run on the owners.

        ``spec`` is ``{"kind": "adagrad", "lr": ..., "eps": ...}`` or ``{"kind": "adam", "lr": ...,
        "betas": [b1, b2], "eps": ...}`` (see ``asyncgraph.kernels.sparse_optim``); ``grads`` has the
        tensor's dtype and shape ``(len(ids), *row_shape)``; duplicate IDs' gradients are summed.
        Each owner reads, updates and writes its rows and their optimizer state under its write
        lock: one round trip per server, and concurrent trainers never lose an update. A
        co-located partition is updated through its server (an attached store cannot create the
        state tensors); a standalone partition in-process. Everything is validated before any
        partition is touched, so a bad call changes nothing.
        """
        opts = validate_spec(spec)
        meta = await self.tensor_meta(name)
        if np.dtype(meta.dtype).kind != "f":
            raise DTypeMismatchError(
                f"sparse_update {name!r}: the tensor is {meta.dtype}; optimizers need a floating-point tensor"
            )
        gids = as_id_array(ids)
        grad = to_numpy(grads)
        if grad.dtype != np.dtype(meta.dtype):
            raise DTypeMismatchError(
                f"sparse_update {name!r}: grads have dtype {grad.dtype}, tensor has {meta.dtype}"
            )
        expected = (gids.size, *meta.shape[1:])
        if tuple(grad.shape) != expected:
            raise ShapeMismatchError(
                f"sparse_update {name!r}: grads have shape {tuple(grad.shape)}, expected {expected}"
            )
        owner = self.book.owner(gids, meta.policy)
        if gids.size == 0:
            return
        parts = split_by_owner(owner, self.num_partitions)
        whole = sum(1 for pos in parts if pos.size) == 1
        calls = []
        local: list[tuple[PartitionStore, np.ndarray, np.ndarray]] = []
        for endpoint, pos in zip(self.endpoints, parts, strict=True):
            if pos.size == 0:
                continue
            part_ids = gids if whole else gids[pos]
            part_grads = grad if whole else grad[pos]
            if endpoint.conn is not None:
                args = {"name": name, "ids": part_ids, "grads": part_grads, "spec": opts}
                calls.append(endpoint.conn.call("sparse_update", args, self.call_timeout))
            else:
                assert endpoint.store is not None
                local.append((endpoint.store, part_ids, part_grads))
        for store, part_ids, part_grads in local:
            apply_sparse_update(store, name, part_ids, part_grads, opts)
        if calls:
            await _gather_all(calls)

    # --- edges --------------------------------------------------------------------------------
    async def find_edges(self, eids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Global int64 ``(src, dst)`` of global edge IDs, in the caller's order.

        IDs are split by owning partition; remote owners answer concurrently while local ones
        are read in-process. Duplicates are allowed; an ID outside ``[0, num_edges)`` raises
        ``OutOfRangeError`` before any request is sent.
        """
        gids = as_id_array(eids, "eids")
        owner = self.book.owner(gids, "edge")
        src = np.empty(gids.size, dtype=np.int64)
        dst = np.empty(gids.size, dtype=np.int64)
        if gids.size == 0:
            return src, dst
        parts = split_by_owner(owner, self.num_partitions)
        remote: list[tuple[np.ndarray, asyncio.Future[Any]]] = []
        try:
            for endpoint, pos in zip(self.endpoints, parts, strict=True):
                if pos.size and endpoint.store is None:
                    assert endpoint.conn is not None
                    call = endpoint.conn.call("find_edges", {"eids": gids[pos]}, self.call_timeout)
                    remote.append((pos, asyncio.ensure_future(call)))
            for endpoint, pos in zip(self.endpoints, parts, strict=True):
                if pos.size and endpoint.store is not None:
                    _check_alive(endpoint)
                    src[pos], dst[pos] = find_edges_partition(endpoint.store, gids[pos])
            results = await _gather_all([task for _, task in remote]) if remote else []
        finally:
            for _, task in remote:
                if not task.done():
                    task.cancel()
        for (pos, _), result in zip(remote, results, strict=True):
            src[pos] = result["src"]
            dst[pos] = result["dst"]
        return src, dst


def _check_alive(endpoint: PartitionEndpoint) -> None:
    """A co-located partition whose server died is not served any more, even from shared memory."""
    conn = endpoint.conn
    if conn is not None and conn.closed:
        raise ServerUnavailableError(f"server {conn.name} of partition {endpoint.part_id} is gone")


async def _gather_all(calls: Sequence[Any]) -> list[Any]:
    """Await all calls; if any fails, raise the first error after every call has finished."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)


async def _try_attach(
    shm: Mapping[str, Any], timeout: float
) -> tuple[PartitionStore | None, Mapping[str, Any] | None]:
    from asyncgraph.storage.fdpass import attach_store

    try:
        store = await asyncio.to_thread(attach_store, shm["address"], shm["token"], timeout=timeout)
    except (AsyncGraphError, OSError) as exc:
        log.info("shared memory unavailable (%s); using the socket", exc)
        return None, None
    return store, shm
