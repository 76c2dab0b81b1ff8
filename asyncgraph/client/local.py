"""A partition held in this process, offered to the client: standalone, or attached to a
co-located server's shared memory (rows, samples and edges read here, the rest sent to the
server). It sits beside ``RemotePartition``: both are the client's view of one partition, and
it drives the server's connection (reconnect, generation) the way a remote partition does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from asyncgraph.errors import ServerUnavailableError
from asyncgraph.names import ETYPE, TYPE_EID, edge_key, tensor_key
from asyncgraph.protocol.info import ServerInfo, SharedMemoryInfo
from asyncgraph.protocol.ops import ATTACHED_OPS, Op, SampleEdgesArgs
from asyncgraph.service.base import Partition, SampledRows
from asyncgraph.service.local import PartitionService
from asyncgraph.storage.attached import AttachedStore
from asyncgraph.storage.overlay_data import AskOwnerError, OverlayMovedError
from asyncgraph.storage.store import PartitionStore, TensorMeta

__all__ = ["LocalPartition"]

T = TypeVar("T")


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
        shm: SharedMemoryInfo | None = None,
        instance: str | None = None,
    ) -> None:
        self.service = service
        self.part_id = service.store.part_id
        self.server = server
        self.shm = shm
        self._instance = instance
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
        if info.instance != self._instance:
            await self._reattach(info)
        self._generation = conn.generation

    async def _reattach(self, info: ServerInfo) -> None:
        from asyncgraph.storage.fdpass import attach_store

        shm = info.shm
        if shm is None:
            raise ServerUnavailableError(
                f"server {self.name} of partition {self.part_id} restarted without shared memory"
            )
        store = await asyncio.to_thread(attach_store, shm.address, shm.token, timeout=10.0)
        old = self.service.store
        self.service = PartitionService(store)
        self.shm = shm
        self._instance = info.instance
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
        return self.server is not None and self.shm is not None and self.shm.writes_via_server

    async def _refresh_catalog(self, shm: SharedMemoryInfo) -> None:
        """Another process created or deleted tensors: map the new ones, unmap the deleted."""
        from asyncgraph.storage.fdpass import fetch_catalog

        # fds fetched off the loop; the store changed on it, as a replica server does
        descriptor, fds = await asyncio.to_thread(fetch_catalog, shm.address, shm.token, 10.0)
        self.attached_store.sync_catalog(descriptor, fds)

    async def _map(self, shm: SharedMemoryInfo, name: str) -> None:
        """Map tensor ``name``, created on the server after this store was attached."""
        from asyncgraph.storage.fdpass import fetch_tensors

        descriptor, fds = await asyncio.to_thread(fetch_tensors, shm.address, shm.token, [name], 10.0)
        self.attached_store.add_attached(descriptor, fds)

    async def pull(
        self,
        name: str,
        ids: np.ndarray,
        row_bytes: int = 0,
        *,
        out: np.ndarray | None = None,
        where: np.ndarray | None = None,
    ) -> np.ndarray:
        await self._current()
        if self.shm is not None and not self.service.store.has_tensor(name):
            await self._map(self.shm, name)
        try:
            if out is None:
                return self.service.pull(name, ids)
            self.service.pull_into(name, ids, out, where)  # each row copied once, to its place
        except AskOwnerError as exc:  # rows of new IDs not mapped here (issue 35): the server's
            server = await self._ask_owner(exc)
            return await server.pull(name, ids, row_bytes, out=out, where=where)
        return out

    async def _ask_owner(self, exc: AskOwnerError) -> Partition:
        """The server, to answer what this process's mapping of its live structure cannot (a
        stale view is mapped again for the next call); re-raises ``exc`` when standalone."""
        if self.server is None or self.shm is None:
            raise exc
        if isinstance(exc, OverlayMovedError):
            await self._refresh_catalog(self.shm)
        return self.server

    async def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str) -> None:
        if self.server is not None and self.writes_via_server:
            return await self.server.push(name, ids, values, op)
        await self._current()
        if self.shm is not None and not self.service.store.has_tensor(name):
            await self._map(self.shm, name)
        try:
            self.service.push(name, ids, values, op)
        except AskOwnerError as exc:  # rows of new IDs: the owner writes them (issue 35)
            server = await self._ask_owner(exc)
            await server.push(name, ids, values, op)
        return None

    def _live_elsewhere(self) -> Partition | None:
        """The server, when its structure has an overlay this process does not map (issue 35):
        structure reads are then its to answer."""
        store = self.service.store
        unmapped = isinstance(store, AttachedStore) and store.live_elsewhere and store.overlay is None
        return self.server if unmapped else None

    async def _structure(self, here: Callable[[], T], there: Callable[[Partition], Awaitable[T]]) -> T:
        """A structure read: here, over the (mapped) base and overlay; by the server when this
        process does not map its overlay, or when the server grew it since it was mapped (it is
        mapped again for the next read)."""
        if (server := self._live_elsewhere()) is not None:
            return await there(server)
        try:
            return here()
        except OverlayMovedError:
            if self.server is None or self.shm is None:
                raise
            await self._refresh_catalog(self.shm)
            return await there(self.server)

    async def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        await self._current()
        return await self._structure(
            lambda: self.service.sample(seeds, fanout, replace, seed),
            lambda server: server.sample(seeds, fanout, replace, seed),
        )

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
        return await self._structure(
            lambda: self.service.sample_with_features(seeds, fanout, replace, seed, features, extra),
            lambda server: server.sample_with_features(seeds, fanout, replace, seed, features, extra),
        )

    async def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        await self._current()
        return await self._structure(lambda: self.service.find_edges(eids), lambda s: s.find_edges(eids))

    async def add_edges(
        self, src: np.ndarray, dst: np.ndarray, data: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        if self.server is not None:  # a structure write: the server's, logged
            return await self.server.add_edges(src, dst, data)
        return self.service.add_edges(src, dst, None, data)

    async def add_nodes(self, num: int, data: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        if self.server is not None:
            return await self.server.add_nodes(num, data)
        return self.service.add_nodes(num, None, data)

    async def compact(self) -> dict[str, float]:
        if self.server is not None:
            return await self.server.compact()
        return self.service.compact()

    async def remove_edges(self, eids: np.ndarray) -> None:
        if self.server is not None:
            return await self.server.remove_edges(eids)
        self.service.remove_edges(eids)
        return None

    async def degrees(self, ids: np.ndarray | None, edge_dir: str) -> np.ndarray:
        self._check_alive()
        if self.server is not None:
            await self._current()
        return await self._structure(
            lambda: self.service.degrees(ids, edge_dir), lambda s: s.degrees(ids, edge_dir)
        )

    async def sample_edges(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        self._check_alive()
        if self.server is not None:
            await self._current()
        if args.prob is not None and self.shm is not None:
            key = args.prob if args.prob.startswith("edge:") else f"edge:{args.prob}"
            if not self.service.store.has_tensor(key):
                await self._map(self.shm, key)
        if args.etype_fanouts is not None and self.shm is not None:
            probs = [edge_key(p) for p in args.etype_probs or [] if p is not None]
            for key in (tensor_key("edge", ETYPE), tensor_key("edge", TYPE_EID), *probs):
                if not self.service.store.has_tensor(key):
                    await self._map(self.shm, key)
        return await self._structure(lambda: self.service.sample_edges(args), lambda s: s.sample_edges(args))

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

    async def info(self) -> ServerInfo:
        if self.server is not None:
            return await self.server.info()
        return self.service.info()

    def close(self) -> None:
        """Unmap an attached store and close its server's connection (a standalone store stays)."""
        if self.server is not None:
            self.server.close()
            self.service.store.close()
