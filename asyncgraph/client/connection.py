"""One client connection to one server: asyncio glue around a ``ClientSession``.

The session decides everything about the protocol (handshake, request ids, which frames end
the connection); this module owns the socket, the futures and the timeouts. Many requests may
be in flight on a connection; responses are matched by id in any order. ``max_inflight``
bounds the requests in flight (back-pressure: callers wait rather than queueing without
limit); a call that finds a free slot costs one future and one timer handle. Requests issued in
one loop tick are coalesced: the tick's first is written at once, the others in groups of up to
``COALESCE_REQUESTS`` (or ``COALESCE_BYTES``), the last group at the end of the tick (``_send``);
``writes`` and ``requests_written`` count them. When the server goes away every pending, queued
and later call fails at once with ``ServerUnavailableError`` naming the server; a server that
stops answering makes calls fail at their timeout. Nothing here knows about partitions or
tensors.

Riding through a restart: with ``reconnect_window > 0`` a call that finds the connection lost
reconnects (jittered exponential backoff, for at most the window; one reconnect shared by every
caller) and, if its op may be resent (``RETRYABLE_OPS``: reads, and writes carrying a request id
the server deduplicates), sends it again. ``generation`` counts reconnects so that users of the
server's shared memory know to re-attach.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Callable
from typing import Any, cast

from asyncgraph.errors import (
    AsyncGraphError,
    RequestTimeoutError,
    ServerUnavailableError,
    error_from_code,
)
from asyncgraph.protocol import (
    CONNECTION_ERROR_ID,
    DEFAULT_MAX_FRAME_SIZE,
    ClientSession,
    ErrorResponse,
    HandshakeComplete,
    Response,
    ServerHello,
)
from asyncgraph.protocol.codec import frame_size
from asyncgraph.protocol.ops import RETRYABLE_OPS
from asyncgraph.protocol.session import Pieces

log = logging.getLogger("asyncgraph.client")

__all__ = ["COALESCE_BYTES", "COALESCE_REQUESTS", "CONNECTION_ERROR_ID", "Connection"]

# A tick's queue is written as soon as it holds COALESCE_REQUESTS requests or COALESCE_BYTES.
# Requests: the server starts on the first ones while the client still issues the rest (one write
# per tick made the server wait for all of them: 32 concurrent 1-row pulls 1.3x slower than a
# write each with the machine's cores free; groups of 8 were 1.16x faster than a write each there
# and 1.2x under load, where one write per tick was 1.36x). Bytes: frames that big gain nothing
# from sharing a write, and the transport's flow control (``pause_writing``, high-water mark
# 64 KiB by default) must stop the tick's later requests as it did when each was written.
COALESCE_REQUESTS = 8
COALESCE_BYTES = 64 << 10


class _ClientProtocol(asyncio.BufferedProtocol):
    """Feeds received bytes to the session and its events to the connection."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._session = conn._session

    def _current(self) -> bool:
        """False once the connection has moved on to a newer session (after a reconnect)."""
        return self._conn._session is self._session

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._current():
            self._conn._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._session.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        conn = self._conn
        if not self._current():
            self._session.buffer_updated(nbytes)
            return
        pending = conn._pending
        for event in self._session.buffer_updated(nbytes):
            if isinstance(event, Response):
                future = pending.get(event.id)
                if future is not None and not future.done():  # else the caller timed out and left
                    future.set_result(event.result)
            elif isinstance(event, ErrorResponse):
                future = pending.get(event.id)
                if future is not None and not future.done():
                    future.set_exception(error_from_code(event.code, event.message))
            elif isinstance(event, HandshakeComplete):
                conn._on_ready(event)
            else:
                conn._fail(event.error)
        out = self._session.data_to_send()
        if out and conn._transport is not None and not conn._transport.is_closing():
            conn._transport.writelines(out)  # the client hello

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._session.close()
        if not self._current():
            return
        reason = f": {exc}" if exc else ""
        self._conn._fail(ServerUnavailableError(f"connection to server {self._conn.name} lost{reason}"))

    def pause_writing(self) -> None:
        self._conn._writable.clear()

    def resume_writing(self) -> None:
        self._conn._writable.set()


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class Connection:
    """A multiplexed, authenticated connection to one server."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        name: str,
        max_frame_size: int,
        max_inflight: int,
        graph_name: str | None = None,
        secret: bytes | None = None,
        reconnect_window: float = 0.0,
    ) -> None:
        self.host = host
        self.port = port
        self.name = name
        self.max_frame_size = max_frame_size
        self.graph_name = graph_name
        self.secret = secret
        self.reconnect_window = reconnect_window
        self.generation = 0
        #: Called (no arguments) after each successful reconnect, e.g. to bind the client's
        #: holder to the new connection (issue 22: ``--holder-lease``).
        self.on_reconnect: list[Callable[[], object]] = []
        self.retries = 0
        self._closed_by_user = False
        self._reconnecting: asyncio.Future[None] | None = None
        self._session = ClientSession(
            graph_name=graph_name, secret=secret, name=name, max_frame_size=max_frame_size
        )
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._handshake: asyncio.Future[None] | None = None
        self._error: AsyncGraphError | None = None
        self._max_inflight = max_inflight
        self._inflight = 0  # calls between their slot and their reply
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None  # set once connected
        self._writable = asyncio.Event()
        self._writable.set()
        self.server_hello: ServerHello | None = None
        # Requests issued in a loop tick after its first, written together by ``_flush`` at its
        # end: (request id, the call's future, the frame's pieces).
        self._queued: list[tuple[int, asyncio.Future[Any], Pieces]] = []
        self._queued_bytes = 0
        self._flush_pending = False  # a flush is scheduled: this tick's first request went out
        self.writes = 0  # transport writes carrying requests (handshakes not counted)
        self.requests_written = 0  # requests those writes carried

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        graph_name: str | None,
        secret: bytes | None = None,
        timeout: float = 10.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_inflight: int = 32,
        reconnect_window: float = 0.0,
    ) -> Connection:
        """Connect and complete the handshake; ``graph_name=None`` accepts whatever is served."""
        conn = cls(
            host,
            port,
            name=f"{host}:{port}",
            max_frame_size=max_frame_size,
            max_inflight=max_inflight,
            graph_name=graph_name,
            secret=secret,
            reconnect_window=reconnect_window,
        )
        await conn._connect(timeout)
        hello = conn.server_hello
        if hello is not None:
            conn.graph_name = hello.graph_name  # a reconnect must find the same graph
        return conn

    async def _connect(self, timeout: float) -> None:
        """Open the socket and complete the handshake on the current session."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._handshake = loop.create_future()
        # The handshake's failure is raised to our caller below, except when we stopped waiting
        # first (timeout, cancellation): mark it retrieved so asyncio does not also print
        # "Future exception was never retrieved" for an error the caller already has.
        self._handshake.add_done_callback(_retrieve)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: _ClientProtocol(self), self.host, self.port), timeout
            )
        except (TimeoutError, OSError) as exc:
            self._handshake = None
            raise ServerUnavailableError(
                f"cannot connect to server {self.name}: {exc or 'timed out'}"
            ) from None
        try:
            await asyncio.wait_for(asyncio.shield(self._handshake), timeout)
        except TimeoutError:
            self._drop_transport()
            raise ServerUnavailableError(
                f"handshake with server {self.name} timed out after {timeout} s"
            ) from None
        except BaseException:
            self._drop_transport()
            raise
        finally:
            self._handshake = None

    async def reconnect(self) -> None:
        """Reconnect after a lost connection, within ``reconnect_window``; shared by all callers.

        Raises ``ServerUnavailableError`` when the server did not come back in time.
        """
        if self._error is None:
            return
        if self._reconnecting is None:
            self._reconnecting = asyncio.ensure_future(self._reconnect_loop())
            self._reconnecting.add_done_callback(self._reconnect_done)
        await asyncio.shield(self._reconnecting)

    def _reconnect_done(self, fut: asyncio.Future[None]) -> None:
        self._reconnecting = None
        if not fut.cancelled():
            fut.exception()  # retrieved: each waiter got it through the shield

    async def _reconnect_loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_window
        delay = 0.05
        last: BaseException | None = None
        while not self._closed_by_user:
            left = deadline - loop.time()
            if left <= 0:
                break
            old = self.server_hello
            self._session = ClientSession(
                graph_name=self.graph_name,
                secret=self.secret,
                name=self.name,
                max_frame_size=self.max_frame_size,
            )
            self._transport = None
            try:
                await self._connect(min(left, 10.0))
            except (ServerUnavailableError, ConnectionError) as exc:
                last = exc
                await asyncio.sleep(min(delay * random.uniform(0.5, 1.5), max(deadline - loop.time(), 0)))
                delay = min(delay * 2, 1.0)
                continue
            hello = self.server_hello
            problem = None
            if hello is not None and old is not None:
                if hello.part_id != old.part_id:
                    problem = f"came back serving partition {hello.part_id}, not {old.part_id}"
                elif hello.epoch < old.epoch:
                    problem = (
                        f"came back at state epoch {hello.epoch}, older than the {old.epoch} it had: "
                        "it lost state (restarted without its --state-dir?)"
                    )
            if problem is not None:
                self._error = None
                self._fail(ServerUnavailableError(f"server {self.name} {problem}"))
                raise cast(AsyncGraphError, self._error)
            self._error = None
            self.generation += 1
            log.info("reconnected to server %s (generation %d)", self.name, self.generation)
            for callback in self.on_reconnect:
                callback()
            return
        raise ServerUnavailableError(
            f"server {self.name} did not come back within the reconnect window of "
            f"{self.reconnect_window:g} s{f': {last}' if last else ''}"
        )

    # --- calls ----------------------------------------------------------------------------
    async def call(self, op: str, args: dict[str, Any], timeout: float, *, retry: bool | None = None) -> Any:
        """Send one request and wait for its result; raises the server's typed error.

        With a reconnect window, a lost connection is reopened and the request sent again if
        ``retry`` (default: ``op in RETRYABLE_OPS``).
        """
        may_retry = (op in RETRYABLE_OPS) if retry is None else retry
        while True:
            try:
                return await self._call_once(op, args, timeout)
            except ServerUnavailableError:
                if not may_retry or self.reconnect_window <= 0 or self._closed_by_user:
                    raise
            await self.reconnect()
            self.retries += 1

    async def _call_once(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        if self._error is not None:
            raise type(self._error)(str(self._error))
        request_id, pieces = self._session.send_request(op, args)
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._inflight >= self._max_inflight or self._slot_waiters or not self._writable.is_set():
            await self._wait_for_slot(op, timeout, deadline)  # back-pressure: the slow path
            if self._error is not None:
                raise type(self._error)(str(self._error))
        # The fast path: one future and one timer handle, no context managers. The timer fails
        # the future itself, so a timeout the server reports (a barrier's) stays its own error.
        self._inflight += 1
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[request_id] = future
        timer = loop.call_at(deadline, self._expire, future, op, timeout)
        try:
            self._send(loop, request_id, future, pieces)
            return await future
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)
            self._inflight -= 1
            if self._slot_waiters:
                self._wake_slot_waiter()

    def _expire(self, future: asyncio.Future[Any], op: str, timeout: float) -> None:
        """The deadline of a call passed: fail its future (unless the reply won the race)."""
        if future.done():
            return
        if self._error is not None:
            future.set_exception(type(self._error)(str(self._error)))
        else:
            future.set_exception(
                RequestTimeoutError(f"{op} on server {self.name} timed out after {timeout:g} s")
            )

    async def _wait_for_slot(self, op: str, timeout: float, deadline: float) -> None:
        """Wait until fewer than ``max_inflight`` calls are in flight and the socket takes
        writes; ``RequestTimeoutError`` at ``deadline``."""
        loop = self._loop or asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                while self._inflight >= self._max_inflight:
                    waiter: asyncio.Future[None] = loop.create_future()
                    self._slot_waiters.append(waiter)  # a cancelled one is skipped when woken
                    await waiter
                    if self._error is not None:
                        return
                await self._writable.wait()
        except TimeoutError:
            if self._error is not None:
                raise type(self._error)(str(self._error)) from None
            raise RequestTimeoutError(f"{op} on server {self.name} timed out after {timeout:g} s") from None
        finally:
            if self._slot_waiters and self._inflight < self._max_inflight:
                self._wake_slot_waiter()  # pass on a wake-up this waiter did not use

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _send(
        self, loop: asyncio.AbstractEventLoop, request_id: int, future: asyncio.Future[Any], pieces: Pieces
    ) -> None:
        """Write a request, coalescing the requests of one loop tick.

        The first request of a tick is written at once (a lone call waits for no extra loop
        iteration) and schedules ``_flush`` for the end of the tick; requests issued meanwhile
        are queued and written by it with one ``writelines`` (one syscall on uvloop, one read
        wake-up on the server instead of one per request), or at once when the queue holds
        ``COALESCE_REQUESTS`` requests or ``COALESCE_BYTES``.
        """
        transport = self._transport
        if transport is None or transport.is_closing():
            self._lost()
            raise ServerUnavailableError(f"connection to server {self.name} is closed")
        if self._flush_pending:
            self._queued.append((request_id, future, pieces))
            self._queued_bytes += frame_size(pieces)
            if self._queued_bytes >= COALESCE_BYTES or len(self._queued) >= COALESCE_REQUESTS:
                self._flush(early=True)  # the server starts on them; flow control sees them
            return
        self.writes += 1
        self.requests_written += 1
        transport.writelines(pieces)
        self._flush_pending = True
        loop.call_soon(self._flush)

    def _flush(self, early: bool = False) -> None:
        """Write the requests queued this tick with one ``writelines``; ``early``: before the
        tick ends, the queue being full (the scheduled flush still runs then).

        A request whose call already ended (cancelled, timed out) is left out: the server never
        sees it. If the connection closed meanwhile, the queued calls fail like in-flight ones.
        """
        self._flush_pending = early
        queued = self._queued
        if not queued:
            return
        self._queued = []
        self._queued_bytes = 0
        pending = self._pending
        live = [entry for entry in queued if pending.get(entry[0]) is entry[1] and not entry[1].done()]
        if not live:
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            self._lost()
            error = self._error
            assert error is not None
            for _, future, _ in live:  # when the user's close() came first: fail them here too
                if not future.done():
                    future.set_exception(type(error)(str(error)))
            return
        if len(live) == 1:
            out = live[0][2]
        else:
            out = []
            for entry in live:
                out += entry[2]
        self.writes += 1
        self.requests_written += len(live)
        transport.writelines(out)

    def _lost(self) -> None:
        """The transport is closing but ``connection_lost`` has not run yet (it follows a tick
        later): fail the connection now, so pending calls fail and a retry reconnects instead of
        finding the connection still "open"."""
        if self._error is None:
            self._fail(ServerUnavailableError(f"connection to server {self.name} lost"))

    # --- session events -------------------------------------------------------------------
    def _on_ready(self, event: HandshakeComplete) -> None:
        self.server_hello = cast(ServerHello, event.peer_hello)
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_result(None)

    def _fail(self, exc: AsyncGraphError) -> None:
        if self._error is None:
            self._error = exc
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(exc)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(type(exc)(str(exc)))
        self._pending.clear()
        self._queued.clear()  # their futures were failed above; never written to a later transport
        self._queued_bytes = 0
        self._writable.set()
        while self._slot_waiters:  # they see the error and fail
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        if self._transport is not None:
            self._transport.close()

    @property
    def closed(self) -> bool:
        return self._error is not None

    def _drop_transport(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._session.close()

    def close(self) -> None:
        self._closed_by_user = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._session.close()
        if self._error is None:
            self._error = ServerUnavailableError(f"connection to server {self.name} was closed by the client")
