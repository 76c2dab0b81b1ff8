"""One client connection to one server: asyncio glue around a ``ClientSession``.

The session decides everything about the protocol (handshake, request ids, which frames end
the connection); this module owns the socket, the futures and the timeouts. Many requests may
be in flight on a connection; responses are matched by id in any order. A semaphore bounds the
requests in flight (back-pressure: callers wait rather than queueing without limit). When the
server goes away every pending and later call fails at once with ``ServerUnavailableError``
naming the server; a server that stops answering makes calls fail at their timeout. Nothing
here knows about partitions or tensors.
"""

from __future__ import annotations

import asyncio
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
    ConnectionFailed,
    ErrorResponse,
    HandshakeComplete,
    Response,
    ServerHello,
)

__all__ = ["CONNECTION_ERROR_ID", "Connection"]


class _ClientProtocol(asyncio.BufferedProtocol):
    """Feeds received bytes to the session and its events to the connection."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._session = conn._session

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._conn._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._session.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        conn = self._conn
        pending = conn._pending
        for event in self._session.buffer_updated(nbytes):
            kind = type(event)
            if kind is Response:
                future = pending.get(event.id)  # type: ignore[union-attr]
                if future is not None and not future.done():  # else the caller timed out and left
                    future.set_result(event.result)  # type: ignore[union-attr]
            elif kind is ErrorResponse:
                future = pending.get(event.id)  # type: ignore[union-attr]
                if future is not None and not future.done():
                    future.set_exception(error_from_code(event.code, event.message))  # type: ignore[union-attr]
            elif kind is HandshakeComplete:
                conn._on_ready(event)  # type: ignore[arg-type]
            else:
                conn._fail(cast(ConnectionFailed, event).error)
        out = self._session.data_to_send()
        if out and conn._transport is not None and not conn._transport.is_closing():
            conn._transport.writelines(out)  # the client hello

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._session.close()
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
    ) -> None:
        self.host = host
        self.port = port
        self.name = name
        self.max_frame_size = max_frame_size
        self._session = ClientSession(
            graph_name=graph_name, secret=secret, name=name, max_frame_size=max_frame_size
        )
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._handshake: asyncio.Future[None] | None = None
        self._error: AsyncGraphError | None = None
        self._slots = asyncio.Semaphore(max_inflight)
        self._writable = asyncio.Event()
        self._writable.set()
        self.server_hello: ServerHello | None = None

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
        )
        loop = asyncio.get_running_loop()
        conn._handshake = loop.create_future()
        # The handshake's failure is raised to our caller below, except when we stopped waiting
        # first (timeout, cancellation): mark it retrieved so asyncio does not also print
        # "Future exception was never retrieved" for an error the caller already has.
        conn._handshake.add_done_callback(_retrieve)
        try:
            await asyncio.wait_for(loop.create_connection(lambda: _ClientProtocol(conn), host, port), timeout)
        except (TimeoutError, OSError) as exc:
            raise ServerUnavailableError(
                f"cannot connect to server {conn.name}: {exc or 'timed out'}"
            ) from None
        try:
            await asyncio.wait_for(asyncio.shield(conn._handshake), timeout)
        except TimeoutError:
            conn.close()
            raise ServerUnavailableError(
                f"handshake with server {conn.name} timed out after {timeout} s"
            ) from None
        except BaseException:
            conn.close()
            raise
        conn._handshake = None
        return conn

    # --- calls ----------------------------------------------------------------------------
    async def call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        """Send one request and wait for its result; raises the server's typed error."""
        if self._error is not None:
            raise type(self._error)(str(self._error))
        request_id, pieces = self._session.send_request(op, args)
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline, self._slots:
                if self._error is not None:
                    raise type(self._error)(str(self._error))
                await self._writable.wait()
                future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._pending[request_id] = future
                try:
                    self._write(pieces)
                    return await future
                finally:
                    self._pending.pop(request_id, None)
        except TimeoutError:
            if not deadline.expired():
                raise  # a timeout the server reported (e.g. a barrier's), not ours
            if self._error is not None:
                raise type(self._error)(str(self._error)) from None
            raise RequestTimeoutError(f"{op} on server {self.name} timed out after {timeout:g} s") from None

    def _write(self, pieces: list[bytes | memoryview]) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ServerUnavailableError(f"connection to server {self.name} is closed")
        self._transport.writelines(pieces)

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
        self._writable.set()
        if self._transport is not None:
            self._transport.close()

    @property
    def closed(self) -> bool:
        return self._error is not None

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._session.close()
        if self._error is None:
            self._error = ServerUnavailableError(f"connection to server {self.name} was closed by the client")
