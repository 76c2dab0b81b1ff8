"""The one path every write takes on a server: dedup -> apply -> log -> acknowledge.

A write (an op whose :data:`~asyncgraph.protocol.ops.OPS` entry says ``writes``) is decoded once,
skipped if its request id was applied before (the client retried after losing our reply),
applied to memory, appended to the write-ahead log, and acknowledged once the log record is
durable. If the log fails, the failure latches: memory may be ahead of the log, so every later
write is refused with ``StateLogError`` until the server is restarted from its state. A replay
at start-up applies the logged records through the same ``apply`` functions, without logging.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from asyncgraph.errors import StateLogError
from asyncgraph.protocol.args import ArgsRecord, request_id
from asyncgraph.protocol.ops import ANSWERED_AGAIN_OPS, OPS, WRITE_OPS, Op
from asyncgraph.server.durable import DurableState, RequestLog

log = logging.getLogger("asyncgraph.server")

__all__ = ["Apply", "WritePath"]

#: Applies one decoded write to memory; ``retried`` says its request id was applied before
#: (only the ``ANSWERED_AGAIN_OPS`` run again then, to answer as the first time did).
Apply = Callable[[Any, bool], Any]


class WritePath:
    """Dedup, apply, log and acknowledge writes; the log-failure latch."""

    def __init__(self, apply: Mapping[Op, Apply], durable: DurableState | None) -> None:
        missing = WRITE_OPS - set(apply)
        if missing:
            raise ValueError(f"no apply function for write ops {sorted(missing)}")
        self._apply = dict(apply)
        self.durable = durable
        self.requests = durable.requests if durable is not None else RequestLog()
        self.writes = 0  # acknowledged writes since start (periodic snapshots skip idle periods)
        #: Set when the write-ahead log failed: every later write is refused (``StateLogError``).
        self.log_failure: str | None = None

    def submit(self, op: Op, args: Mapping[str, Any], record: ArgsRecord | None = None) -> Any:
        """Apply ``op`` once per request id, log it, and return the result (or an awaitable of
        it that completes once the log record is durable). ``record``: ``args`` already decoded."""
        spec = OPS[op]
        assert spec.args is not None and spec.writes
        decoded = record if record is not None else spec.args.decode(args)
        hold = self.held()
        if hold is not None:  # a snapshot streams the store to disk: apply once it is written
            return self._after(hold, op, args, decoded)
        rid = request_id(args, op)
        retried = rid is not None and rid in self.requests
        if retried and op not in ANSWERED_AGAIN_OPS:
            return None  # applied before; the client retried after losing our reply
        self.check_healthy(op)
        result = self._apply[op](decoded, retried)
        if retried:
            return result
        durable = self.logged(op, args, rid)
        if durable is not None:
            return self.when_durable(op, durable, result)
        return result

    def held(self) -> asyncio.Future[None] | None:
        """While a snapshot is being written, a future done when it is; writes wait for it, so
        each lands wholly in the snapshot or in the next log (``DurableState.snapshot_async``)."""
        return self.durable.held() if self.durable is not None else None

    async def wait_writable(self) -> None:
        """Return once no snapshot is being written (a next one may start right after)."""
        while (hold := self.held()) is not None:
            await asyncio.shield(hold)

    async def _after(self, hold: asyncio.Future[None], op: Op, args: Mapping[str, Any], decoded: Any) -> Any:
        await asyncio.shield(hold)
        await self.wait_writable()
        result = self.submit(op, args, decoded)
        if inspect.isawaitable(result):
            return await result
        return result

    def replay(self, op: str, args: Mapping[str, Any]) -> None:
        """Apply one logged write again (at start-up, after the snapshot): nothing is logged."""
        spec = OPS[Op(op)]
        assert spec.args is not None
        self._apply[spec.op](spec.args.decode(args), False)

    def logged(self, op: str, args: Mapping[str, Any], rid: str | None = None) -> Awaitable[None] | None:
        """Count an applied write, log it (WAL) and remember its request id.

        Returns what to await before acknowledging (the shared fsync of ``--wal-fsync always``).
        """
        rid = rid if rid is not None else request_id(args, op)
        self.writes += 1
        durable = None
        if self.durable is not None:
            try:
                durable = self.durable.log(op, args, rid)
            except OSError as exc:
                raise self._failed(op, exc) from None
        if rid is not None:
            self.requests.add(rid)
        return durable

    async def when_durable(self, op: str, durable: Awaitable[None], result: Any) -> Any:
        """``result`` once the write's log record is on disk."""
        try:
            await durable
        except OSError as exc:
            raise self._failed(op, exc) from None
        return result

    def check_healthy(self, op: str) -> None:
        """``StateLogError`` once the write-ahead log has failed: memory is ahead of the log, so a
        later write (or a retry of the failed one) must not be applied and acknowledged."""
        if self.log_failure is not None:
            raise StateLogError(
                f"{op} refused: this server's write-ahead log failed earlier ({self.log_failure}); "
                "restart it from its state"
            )

    def _failed(self, op: str, exc: OSError) -> StateLogError:
        self.log_failure = f"{op} could not be logged: {exc}"
        log.critical("write-ahead log failed (%s); refusing writes until restarted", exc)
        return StateLogError(
            f"{self.log_failure}; it may be applied in memory but is not durable, and this "
            "server refuses writes until it is restarted from its state"
        )
