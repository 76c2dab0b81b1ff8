"""asyncio transport for the graph server: bytes in, handlers called, frames out.

One ``ServerConnection`` per client connection, built on ``asyncio.BufferedProtocol`` so large
request bodies are received straight into their final buffer. The connection runs the
handshake, then decodes requests and calls handlers; responses are written as the header plus
the arrays' own buffers (``writelines``), never re-packed.

Back-pressure: when the transport's write buffer passes its high-water mark, or too many async
requests (barriers) are pending, the connection stops reading, so a client that floods the
server waits in its own socket buffer instead of growing the server's memory.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable
from typing import Any, cast

from asyncgraph.errors import AsyncGraphError, ProtocolError, error_code
from asyncgraph.protocol import (
    PROTOCOL_VERSION,
    ClientHello,
    ErrorResponse,
    FrameReader,
    HelloResult,
    Request,
    Response,
    ServerHello,
    check_client_hello,
    decode_handshake,
    decode_message,
    encode_handshake,
    encode_message,
    new_nonce,
)
from asyncgraph.server.handlers import RequestHandlers

log = logging.getLogger("asyncgraph.server")

#: Connection-level errors (a garbage frame, an oversized frame) are reported with this id.
CONNECTION_ERROR_ID = 0


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
        max_inflight: int = 64,
        write_high_water: int = 64 << 20,
    ) -> None:
        self._handlers = handlers
        self._graph_name = graph_name
        self._part_id = part_id
        self._secret = secret
        self._reader = FrameReader(max_frame_size)
        self._nonce = new_nonce()
        self._ready = False
        self._closed = False
        self._transport: asyncio.Transport | None = None
        self._max_inflight = max_inflight
        self._write_high_water = write_high_water
        self._inflight: set[asyncio.Task[None]] = set()
        self._write_paused = False
        self._read_paused = False
        self.peer = "?"

    # --- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = tr = cast(asyncio.Transport, transport)
        peer = tr.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        tr.set_write_buffer_limits(high=self._write_high_water)
        hello = ServerHello(
            version=PROTOCOL_VERSION,
            graph_name=self._graph_name,
            part_id=self._part_id,
            nonce=self._nonce,
            auth_required=self._secret is not None,
        )
        tr.write(encode_handshake(hello))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._reader.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._fail(exc)
            return
        for body in frames:
            if self._closed:
                return
            if self._ready:
                self._on_request_frame(body)
            else:
                self._on_handshake_frame(body)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        for task in self._inflight:
            task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    # --- frames ----------------------------------------------------------------------------
    def _on_handshake_frame(self, body: memoryview) -> None:
        try:
            hello = decode_handshake(body)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if not isinstance(hello, ClientHello):
            self._fail(ProtocolError("expected a client hello to open the connection"))
            return
        result = check_client_hello(
            hello, graph_name=self._graph_name, nonce=self._nonce, secret=self._secret
        )
        self._write_raw(encode_handshake(result))
        if result.ok:
            self._ready = True
        else:
            log.warning("handshake from %s refused: %s", self.peer, result.message)
            self._close()

    def _on_request_frame(self, body: memoryview) -> None:
        try:
            message = decode_message(body)
        except ProtocolError as exc:
            self._fail(exc)
            return
        if not isinstance(message, Request):
            self._fail(ProtocolError(f"expected a request, got {type(message).__name__}"))
            return
        self._dispatch(message)

    def _dispatch(self, request: Request) -> None:
        try:
            result = self._handlers.lookup(request.op)(request.args)
        except Exception as exc:
            self._reply_error(request.id, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._finish(request.id, result))
            self._inflight.add(task)
            task.add_done_callback(self._task_done)
            self._update_reading()
        else:
            self._reply(request.id, result)

    async def _finish(self, request_id: int, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._reply_error(request_id, exc)
        else:
            self._reply(request_id, result)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._update_reading()

    # --- replies --------------------------------------------------------------------------
    def _reply(self, request_id: int, result: Any) -> None:
        self._handlers.requests_served += 1
        try:
            pieces = encode_message(Response(request_id, result))
        except (TypeError, ValueError, OverflowError) as exc:
            self._reply_error(request_id, exc)
            return
        self._write_raw(pieces)

    def _reply_error(self, request_id: int, exc: BaseException) -> None:
        self._handlers.requests_served += 1
        if not isinstance(exc, AsyncGraphError):
            log.exception("internal error while serving request %d", request_id, exc_info=exc)
        message = str(exc) or type(exc).__name__
        self._write_raw(encode_message(ErrorResponse(request_id, error_code(exc), message)))

    def _write_raw(self, data: bytes | list[bytes | memoryview]) -> None:
        if self._closed or self._transport is None or self._transport.is_closing():
            return
        if isinstance(data, bytes):
            self._transport.write(data)
        else:
            self._transport.writelines(data)

    # --- flow control and closing ----------------------------------------------------------
    def _update_reading(self) -> None:
        if self._transport is None or self._closed:
            return
        should_pause = self._write_paused or len(self._inflight) >= self._max_inflight
        if should_pause and not self._read_paused:
            self._read_paused = True
            self._transport.pause_reading()
        elif not should_pause and self._read_paused:
            self._read_paused = False
            self._transport.resume_reading()

    def _fail(self, exc: AsyncGraphError) -> None:
        """A garbage or oversized frame: tell the client why, then drop this connection only."""
        log.warning("closing connection from %s: %s", self.peer, exc)
        if self._ready:
            self._write_raw(encode_message(ErrorResponse(CONNECTION_ERROR_ID, exc.code, str(exc))))
        else:
            self._write_raw(encode_handshake(HelloResult(ok=False, code=exc.code, message=str(exc))))
        self._close()

    def _close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()
