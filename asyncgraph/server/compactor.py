"""A server's compactions of its live overlay (issue 35): on request (``Op.COMPACT``,
``AsyncClient.compact``) and automatically past ``--compact-when-overlay-fraction``.

A compaction is a logged write: its record is appended where the overlay is captured, so a
replay after ``kill -9`` folds at the same point of the history and the later updates land on
the same layout (``storage/compaction.py``). The fold runs on a worker thread while reads and
updates go on; only the swap takes the store's write lock. One runs at a time, and a snapshot
waits for it (a snapshot between its record and its swap would hold the unfolded layout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from asyncgraph.protocol.live_args import CompactArgs
from asyncgraph.protocol.ops import Op
from asyncgraph.service.live_compact import Compaction

if TYPE_CHECKING:
    from asyncgraph.server.durable import DurableState
    from asyncgraph.server.writes import WritePath
    from asyncgraph.service.live import LiveStructure

log = logging.getLogger("asyncgraph.server")

__all__ = ["Compactor"]


class Compactor:
    """Runs a partition's compactions (see the module docstring)."""

    def __init__(self, live: LiveStructure, durable: DurableState | None) -> None:
        self.live = live
        self.durable = durable
        #: Set by the handlers once the write path exists.
        self.write_path: WritePath | None = None
        #: Compact on its own once added + removed edges pass this share of the CSC's edges
        #: (``--compact-when-overlay-fraction``; 0: only on request). Set after the replay.
        self.fraction = 0.0
        self._one = asyncio.Lock()
        self._auto: asyncio.Task[None] | None = None

    def request(self, args: dict[str, Any]) -> Any:
        """The ``compact`` handler: what the compaction did (``{}``: a resend of one applied)."""
        return self.run(CompactArgs.decode(args).rid)

    @contextlib.asynccontextmanager
    async def _no_snapshot(self) -> AsyncIterator[None]:
        if self.durable is None:
            yield
            return
        async with self.durable.exclusive():
            yield

    async def run(self, rid: str | None) -> dict[str, float]:
        """Capture, log, fold on a worker thread, swap; what it did."""
        path = self.write_path
        assert path is not None
        async with self._one, self._no_snapshot():
            await path.wait_writable()
            path.check_healthy(Op.COMPACT)
            if rid is not None and rid in path.requests:
                return {}
            if self.live.overlay is None:  # never updated: the base is compact
                return {"folded_edges": 0, "seconds": 0.0, "bytes": 0, "compactions": 0}
            job = Compaction(self.live)  # MemoryBudgetError: nothing changed, nothing logged
            durable = path.logged(Op.COMPACT, {"rid": rid} if rid is not None else {}, rid)
            try:
                new = await asyncio.to_thread(job.fold)
            except BaseException:
                job.abandon()
                raise
            result = job.finish(new)
        if durable is not None:
            await path.when_durable(Op.COMPACT, durable, None)
        log.info("partition %d compacted: %s", self.live.store.part_id, result)
        return result

    def maybe_start(self) -> None:
        """Start a compaction when the overlay passed ``fraction`` (after an applied update)."""
        overlay = self.live.overlay
        if self.fraction <= 0 or overlay is None or (self._auto is not None and not self._auto.done()):
            return
        store = self.live.store
        edges = int(overlay.csc(store.indptr, store.indptr, store.indptr)[0][-1])
        if overlay.added + overlay.removed >= self.fraction * max(1, edges):
            self._auto = asyncio.get_running_loop().create_task(self._automatic())

    async def _automatic(self) -> None:
        try:
            await self.run(None)
        except Exception as exc:  # the overlay stays; the next update tries again
            log.warning("partition %d: automatic compaction failed: %s", self.live.store.part_id, exc)
