"""Replica servers: more server processes for one partition, over the primary's memory.

A host with more cores than partitions runs one *primary* per partition (it loads the partition
into memfds, owns the tensor catalog, barriers and the write-ahead log) and any number of
*replicas* (DGL's ``num_servers``). A replica maps the primary's memory through the same fd
channel co-located trainers use, so it holds no copy of the data, and answers the requests that
only read or write rows: pulls, pushes (unless the primary logs writes, which must then pass
through it), samples, edge queries and degrees. Everything that changes the catalog or needs one
place for the whole partition (create/delete tensors, sparse-optimizer steps that may create
their state, barriers, snapshots) is refused with a message naming the primary; clients send
those there.

Tensors the primary creates or deletes later are noticed through the store's catalog
generation (one shared 8-byte counter read per request) and re-mapped before the request runs.
A replica announces itself to its primary (``add_replica``), whose ``info`` lists the replicas'
ports so clients find them, and exits when the primary goes away (the data it maps is then no
longer authoritative).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from asyncgraph.errors import InvalidRequestError, ServerUnavailableError
from asyncgraph.launch.processes import process_alive
from asyncgraph.protocol.info import ServerInfo
from asyncgraph.protocol.ops import CATALOG_OPS, PRIMARY_ONLY_OPS, WRITE_OPS
from asyncgraph.server.handlers import Handler, RequestHandlers
from asyncgraph.service.limits import WorkLimits
from asyncgraph.storage.attached import AttachedStore

if TYPE_CHECKING:
    from asyncgraph.server.metrics import ServerMetrics

__all__ = ["ReplicaHandlers"]

class ReplicaHandlers(RequestHandlers):
    """The ops a replica answers over an attached store of its primary's memory.

    ``fetch_catalog`` returns the primary's full tensor export (descriptor and fds, blocking);
    it runs in a worker thread whenever the primary's catalog generation moved, and the store
    is synced on the loop, so no request sees a half-updated catalog.
    """

    def __init__(
        self,
        store: AttachedStore,
        *,
        primary: str,
        primary_info: ServerInfo,
        fetch_catalog: Callable[[], tuple[dict[str, Any], list[int]]],
        on_shutdown: Callable[[], None] | None = None,
        limits: WorkLimits | None = None,
        max_frame_size: int | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        super().__init__(
            store,
            num_clients=primary_info.num_clients,
            on_shutdown=on_shutdown,
            limits=limits,
            max_frame_size=max_frame_size,
            metrics=metrics,
        )
        self.store: AttachedStore = store
        self.primary = primary
        self.primary_instance = primary_info.instance
        #: The primary logs writes (WAL): pushes must reach it, not this replica.
        self.writes_via_primary = primary_info.durable
        self._fetch_catalog = fetch_catalog
        self._syncing: asyncio.Future[None] | None = None
        # From the op table: what needs one place per partition, and (when the primary logs)
        # every write, so that each one is logged there.
        refused = PRIMARY_ONLY_OPS | (WRITE_OPS if self.writes_via_primary else frozenset())
        for op in CATALOG_OPS - refused:
            self.ops[op] = self._synced(self.ops[op])
        for op in refused:
            self.ops[op] = self._refuse(op)
        #: Whether the primary still runs (set by the server: its connection is open and its
        #: process alive). A write is acknowledged only while it does.
        self.primary_alive: Callable[[], bool] = lambda: process_alive(primary_info.pid)
        for op in WRITE_OPS - refused:
            self.ops[op] = self._while_primary_lives(op, self.ops[op])

    def describe(self) -> ServerInfo:
        return dataclasses.replace(
            super().describe(),
            role="replica",
            primary=self.primary,
            primary_instance=self.primary_instance,
            durable=self.writes_via_primary,
        )

    def _while_primary_lives(self, op: str, handler: Handler) -> Handler:
        """A write is applied and acknowledged only while the primary lives, checked before and
        after: rows written into the memory of a dead primary are lost with it, so such a write
        fails (``ServerUnavailableError``) and the client resends it to the restarted primary."""

        def run(args: Mapping[str, Any]) -> Any:
            self._check_primary(op)
            result = handler(args)
            if inspect.isawaitable(result):
                return self._checked_after(op, result)
            self._check_primary(op)
            return result

        return run

    async def _checked_after(self, op: str, pending: Awaitable[Any]) -> Any:
        result = await pending
        self._check_primary(op)
        return result

    def _check_primary(self, op: str) -> None:
        if not self.primary_alive():
            raise ServerUnavailableError(
                f"{op}: the primary {self.primary} of partition {self.store.part_id} is gone; this replica "
                "does not acknowledge writes into its memory (send them to the restarted primary)"
            )

    def _refuse(self, op: str) -> Handler:
        reason = (
            "it changes what the whole partition shares"
            if op in PRIMARY_ONLY_OPS
            else "the primary logs every write"
        )

        def refuse(args: Mapping[str, Any]) -> Any:
            raise InvalidRequestError(
                f"{op}: this server is a replica of partition {self.store.part_id}; send {op} to "
                f"its primary {self.primary} ({reason})"
            )

        return refuse

    def _synced(self, handler: Handler) -> Handler:
        store = self.store

        def run(args: Mapping[str, Any]) -> Any:
            if store.catalog_stale:
                return self._after_sync(handler, args)
            return handler(args)

        return run

    async def _after_sync(self, handler: Handler, args: Mapping[str, Any]) -> Any:
        await self.sync_catalog()
        result = handler(args)
        if inspect.isawaitable(result):
            return await result
        return result

    def sync_catalog(self) -> Awaitable[None]:
        """Map the primary's current tensors (one fetch at a time; concurrent callers share it)."""
        if self._syncing is None or self._syncing.done():
            self._syncing = asyncio.ensure_future(self._sync())
        return asyncio.shield(self._syncing)

    async def _sync(self) -> None:
        while self.store.catalog_stale:
            descriptor, fds = await asyncio.to_thread(self._fetch_catalog)
            self.store.sync_catalog(descriptor, fds)
