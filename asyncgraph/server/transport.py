"""asyncio transport for the graph server: bytes in, handlers called, frames out.

One ``ServerConnection`` per client connection, built on ``asyncio.BufferedProtocol`` so large
request bodies are received straight into their final buffer. Every protocol decision (the
handshake, which frames end the connection and what the client is told) belongs to the
``ServerSession``; this module calls handlers, writes the pieces the session returns
(``writelines``: arrays go out from their own buffers) and applies back-pressure.

Back-pressure: when the transport's write buffer passes its high-water mark, or too many async
requests (barriers) are pending, the connection stops reading, so a client that floods the
server (or stops reading its replies) waits in its own socket buffer instead of growing the
server's memory.

Logs: one ``key=value`` line per connection opened, closed and refused (auth or protocol
failure), with the peer, so ``grep peer=10.0.0.7`` finds a client's whole story. Metrics (when
the server has ``--metrics-port``): see ``server/metrics.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from asyncgraph import failpoints
from asyncgraph.errors import AsyncGraphError, ServerUnavailableError
from asyncgraph.protocol import (
    CONNECTION_ERROR_ID,
    ConnectionFailed,
    HandshakeComplete,
    Request,
    ServerSession,
)
from asyncgraph.server.admission import Admission
from asyncgraph.server.budget import ConnectionCap, ReplyBudget
from asyncgraph.server.handlers import RequestHandlers
from asyncgraph.server.peers import CURRENT_CONNECTION

if TYPE_CHECKING:
    from asyncgraph.server.metrics import ServerMetrics

__all__ = ["CONNECTION_ERROR_ID", "ServerConnection"]

log = logging.getLogger("asyncgraph.server")

#: With a reply budget, replies held during one read are written (and counted) every this many bytes.
REPORT_EVERY = 1 << 20

# What synchronous handlers return: never awaitable, so ``inspect.isawaitable`` is skipped.
_PLAIN_RESULTS = frozenset({np.ndarray, dict, list, type(None), int, float, str})
#: Failure points hit right after the reply to these ops is handed to the socket.
_REPLY_POINTS = {"push": "reply.push", "snapshot": "reply.snapshot", "hello": "reply.hello"}


class ServerConnection(asyncio.BufferedProtocol):
    """Serves one client connection."""

    def __init__(
        self,
        handlers: RequestHandlers,
        *,
        graph_name: str,
        part_id: int,
        secret: bytes | None,
        max_frame_size: int,
        role: str = "primary",
        max_inflight: int = 64,
        write_high_water: int = 64 << 20,
        metrics: ServerMetrics | None = None,
        live: set[ServerConnection] | None = None,
        admission: Admission | None = None,
        cap: ConnectionCap | None = None,
        replies: ReplyBudget | None = None,
        require_holder_keys: bool = False,
    ) -> None:
        self._cap = cap  # issue 22: authenticated connections per server (server/budget.py)
        self._counted = False
        self._holder: str | None = None  # the holder the client named in its hello (counted)
        #: The holder this connection's hello named and proved (issue 32): its requests act as
        #: this holder and no other (``server.peers.bound_holder``); None: anonymous.
        self.holder: str | None = None
        self._replies = replies  # issue 22: one budget for unread reply bytes (server/budget.py)
        self._budget_paused = False
        self._backlog: list[Any] = []  # requests received while paused by the budget
        self._held_bytes = 0
        self._handlers = handlers
        self._metrics = metrics
        self._live = live if live is not None else set()
        self._requests = 0
        self._failure: str | None = None
        self._admission = admission
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._session = ServerSession(
            graph_name=graph_name,
            part_id=part_id,
            secret=secret,
            max_frame_size=max_frame_size,
            instance=handlers.instance,
            epoch=handlers.epoch,
            role=role,
            require_holder_keys=require_holder_keys,
        )
        self._closed = False
        self._transport: asyncio.Transport | None = None
        self._max_inflight = max_inflight
        self._write_high_water = write_high_water
        self._inflight: set[asyncio.Task[None]] = set()
        self._write_paused = False
        self._read_paused = False
        self._held: list[bytes | memoryview] | None = None  # replies held during one read
        self.peer = "?"

    # --- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = tr = cast(asyncio.Transport, transport)
        peer = tr.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self._admission is not None:
            self._handshake_timer = self._admission.admit(self.peer, self._handshake_expired)
            if self._handshake_timer is None:
                self._close()
                return
        tr.set_write_buffer_limits(high=self._write_high_water)
        self._live.add(self)
        if self._metrics is not None:
            self._metrics.connections_open += 1
            self._metrics.connections_total += 1
        log.info("connection open peer=%s open=%d", self.peer, len(self._live))
        tr.writelines(self._session.data_to_send())  # the server hello

    @property
    def inflight(self) -> int:
        """Async requests (barriers) of this connection still waiting for their result."""
        return len(self._inflight)

    @property
    def read_paused(self) -> bool:
        """True while back-pressure holds this connection's further requests in its socket."""
        return self._read_paused

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._session.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        # Replies to the requests completed by these bytes are held and written with one
        # ``writelines`` at the end (uvloop sends on every write: one syscall per read, not one
        # per pipelined request).
        self._held = []
        try:
            self._handle_received(nbytes)
        finally:
            self._flush_held()

    def _handle_received(self, nbytes: int) -> None:
        session = self._session
        if self._metrics is not None:
            self._metrics.bytes_in += nbytes
        self._handle_events(session.buffer_updated(nbytes))

    def _handle_events(self, events: list[Any]) -> None:
        session = self._session
        greeted = False
        for i, event in enumerate(events):
            if self._closed:
                return
            if type(event) is Request:
                if self._budget_paused:  # issue 22: the rest waits until the reply budget allows
                    self._backlog.extend(events[i:])
                    return
                self._dispatch(event)
                if self._held_bytes > REPORT_EVERY and self._replies is not None:
                    self._flush_held()  # let the budget see these replies before the next request
                    self._held = []
            elif type(event) is ConnectionFailed:
                error = event.error
                self._failure = type(error).__name__
                kind = "auth" if error.code == "auth" else "protocol"
                log.warning(
                    "connection refused peer=%s reason=%s error=%s message=%r",
                    self.peer, kind, self._failure, str(error),
                )  # fmt: skip
                if self._metrics is not None:
                    self._metrics.connection_failures += 1
                self._write(session.data_to_send())
                self._close()
                return
            elif type(event) is HandshakeComplete:
                self._end_handshake()
                holder = getattr(event.peer_hello, "holder", None)
                self.holder = holder
                if self._cap is not None:
                    refusal = self._cap.admit(holder)
                    if refusal is not None:
                        self._refuse_over_cap(session, refusal)
                        return
                    self._counted, self._holder = True, holder
                leases = getattr(self._handlers, "leases", None)
                if leases is not None:  # the hello names the client: this connection holds its lease
                    leases.bind(holder, self)
                greeted = True
        out = session.data_to_send()
        if out:
            self._write(out)  # the hello result
            if failpoints.enabled and greeted:
                self._reply_sent("hello")

    def _refuse_over_cap(self, session: ServerSession, why: str) -> None:
        assert self._cap is not None
        self._failure = "TooManyConnections"
        log.warning("connection refused peer=%s reason=cap open=%d: %s", self.peer, self._cap.open, why)
        self._write(session.data_to_send())  # the hello result, then why the connection ends
        self._write(session.send_error(CONNECTION_ERROR_ID, ServerUnavailableError(why)))
        self._close()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._replies is not None:
            self._replies.forget(self)
        leases = getattr(self._handlers, "leases", None)
        if leases is not None:  # issue 22: a holder's lease starts when its last connection goes
            leases.connection_lost(self)
        if self._counted and self._cap is not None:
            self._counted = False
            self._cap.release(self._holder)
        self._session.close()
        self._end_handshake()
        if self in self._live:
            self._live.discard(self)
            if self._metrics is not None:
                self._metrics.connections_open -= 1
            reason = self._failure or (type(exc).__name__ if exc is not None else "eof")
            log.info(
                "connection closed peer=%s requests=%d reason=%s open=%d",
                self.peer, self._requests, reason, len(self._live),
            )  # fmt: skip
        for task in self._inflight:
            task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    # --- handshake deadline ---------------------------------------------------------------
    def _end_handshake(self) -> None:
        timer = self._handshake_timer
        if timer is not None and self._admission is not None:
            self._handshake_timer = None
            self._admission.release(timer)

    def _handshake_expired(self) -> None:
        if self._handshake_timer is None or self._closed:
            return
        assert self._admission is not None
        self._admission.timed_out += 1
        log.warning(
            "closing connection from %s: no hello within %g s", self.peer, self._admission.handshake_timeout
        )
        self._end_handshake()
        self._close()

    # --- requests ---------------------------------------------------------------------------
    def _dispatch(self, request: Request) -> None:
        self._requests += 1
        metrics = self._metrics
        t0 = perf_counter() if metrics is not None else 0.0
        handler = self._handlers.ops.get(request.op)
        token = CURRENT_CONNECTION.set(self)  # issue 22: handlers may ask whose request this is
        try:
            if handler is None:
                handler = self._handlers.lookup(request.op)  # raises UnknownOpError
            result = handler(request.args)
        except Exception as exc:
            self._reply_error(request.id, exc)
            if metrics is not None:
                metrics.observe(request.op, False, t0)
            return
        finally:
            CURRENT_CONNECTION.reset(token)
        if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
            task = asyncio.ensure_future(self._finish(request.id, request.op, t0, result))
            self._inflight.add(task)
            task.add_done_callback(self._task_done)
            self._update_reading()
        else:
            ok = self._reply(request.id, result)
            if metrics is not None:
                metrics.observe(request.op, ok, t0)
            if failpoints.enabled:
                self._reply_sent(request.op)

    async def _finish(self, request_id: int, op: str, t0: float, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._reply_error(request_id, exc)
            ok = False
        else:
            ok = self._reply(request_id, result)
        if self._metrics is not None:
            self._metrics.observe(op, ok, t0)
        if failpoints.enabled:
            self._reply_sent(op)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._update_reading()

    # --- replies --------------------------------------------------------------------------
    def _reply(self, request_id: int, result: Any) -> bool:
        """Queue the result; False when it could not be encoded (an error went instead)."""
        self._handlers.requests_served += 1
        if self._closed:
            return True
        try:
            pieces = self._session.send_response(request_id, result)
        except (TypeError, ValueError, OverflowError, AsyncGraphError) as exc:
            self._reply_error(request_id, exc, counted=True)
            return False
        self._write(pieces)
        return True

    def _reply_sent(self, op: str) -> None:
        """Failure point ``reply.<op>`` (snapshot, push): hit once the reply is in the socket."""
        point = _REPLY_POINTS.get(op)
        if point is not None:
            if self._held:  # written now, not at the end of this read
                self._flush_held()
                self._held = []
            failpoints.hit(point)

    def _reply_error(self, request_id: int, exc: BaseException, *, counted: bool = False) -> None:
        if not counted:
            self._handlers.requests_served += 1
        if not isinstance(exc, AsyncGraphError):
            log.exception("internal error while serving request %d", request_id, exc_info=exc)
        if self._closed:
            return
        self._write(self._session.send_error(request_id, exc))

    def _write(self, pieces: list[bytes | memoryview]) -> None:
        if self._closed or self._transport is None or self._transport.is_closing():
            return
        metrics = self._metrics
        if metrics is not None:
            nbytes = 0
            for p in pieces:
                nbytes += p.nbytes if type(p) is memoryview else len(p)
            metrics.bytes_out += nbytes
            metrics.socket_writes += self._held is None
        held = self._held
        if held is not None:
            held.extend(pieces)
            if self._replies is not None:
                for p in pieces:
                    self._held_bytes += p.nbytes if type(p) is memoryview else len(p)
        else:
            self._transport.writelines(pieces)
            self._report_queued()

    def _flush_held(self) -> None:
        """Write the replies held while handling one read (see ``buffer_updated``)."""
        held, self._held = self._held, None
        self._held_bytes = 0
        if held and self._transport is not None and not self._transport.is_closing():
            if self._metrics is not None:
                self._metrics.socket_writes += 1
            self._transport.writelines(held)
            self._report_queued()

    def _report_queued(self) -> None:
        if self._replies is not None and self._transport is not None:
            self._replies.report(self, self._transport.get_write_buffer_size())

    def queued_bytes(self) -> int:
        """Reply bytes written but not yet taken by the socket (``ReplyBudget``)."""
        if self._closed or self._transport is None:
            return 0
        return self._transport.get_write_buffer_size()

    def budget_pause(self, paused: bool) -> None:
        """The server's reply budget stops (or resumes) reading this connection, and handling
        the requests it already sent."""
        self._budget_paused = paused
        self._update_reading()
        if not paused and self._backlog:
            asyncio.get_running_loop().call_soon(self._drain_backlog)

    def _drain_backlog(self) -> None:
        backlog, self._backlog = self._backlog, []
        if self._closed or not backlog:
            return
        self._held = []
        try:
            self._handle_events(backlog)
        finally:
            self._flush_held()

    # --- flow control and closing ----------------------------------------------------------
    def _update_reading(self) -> None:
        if self._transport is None or self._closed:
            return
        should_pause = self._write_paused or self._budget_paused or len(self._inflight) >= self._max_inflight
        if should_pause and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()
        elif not should_pause and self._read_paused:
            self._read_paused = False
            self._transport.resume_reading()

    def _close(self) -> None:
        self._flush_held()  # e.g. the error frame that says why the connection ends
        self._closed = True
        if self._transport is not None:
            self._transport.close()
