"""``Partition`` served by a primary server and its replicas (several processes per partition).

Replicas map the primary's memory (``asyncgraph.server.replica``), so any of them answers a
read with the same rows. Reads, and pushes unless the primary logs writes, go to the next live
server in turn, spreading one trainer's requests over every process of the partition; tensor
life cycle, sparse-optimizer steps and metadata go to the primary.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from asyncgraph.errors import AsyncGraphError, LiveGraphError, ServerUnavailableError
from asyncgraph.protocol.info import ServerInfo
from asyncgraph.protocol.ops import Op, SampleEdgesArgs
from asyncgraph.service.base import SampledRows
from asyncgraph.storage.store import TensorMeta

from .remote import RemotePartition

__all__ = ["ReplicatedPartition"]

log = logging.getLogger("asyncgraph.client")

T = TypeVar("T")


class ReplicatedPartition:
    """A partition whose primary and replica servers take turns answering reads.

    A replica that becomes unavailable is dropped and the read is sent to the primary instead
    (reads are idempotent). A push it fails is not resent, since it may have been applied: the
    caller sees the ``ServerUnavailableError`` as it would from a single server. Every
    ``refresh_interval`` seconds of use the primary is asked (in the background) which replicas
    it has now, and those not serving here (restarted or added ones) are opened with
    ``reopen(port, primary_instance)`` and take turns too.
    """

    store = None

    def __init__(
        self,
        primary: RemotePartition,
        replicas: Sequence[RemotePartition],
        *,
        writes_via_primary: bool,
        reopen: Callable[[int, Any], Awaitable[RemotePartition | None]] | None = None,
        refresh_interval: float = 5.0,
    ) -> None:
        self.part_id = primary.part_id
        self.primary = primary
        self.writes_via_primary = writes_via_primary
        self._members: list[RemotePartition] = [primary, *replicas]
        self._turn = 0
        self._reopen = reopen
        self.refresh_interval = refresh_interval
        self._next_refresh = time.monotonic() + refresh_interval
        self._refreshing: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"{self.primary.name} (+{len(self._members) - 1} replicas)"

    @property
    def closed(self) -> bool:
        return self.primary.closed

    def runs_here(self, op: Op) -> bool:
        return False

    @property
    def replicas(self) -> list[RemotePartition]:
        """The replicas serving here now."""
        return [m for m in self._members if m is not self.primary]

    def _pick(self) -> RemotePartition:
        self._maybe_refresh()
        members = self._members
        for _ in range(len(members)):
            member = members[self._turn % len(members)]
            self._turn += 1
            if not member.closed or member is self.primary:
                return member
            self._drop(member)
            members = self._members
        return self.primary

    def _drop(self, member: RemotePartition) -> None:
        if member in self._members and member is not self.primary:
            self._members.remove(member)
            member.close()
            log.warning("replica %s of partition %d is gone; using the others", member.name, self.part_id)

    def _maybe_refresh(self) -> None:
        if self._reopen is None or self._refreshing is not None or self.primary.closed:
            return
        now = time.monotonic()
        if now < self._next_refresh:
            return
        self._next_refresh = now + self.refresh_interval
        self._refreshing = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        """Open the replicas the primary lists now that are not serving here."""
        assert self._reopen is not None
        try:
            info = await self.primary.info()
            listed = list(info.replicas)
            serving = {m.conn.port for m in self._members if m is not self.primary}
            for port in listed:
                if port in serving:
                    continue
                replica = await self._reopen(port, info.instance)
                if replica is None:
                    continue
                if self.primary.closed:
                    replica.close()
                    return
                self._members.append(replica)
                log.info("replica %s of partition %d is serving again", replica.name, self.part_id)
        except AsyncGraphError as exc:
            log.info("replicas of partition %d not refreshed: %s", self.part_id, exc)
        finally:
            self._refreshing = None

    async def _read(self, call: Callable[[RemotePartition], Awaitable[T]]) -> T:
        member = self._pick()
        if member is self.primary:
            return await call(member)
        try:
            return await call(member)
        except ServerUnavailableError:
            self._drop(member)
            return await call(self.primary)

    async def _structure(self, call: Callable[[RemotePartition], Awaitable[T]]) -> T:
        """A structure read, like any read; a replica whose view of the primary's overlay is
        not mapped or stale refuses it (``LiveGraphError``): the primary answers (issue 35)."""
        try:
            return await self._read(call)
        except LiveGraphError:
            return await call(self.primary)

    async def add_edges(
        self, src: np.ndarray, dst: np.ndarray, data: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        return await self.primary.add_edges(src, dst, data)

    async def add_nodes(self, num: int, data: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        return await self.primary.add_nodes(num, data)

    async def compact(self) -> dict[str, float]:
        return await self.primary.compact()

    async def remove_edges(self, eids: np.ndarray) -> None:
        await self.primary.remove_edges(eids)

    async def pull(
        self,
        name: str,
        ids: np.ndarray,
        row_bytes: int = 0,
        *,
        out: np.ndarray | None = None,
        where: np.ndarray | None = None,
    ) -> np.ndarray:
        # a retry on the primary after a replica failed rewrites the same rows of ``out``
        return await self._structure(lambda p: p.pull(name, ids, row_bytes, out=out, where=where))

    async def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str) -> None:
        member = self.primary if self.writes_via_primary else self._pick()
        try:
            await member.push(name, ids, values, op)
        except ServerUnavailableError:
            self._drop(member)
            raise
        except LiveGraphError:  # rows of a live graph's new IDs: the primary writes them
            if member is self.primary:
                raise
            await self.primary.push(name, ids, values, op)

    async def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return await self._structure(lambda p: p.sample(seeds, fanout, replace, seed))

    async def sample_with_features(
        self,
        seeds: np.ndarray,
        fanout: int,
        replace: bool,
        seed: int | None,
        features: Sequence[str],
        extra: np.ndarray | None = None,
    ) -> SampledRows:
        return await self._structure(
            lambda p: p.sample_with_features(seeds, fanout, replace, seed, features, extra)
        )

    async def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return await self._structure(lambda p: p.find_edges(eids))

    async def degrees(self, ids: np.ndarray | None, edge_dir: str) -> np.ndarray:
        return await self._structure(lambda p: p.degrees(ids, edge_dir))

    async def sample_edges(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        return await self._structure(lambda p: p.sample_edges(args))

    async def sparse_update(
        self, name: str, ids: np.ndarray, grads: np.ndarray, spec: Mapping[str, Any]
    ) -> None:
        await self.primary.sparse_update(name, ids, grads, spec)

    async def create_tensor(
        self,
        name: str,
        policy: str,
        shape: list[int],
        dtype: str,
        init: dict[str, Any] | None,
        holder: str | None = None,
    ) -> tuple[TensorMeta, bool]:
        return await self.primary.create_tensor(name, policy, shape, dtype, init, holder)

    async def delete_tensor(self, name: str) -> None:
        await self.primary.delete_tensor(name)

    async def release_tensors(self, holder: str, names: list[str], every: bool = False) -> list[str]:
        return await self.primary.release_tensors(holder, names, every)

    async def list_tensors(self) -> list[TensorMeta]:
        return await self.primary.list_tensors()

    async def info(self) -> ServerInfo:
        return await self.primary.info()

    def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
        for member in self._members:
            member.close()
