"""A partition held in this process: the server's request handlers and the client's local
partitions run the same code, so standalone and served results are equal by construction."""

from __future__ import annotations

import asyncio
import operator
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from asyncgraph.errors import InvalidRequestError, ServerUnavailableError
from asyncgraph.kernels.edge_queries import OutIndex, degrees, sample_edges
from asyncgraph.kernels.edges import find_edges_partition
from asyncgraph.kernels.partition_sampling import sample_partition
from asyncgraph.kernels.sparse_optim import apply_sparse_update
from asyncgraph.names import ETYPE, TYPE_EID, edge_key, tensor_key
from asyncgraph.protocol.info import ServerInfo, SharedMemoryInfo
from asyncgraph.protocol.ops import ATTACHED_OPS, Op, SampleEdgesArgs
from asyncgraph.service.base import Partition, SampledRows
from asyncgraph.service.limits import WorkLimits, sample_bound
from asyncgraph.storage.attached import AttachedStore
from asyncgraph.storage.store import PartitionStore, PendingTensor, Policy, TensorMeta

__all__ = ["LocalPartition", "PartitionService", "boot_id"]

# What an attached (co-located) partition does through shared memory; the rest goes to its server.


def boot_id() -> str:
    """An identifier of this host's running kernel: equal boot IDs mean 'same machine'."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return socket.gethostname()


class PartitionService:
    """The ops of one partition over its store, synchronous: a server runs each request with it.

    ``limits`` (a server's) bounds what one request may ask for, checked before anything is
    allocated; ``None`` (in-process callers, who own the memory they ask for) checks nothing.
    """

    def __init__(
        self,
        store: PartitionStore,
        *,
        num_clients: int = 1,
        shm: SharedMemoryInfo | None = None,
        limits: WorkLimits | None = None,
    ) -> None:
        self.store = store
        self.num_clients = num_clients
        self.shm = shm
        self.limits = limits
        self._out_index: OutIndex | None = None
        self._refs: dict[str, dict[str, int]] = {}  # non-persistent tensor -> holder -> references

    @property
    def out_index(self) -> OutIndex:
        """This partition's edges grouped by source (built on first use)."""
        if self._out_index is None:
            self._out_index = OutIndex.build(self.store)
        return self._out_index

    def info(self) -> ServerInfo:
        """The partition's identity, book and tensors, and how to reach its memory (a server
        completes the record with what belongs to its start: instance, epoch, role, ...)."""
        store = self.store
        return ServerInfo(
            graph_name=store.graph_name,
            part_id=store.part_id,
            num_parts=store.book.num_partitions(),
            num_nodes=store.book.num_nodes,
            num_edges=store.book.num_edges,
            book=store.book.to_dict(),
            tensors=[meta.to_dict() for meta in store.list_tensors()],
            num_clients=self.num_clients,
            pid=os.getpid(),
            boot_id=boot_id(),
            shm=self.shm,
        )

    def list_tensors(self) -> list[TensorMeta]:
        return self.store.list_tensors()

    def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        limits = self.limits
        if limits is not None:
            row_bytes = self.store.row_bytes(name)  # cached per tensor; UnknownTensorError first
            num_rows = ids.size if type(ids) is np.ndarray else int(np.size(ids))
            if num_rows * row_bytes > limits.max_reply_bytes:
                limits.check_rows(f"pull from {name!r}", num_rows, row_bytes)  # raises, naming the limit
        return self.store.pull(name, ids)

    def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str = "assign") -> None:
        self.store.push(name, ids, values, op)

    def create_tensor(
        self,
        name: str,
        policy: str,
        shape: list[int],
        dtype: str,
        init: dict[str, Any] | None = None,
        holder: str | None = None,
    ) -> tuple[TensorMeta, bool]:
        """The tensor's meta, and whether this call created it (False: it existed already).

        With a ``holder`` the tensor is non-persistent: a tensor created that way is reference
        counted (one reference per call, by holder) and deleted when ``release_tensors`` drops
        the last one; getting an existing non-persistent tensor adds a reference, getting a
        persistent one adds none.
        """
        if self.limits is not None:
            self._check_tensor_size(name, policy, shape, dtype)
        existed = self.store.has_tensor(name)
        meta = self.store.create_tensor(name, cast(Policy, policy), shape, dtype, init)
        self._hold(name, holder, existed)
        return meta, not existed

    def finish_create(self, pending: PendingTensor, holder: str | None = None) -> tuple[TensorMeta, bool]:
        """Publish a filled ``begin_create`` tensor: its meta and whether this call created it."""
        name = pending.tensor.meta.name
        existed = self.store.has_tensor(name)
        meta = self.store.finish_create(pending)
        self._hold(name, holder, existed)
        return meta, not existed

    def _hold(self, name: str, holder: str | None, existed: bool) -> None:
        if holder is not None and (not existed or name in self._refs):
            held = self._refs.setdefault(name, {})
            held[holder] = held.get(holder, 0) + 1

    def begin_create(
        self, name: str, policy: str, shape: list[int], dtype: str, init: dict[str, Any] | None = None
    ) -> TensorMeta | PendingTensor:
        """``create_tensor`` in steps (``PartitionStore.begin_create``), so a server can fill off-loop."""
        if self.limits is not None:
            self._check_tensor_size(name, policy, shape, dtype)
        return self.store.begin_create(name, cast(Policy, policy), shape, dtype, init)

    def _check_tensor_size(self, name: str, policy: str, shape: list[int], dtype: str) -> None:
        """Refuse a tensor over the limits before the store allocates it (bad shapes: the store says)."""
        assert self.limits is not None
        try:
            dims = tuple(operator.index(d) for d in shape)
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            return
        if not dims or any(d < 0 for d in dims) or policy not in ("node", "edge"):
            return
        book, part = self.store.book, self.store.part_id
        lo, hi = book.node_range(part) if policy == "node" else book.edge_range(part)
        self.limits.check_tensor(name, (hi - lo, *dims[1:]), dt)

    def delete_tensor(self, name: str) -> None:
        self.store.delete_tensor(name)
        self._refs.pop(name, None)

    def references(self) -> dict[str, dict[str, int]]:
        """A copy of the reference counts of non-persistent tensors: tensor -> holder -> count
        (what a snapshot keeps, so that restored tensors are still freed by their holders)."""
        return {name: dict(held) for name, held in self._refs.items()}

    def load_references(self, refs: Mapping[str, Mapping[str, int]]) -> None:
        """Replace the reference counts with ``refs`` (from a snapshot), for tensors that exist."""
        self._refs = {
            str(name): {str(h): int(c) for h, c in held.items() if int(c) > 0}
            for name, held in refs.items()
            if self.store.has_tensor(str(name))
        }
        self._refs = {name: held for name, held in self._refs.items() if held}

    def release_tensors(self, holder: str, names: list[str], every: bool = False) -> list[str]:
        """Drop ``holder``'s references (one per name, or all); returns the tensors deleted."""
        drops: dict[str, int] = {}
        if every:
            drops = {n: held[holder] for n, held in self._refs.items() if holder in held}
        for n in names:
            drops[n] = drops.get(n, 0) + 1
        deleted: list[str] = []
        for name, count in drops.items():
            held = self._refs.get(name)
            if held is None or holder not in held:
                continue  # not a reference this holder has (already released, or persistent)
            held[holder] -= count
            if held[holder] <= 0:
                del held[holder]
            if not held:
                del self._refs[name]
                state = [m.name for m in self.store.list_tensors() if m.name.startswith(name + "#")]
                for key in [name, *state]:
                    if self.store.has_tensor(key):
                        self.store.delete_tensor(key)
                        deleted.append(key)
        return deleted

    def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        limits = self.limits
        if (
            limits is not None
            and isinstance(fanout, int)
            and (fanout == -1 or seeds.size * fanout > limits.max_sampled_edges)
        ):
            # over the cheap bound: count what the seeds' degrees allow (invalid seeds raise here)
            local = self.store.book.nid2localnid(seeds, self.store.part_id)
            limits.check_sample(local.size, fanout, sample_bound(self.store.indptr, local, fanout, replace))
        out = sample_partition(self.store, seeds, fanout, replace, seed)
        return out["src"], out["dst"], out["eids"]

    def sample_with_features(
        self,
        seeds: np.ndarray,
        fanout: int,
        replace: bool,
        seed: int | None,
        features: Sequence[str],
        extra: np.ndarray | None = None,
    ) -> SampledRows:
        """``sample`` plus the rows of ``features`` of the sampled nodes this partition owns
        (its seeds and the sources in its range) and of ``extra`` owned IDs, so they need no
        pull of their own (see ``carried_rows``)."""
        src, dst, eids = self.sample(seeds, fanout, replace, seed)
        ids, rows = self.carried_rows(seeds, src, features, extra)
        return SampledRows(src, dst, eids, ids, rows)

    def carried_rows(
        self, seeds: np.ndarray, src: np.ndarray, features: Sequence[str], extra: np.ndarray | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The owned IDs among ``seeds``, sampled sources ``src`` and ``extra`` (sorted, unique)
        and their rows of each node tensor in ``features``: what a sample answer carries.

        An ``extra`` ID this partition does not own, or a feature that is not a node tensor, is
        rejected. With ``limits``, an answer whose rows would not fit one reply carries no rows
        (empty IDs): the client then pulls them, split to fit, like any rows not carried.
        """
        metas = [self.store.tensor_meta(name) for name in features]
        for meta in metas:
            if meta.policy != "node":
                raise InvalidRequestError(f"sample: feature {meta.name!r} is not a node tensor")
        lo, hi = self.store.node_range
        owned_src = src[(src >= lo) & (src < hi)]
        parts = [np.asarray(seeds, dtype=np.int64), owned_src]
        if extra is not None:
            parts.append(np.asarray(extra, dtype=np.int64))
        ids = np.unique(np.concatenate(parts))
        limits = self.limits
        if limits is not None:
            row_bytes = sum(self.store.row_bytes(m.name) for m in metas)
            if 3 * 8 * src.size + ids.size * (8 + row_bytes) > limits.max_reply_bytes:
                if extra is not None:
                    self.store.book.nid2localnid(np.asarray(extra, dtype=np.int64), self.store.part_id)
                return ids[:0], [np.empty((0, *m.row_shape), dtype=m.dtype) for m in metas]
        return ids, [self.store.pull(name, ids) for name in features]

    def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return find_edges_partition(self.store, eids)

    def sparse_update(self, name: str, ids: np.ndarray, grads: np.ndarray, spec: Mapping[str, Any]) -> None:
        apply_sparse_update(self.store, name, ids, grads, spec)

    def degrees(self, ids: np.ndarray | None, edge_dir: str) -> np.ndarray:
        return degrees(self.store, self.out_index if edge_dir == "out" else None, ids, edge_dir)

    def sample_edges(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        out_index = self.out_index if args.edge_dir == "out" else None
        return sample_edges(
            self.store,
            out_index,
            args.seeds,
            args.fanout,
            edge_dir=args.edge_dir,
            replace=args.replace,
            seed=args.seed,
            prob=args.prob,
            exclude=args.exclude,
            etype_fanouts=args.etype_fanouts,
        )


class LocalPartition:
    """``Partition`` over a ``PartitionService`` in this process.

    Standalone, it does everything here. Attached to a co-located server's memory (``server``
    given), it reads and writes rows, samples and finds edges here, maps tensors created later
    on first use, sends everything else to ``server``, and refuses service once that server's
    connection is closed.
    """

    def __init__(
        self,
        service: PartitionService,
        *,
        server: Partition | None = None,
        shm: Mapping[str, Any] | None = None,
        instance: str | None = None,
    ) -> None:
        self.service = service
        self.part_id = service.store.part_id
        self.server = server
        self.shm = shm
        self._instance: Any = instance
        conn = getattr(server, "conn", None)
        self._generation = conn.generation if conn is not None else 0

    @property
    def name(self) -> str:
        return f"local partition {self.part_id}" if self.server is None else self.server.name

    @property
    def store(self) -> PartitionStore:
        return self.service.store

    @property
    def closed(self) -> bool:
        return self.service.store.closed

    def runs_here(self, op: Op) -> bool:
        if op == Op.PUSH and self.writes_via_server:
            return False
        return self.server is None or op in ATTACHED_OPS

    def _check_alive(self) -> None:
        server = self.server
        if server is not None and server.closed:
            raise ServerUnavailableError(f"server {server.name} of partition {self.part_id} is gone")

    async def _current(self) -> None:
        """Make sure the mapped memory is the live server's.

        A server that restarted (its connection reconnected) holds new memory: the old mapping
        belongs to a dead process, so it is dropped and the new server's store attached.
        """
        server = self.server
        conn = getattr(server, "conn", None)
        if server is None or conn is None:
            return
        if self.attached_store.catalog_stale and self.shm is not None and not conn.closed:
            await self._refresh_catalog(self.shm)
        if conn.closed:
            if conn.reconnect_window <= 0:
                self._check_alive()
            await conn.reconnect()
        if conn.generation == self._generation:
            return
        info = await server.info()
        if info.get("instance") != self._instance:
            await self._reattach(info)
        self._generation = conn.generation

    async def _reattach(self, info: Mapping[str, Any]) -> None:
        from asyncgraph.storage.fdpass import attach_store

        shm = info.get("shm")
        if not shm:
            raise ServerUnavailableError(
                f"server {self.name} of partition {self.part_id} restarted without shared memory"
            )
        store = await asyncio.to_thread(attach_store, shm["address"], shm["token"], timeout=10.0)
        old = self.service.store
        self.service = PartitionService(store)
        self.shm = shm
        self._instance = info.get("instance")
        old.close()

    @property
    def attached_store(self) -> AttachedStore:
        """The store mapped from the co-located server's memory (only when ``server`` is given)."""
        store = self.service.store
        assert isinstance(store, AttachedStore), "a standalone partition has no attached store"
        return store

    @property
    def writes_via_server(self) -> bool:
        """True when the server logs writes (WAL): pushes must go through it, not shared memory."""
        return self.server is not None and bool(self.shm and self.shm.get("writes_via_server"))

    async def _refresh_catalog(self, shm: Mapping[str, Any]) -> None:
        """Another process created or deleted tensors: map the new ones, unmap the deleted."""
        from asyncgraph.storage.fdpass import fetch_catalog

        # fds fetched off the loop; the store changed on it, as a replica server does
        descriptor, fds = await asyncio.to_thread(fetch_catalog, shm["address"], shm["token"], 10.0)
        self.attached_store.sync_catalog(descriptor, fds)

    async def _map(self, shm: Mapping[str, Any], name: str) -> None:
        """Map tensor ``name``, created on the server after this store was attached."""
        from asyncgraph.storage.fdpass import fetch_tensors

        descriptor, fds = await asyncio.to_thread(fetch_tensors, shm["address"], shm["token"], [name], 10.0)
        self.attached_store.add_attached(descriptor, fds)

    async def pull(self, name: str, ids: np.ndarray, row_bytes: int = 0) -> np.ndarray:
        await self._current()
        if self.shm is not None and not self.service.store.has_tensor(name):
            await self._map(self.shm, name)
        return self.service.pull(name, ids)

    async def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str) -> None:
        if self.server is not None and self.writes_via_server:
            return await self.server.push(name, ids, values, op)
        await self._current()
        if self.shm is not None and not self.service.store.has_tensor(name):
            await self._map(self.shm, name)
        self.service.push(name, ids, values, op)
        return None

    async def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        await self._current()
        return self.service.sample(seeds, fanout, replace, seed)

    async def sample_with_features(
        self,
        seeds: np.ndarray,
        fanout: int,
        replace: bool,
        seed: int | None,
        features: Sequence[str],
        extra: np.ndarray | None = None,
    ) -> SampledRows:
        await self._current()
        if self.shm is not None:
            for name in features:
                if not self.service.store.has_tensor(name):
                    await self._map(self.shm, name)
        return self.service.sample_with_features(seeds, fanout, replace, seed, features, extra)

    async def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        await self._current()
        return self.service.find_edges(eids)

    async def degrees(self, ids: np.ndarray | None, edge_dir: str) -> np.ndarray:
        self._check_alive()
        return self.service.degrees(ids, edge_dir)

    async def sample_edges(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        self._check_alive()
        if args.prob is not None and self.shm is not None:
            key = edge_key(args.prob)
            if not self.service.store.has_tensor(key):
                await self._map(self.shm, key)
        if args.etype_fanouts is not None and self.shm is not None:
            for key in (tensor_key("edge", ETYPE), tensor_key("edge", TYPE_EID)):
                if not self.service.store.has_tensor(key):
                    await self._map(self.shm, key)
        return self.service.sample_edges(args)

    async def sparse_update(
        self, name: str, ids: np.ndarray, grads: np.ndarray, spec: Mapping[str, Any]
    ) -> None:
        if self.server is not None:  # an attached store cannot create the optimizer state
            return await self.server.sparse_update(name, ids, grads, spec)
        self.service.sparse_update(name, ids, grads, spec)
        return None

    async def create_tensor(
        self,
        name: str,
        policy: str,
        shape: list[int],
        dtype: str,
        init: dict[str, Any] | None,
        holder: str | None = None,
    ) -> tuple[TensorMeta, bool]:
        if self.server is not None:
            return await self.server.create_tensor(name, policy, shape, dtype, init, holder)
        return self.service.create_tensor(name, policy, shape, dtype, init, holder)

    async def release_tensors(self, holder: str, names: list[str], every: bool = False) -> list[str]:
        if self.server is None:
            return self.service.release_tensors(holder, names, every)
        deleted = await self.server.release_tensors(holder, names, every)
        for name in deleted:
            self.attached_store.forget_tensor(name)
        return deleted

    async def delete_tensor(self, name: str) -> None:
        if self.server is None:
            self.service.delete_tensor(name)
            return
        await self.server.delete_tensor(name)
        self.attached_store.forget_tensor(name)

    async def list_tensors(self) -> list[TensorMeta]:
        if self.server is not None:
            return await self.server.list_tensors()
        return self.service.list_tensors()

    async def info(self) -> dict[str, Any]:
        if self.server is not None:
            return await self.server.info()
        return self.service.info().to_wire()

    def close(self) -> None:
        """Unmap an attached store and close its server's connection (a standalone store stays)."""
        if self.server is not None:
            self.server.close()
            self.service.store.close()
