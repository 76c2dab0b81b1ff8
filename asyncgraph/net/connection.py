"""One client connection to one server: asyncio glue around a ``ClientSession``.

The session decides everything about the protocol (handshake, request ids, which frames end
the connection); this module owns the socket, the futures and the timeouts. Many requests may
be in flight on a connection; responses are matched by id in any order. ``max_inflight``
bounds the requests in flight (back-pressure: callers wait rather than queueing without
limit); a call that finds a free slot costs one future and one timer handle. Requests issued in
one loop tick share writes (``TickWriter``, ``asyncgraph.net.coalesce``). When the server goes
away every pending, queued and later call fails at once with ``ServerUnavailableError`` naming
the server; a server that stops answering makes calls fail at their timeout. Nothing here knows
about partitions or tensors.

Riding through a restart: with ``reconnect_window > 0`` a call that finds the connection lost
reconnects (jittered exponential backoff, for at most the window; one reconnect shared by every
caller) and, if its op may be resent (``RETRYABLE_OPS``: reads, and writes carrying a request id
the server deduplicates), sends it again. ``generation`` counts reconnects so that users of the
server's shared memory know to re-attach.

Life cycle: one ``ConnectionState`` (as asyncpg's protocol keeps one), and beside it only why
the connection is not open (``_error``, the error calls fail with):
CONNECTING -> OPEN -> LOST -> RECONNECTING -> OPEN (``generation`` + 1) or LOST again; any state
-> CLOSED by ``close()``, which is final. Calls go out in OPEN only.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import ipaddress
import logging
import random
from typing import Any, cast

from asyncgraph.errors import (
    AsyncGraphError,
    RequestTimeoutError,
    ServerUnavailableError,
)
from asyncgraph.protocol import (
    CONNECTION_ERROR_ID,
    DEFAULT_MAX_FRAME_SIZE,
    ClientSession,
    HandshakeComplete,
    ServerHello,
)
from asyncgraph.protocol.ops import RETRYABLE_OPS

from .coalesce import COALESCE_BYTES, COALESCE_REQUESTS, TickWriter
from .protocol import ClientProtocol
from .tls import TlsConfig

log = logging.getLogger("asyncgraph.client")

__all__ = ["COALESCE_BYTES", "COALESCE_REQUESTS", "CONNECTION_ERROR_ID", "Connection", "ConnectionState"]


class ConnectionState(enum.Enum):
    """Where a ``Connection`` is in its life cycle (see the module docstring)."""

    CONNECTING = "connecting"  # socket opening, handshake under way: no calls yet
    OPEN = "open"  # handshake done: calls go out
    LOST = "lost"  # the server went away: calls fail (or, with a window, reconnect)
    RECONNECTING = "reconnecting"  # one shared reconnect is under way; calls wait for it
    CLOSED = "closed"  # closed by the user: final


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
        holder: str | None = None,
        part_id: int | None = None,
        role: str | None = None,
        tls: TlsConfig | None = None,
        holder_key: bytes | None = None,
    ) -> None:
        self.host = host
        self.tls = tls if tls is not None else TlsConfig.from_env()  # off unless configured
        self._ssl = self.tls.client_context() if self.tls is not None else None
        self.port = port
        self.name = name
        self.max_frame_size = max_frame_size
        self.graph_name = graph_name
        self.secret = secret
        self.holder = holder  # named in every hello: the server binds it to the connection
        self.holder_key = holder_key  # proves ``holder`` (given instead of the secret)
        # What the server must announce (checked before answering its hello); after the first
        # handshake, what it announced: a reconnect must find the same partition and role.
        self.part_id = part_id
        self.role = role
        self.reconnect_window = reconnect_window
        self.generation = 0  # reconnects so far: users of the server's memory re-attach on a change
        self.retries = 0
        self.state = ConnectionState.CONNECTING
        self._error: AsyncGraphError | None = None  # why the state is not OPEN
        self._reconnecting: asyncio.Future[None] | None = None  # the shared task, in RECONNECTING
        self._session = self._new_session()
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._handshake: asyncio.Future[None] | None = None
        self._max_inflight = max_inflight
        self._inflight = 0  # calls between their slot and their reply
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None  # set once connected
        self._writable = asyncio.Event()
        self._writable.set()
        self.server_hello: ServerHello | None = None
        self.writer = TickWriter(self._pending, self._live_transport, self._unavailable)

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
        holder: str | None = None,
        part_id: int | None = None,
        role: str | None = None,
        tls: TlsConfig | None = None,
        holder_key: bytes | None = None,
    ) -> Connection:
        """Connect and complete the handshake; ``graph_name=None`` accepts whatever is served.

        ``holder`` names the client to the server, which binds it to the connection and caps
        connections per holder (``--max-connections-per-holder``; connections without one share
        one anonymous cap). ``part_id`` / ``role``: the server must announce these (else
        ``AuthenticationError`` before anything is sent); with a ``secret`` it must also prove
        it holds it (``holder_key``: ``holder``'s own key instead of the secret, see
        ``protocol/handshake.py``). ``tls`` (default ``$ASYNCGRAPH_TLS_*``, else none): ``net/tls.py``."""
        conn = cls(
            host,
            port,
            name=f"{host}:{port}",
            max_frame_size=max_frame_size,
            max_inflight=max_inflight,
            graph_name=graph_name,
            secret=secret,
            reconnect_window=reconnect_window,
            holder=holder,
            part_id=part_id,
            role=role,
            tls=tls,
            holder_key=holder_key,
        )
        await conn._connect(timeout)
        # The server may fail the connection right after the hello (over its connection cap,
        # say): that failure, seen while CONNECTING, leaves it LOST with the server's reason.
        conn.state = ConnectionState.OPEN if conn._error is None else ConnectionState.LOST
        hello = conn.server_hello
        if hello is not None:  # a reconnect must find the same graph, partition and role
            conn.graph_name, conn.part_id, conn.role = hello.graph_name, hello.part_id, hello.role
        return conn

    def _new_session(self) -> ClientSession:
        return ClientSession(
            graph_name=self.graph_name,
            secret=self.secret,
            name=self.name,
            max_frame_size=self.max_frame_size,
            holder=self.holder,
            part_id=self.part_id,
            role=self.role,
            holder_key=self.holder_key,
        )

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
                loop.create_connection(lambda: ClientProtocol(self), self.host, self.port, ssl=self._ssl),
                timeout,
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
        if self.state is ConnectionState.OPEN or self.state is ConnectionState.CONNECTING:
            return
        if self.state is ConnectionState.CLOSED:
            raise self._unavailable()
        if self._reconnecting is None:
            self.state = ConnectionState.RECONNECTING
            self._reconnecting = asyncio.ensure_future(self._reconnect_loop())
            self._reconnecting.add_done_callback(self._reconnect_done)
        await asyncio.shield(self._reconnecting)

    def _reconnect_done(self, fut: asyncio.Future[None]) -> None:
        self._reconnecting = None
        if self.state is ConnectionState.RECONNECTING:  # failed: a later call may try again
            self.state = ConnectionState.LOST
        if not fut.cancelled():
            fut.exception()  # retrieved: each waiter got it through the shield

    async def _reconnect_loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_window
        delay = 0.05
        last: BaseException | None = None
        while self.state is ConnectionState.RECONNECTING:
            left = deadline - loop.time()
            if left <= 0:
                break
            old = self.server_hello
            self._session = self._new_session()
            self._transport = None
            try:
                await self._connect(min(left, 10.0))
                if self._session.closed:  # failed right after the hello (over a cap; died)
                    raise ServerUnavailableError(
                        f"server {self.name} closed the connection right after its hello"
                    )
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
                self.state = ConnectionState.LOST
                self._error = ServerUnavailableError(f"server {self.name} {problem}")
                self._fail(self._error)
                raise self._error
            self.state = ConnectionState.OPEN
            self._error = None
            self.generation += 1
            log.info("reconnected to server %s (generation %d)", self.name, self.generation)
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
                if not may_retry or self.reconnect_window <= 0 or self.state is ConnectionState.CLOSED:
                    raise
            await self.reconnect()
            self.retries += 1

    async def _call_once(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        if self.state is not ConnectionState.OPEN:
            raise self._unavailable()
        request_id, pieces = self._session.send_request(op, args)
        loop = self._loop or asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._inflight >= self._max_inflight or self._slot_waiters or not self._writable.is_set():
            await self._wait_for_slot(op, timeout, deadline)  # back-pressure: the slow path
            if self.state is not ConnectionState.OPEN:
                raise self._unavailable()
        # The fast path: one future and one timer handle, no context managers. The timer fails
        # the future itself, so a timeout the server reports (a barrier's) stays its own error.
        self._inflight += 1
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[request_id] = future
        timer = loop.call_at(deadline, self._expire, future, op, timeout)
        try:
            transport = self._live_transport()
            if transport is None:
                raise ServerUnavailableError(f"connection to server {self.name} is closed")
            self.writer.send(loop, transport, request_id, future, pieces)
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
        if self.state is not ConnectionState.OPEN:
            future.set_exception(self._unavailable())
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
                    if self.state is not ConnectionState.OPEN:
                        return
                await self._writable.wait()
        except TimeoutError:
            if self.state is not ConnectionState.OPEN:
                raise self._unavailable() from None
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

    @property
    def same_host(self) -> bool:
        """True when the socket never leaves this host: a loopback peer, or both ends on one
        address. Large pulls are chunked only across hosts (``client/remote.py``)."""
        transport = self._transport
        if transport is None:
            return False
        local, peer = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        if not isinstance(peer, tuple) or not isinstance(local, tuple):
            return not isinstance(peer, tuple)  # a Unix socket: this host
        try:
            return local[0] == peer[0] or ipaddress.ip_address(peer[0]).is_loopback
        except ValueError:
            return False

    @property
    def writes(self) -> int:
        """Transport writes that carried requests (handshakes not counted)."""
        return self.writer.writes

    @property
    def requests_written(self) -> int:
        """Requests those writes carried."""
        return self.writer.requests_written

    def _live_transport(self) -> asyncio.Transport | None:
        """The transport, or None when it is gone or closing (the connection fails then)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            self._lost()
            return None
        return transport

    def _lost(self) -> None:
        """The transport is closing but ``connection_lost`` has not run yet (it follows a tick
        later): fail the connection now, so pending calls fail and a retry reconnects instead of
        finding the connection still "open"."""
        if self.state is ConnectionState.OPEN:
            self._fail(ServerUnavailableError(f"connection to server {self.name} lost"))

    # --- session events -------------------------------------------------------------------
    def _on_ready(self, event: HandshakeComplete) -> None:
        self.server_hello = cast(ServerHello, event.peer_hello)
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_result(None)

    def _unavailable(self) -> AsyncGraphError:
        """A fresh error for a call that finds the connection not open."""
        error = self._error
        if error is None:
            return ServerUnavailableError(f"connection to server {self.name} is not open")
        return type(error)(str(error))

    def _fail(self, exc: AsyncGraphError) -> None:
        """The session or socket failed: OPEN becomes LOST (a reconnect attempt stays
        RECONNECTING, CLOSED stays); everything waiting fails with ``exc``."""
        if self.state is ConnectionState.OPEN:
            self.state = ConnectionState.LOST
        if self._error is None:
            self._error = exc
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(exc)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(type(exc)(str(exc)))
        self._pending.clear()
        self.writer.drop()  # their futures were failed above; never written to a later transport
        self._writable.set()
        while self._slot_waiters:  # they see the error and fail
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        if self._transport is not None:
            self._transport.close()

    @property
    def closed(self) -> bool:
        """True unless calls can go out now (OPEN, or still CONNECTING)."""
        return self.state not in (ConnectionState.OPEN, ConnectionState.CONNECTING)

    def _drop_transport(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._session.close()

    def close(self) -> None:
        """Close for good (CLOSED): pending and later calls fail, a reconnect under way stops."""
        self.state = ConnectionState.CLOSED
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._session.close()
        if self._error is None:
            self._error = ServerUnavailableError(f"connection to server {self.name} was closed by the client")
