"""One client connection to one server: handshake, multiplexed requests, futures by id.

Many requests may be in flight on a connection; responses are matched by id in any order. A
semaphore bounds the requests in flight (back-pressure: callers wait rather than queueing without
limit). When the server goes away every pending and later call fails at once with
``ServerUnavailableError`` naming the server; a server that stops answering makes calls fail at
their timeout. Nothing here knows about partitions or tensors.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

from asyncgraph.errors import (
    AsyncGraphError,
    AuthenticationError,
    FrameTooLargeError,
    ProtocolError,
    RequestTimeoutError,
    ServerUnavailableError,
    error_from_code,
)
from asyncgraph.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    ClientHello,
    ErrorResponse,
    FrameReader,
    HelloResult,
    Request,
    Response,
    ServerHello,
    compute_mac,
    decode_handshake,
    decode_message,
    encode_handshake,
    encode_message,
    frame_size,
)

#: Connection-level errors from the server carry this request id.
CONNECTION_ERROR_ID = 0


class _ClientProtocol(asyncio.BufferedProtocol):
    def __init__(self, conn: Connection, max_frame_size: int) -> None:
        self._conn = conn
        self._reader = FrameReader(max_frame_size)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._conn._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._reader.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._conn._fail(exc)
            return
        for body in frames:
            self._conn._on_frame(body)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self._conn._fail(ServerUnavailableError(f"connection to server {self._conn.name} lost{reason}"))

    def pause_writing(self) -> None:
        self._conn._writable.clear()

    def resume_writing(self) -> None:
        self._conn._writable.set()


class Connection:
    """A multiplexed, authenticated connection to one server."""

    def __init__(self, host: str, port: int, *, name: str, max_frame_size: int, max_inflight: int) -> None:
        self.host = host
        self.port = port
        self.name = name
        self.max_frame_size = max_frame_size
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._handshake: asyncio.Future[Any] | None = None
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
            host, port, name=f"{host}:{port}", max_frame_size=max_frame_size, max_inflight=max_inflight
        )
        loop = asyncio.get_running_loop()
        conn._handshake = loop.create_future()
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: _ClientProtocol(conn, max_frame_size), host, port), timeout
            )
        except (TimeoutError, OSError) as exc:
            raise ServerUnavailableError(
                f"cannot connect to server {conn.name}: {exc or 'timed out'}"
            ) from None
        try:
            hello = await asyncio.wait_for(asyncio.shield(conn._handshake), timeout)
            if not isinstance(hello, ServerHello):
                raise ProtocolError(f"server {conn.name} did not open with a hello")
            conn.server_hello = hello
            conn._handshake = loop.create_future()
            mac = compute_mac(secret, hello.nonce, hello.graph_name) if secret is not None else None
            if hello.auth_required and secret is None:
                raise AuthenticationError(f"server {conn.name} requires a shared secret and none was given")
            conn._transport.write(  # type: ignore[union-attr]
                encode_handshake(
                    ClientHello(
                        version=PROTOCOL_VERSION,
                        graph_name=graph_name if graph_name is not None else hello.graph_name,
                        mac=mac,
                    )
                )
            )
            result = await asyncio.wait_for(asyncio.shield(conn._handshake), timeout)
            if not isinstance(result, HelloResult):
                raise ProtocolError(f"server {conn.name} answered the hello with {type(result).__name__}")
            if not result.ok:
                err = error_from_code(
                    result.code, f"server {conn.name} refused the connection: {result.message}"
                )
                raise err
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
        request_id = next(self._ids)
        pieces = encode_message(Request(request_id, op, args))
        size = frame_size(pieces) - 4
        if size > self.max_frame_size:
            raise FrameTooLargeError(
                f"{op} request of {size} bytes exceeds the maximum frame size {self.max_frame_size}; "
                "split it into smaller calls"
            )
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

    # --- incoming -------------------------------------------------------------------------
    def _on_frame(self, body: memoryview) -> None:
        if self._handshake is not None:
            try:
                msg = decode_handshake(body)
            except ProtocolError as exc:
                self._fail(exc)
                return
            if not self._handshake.done():
                self._handshake.set_result(msg)
            return
        try:
            message = decode_message(body)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if isinstance(message, Request):
            self._fail(ProtocolError(f"server {self.name} sent a request"))
            return
        if isinstance(message, ErrorResponse) and message.id == CONNECTION_ERROR_ID:
            self._fail(
                error_from_code(message.code, f"server {self.name} closed the connection: {message.message}")
            )
            return
        future = self._pending.get(message.id)
        if future is None or future.done():
            return  # the caller timed out and left
        if isinstance(message, Response):
            future.set_result(message.result)
        else:
            future.set_exception(error_from_code(message.code, message.message))

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
        if self._error is None:
            self._error = ServerUnavailableError(f"connection to server {self.name} was closed by the client")
