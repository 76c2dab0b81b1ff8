"""The asyncio side of one client session: received bytes go to the sans-I/O ``ClientSession``,
its events to the ``Connection`` that opened it (replies resolve the callers' futures there).

A connection that reconnected has a new session; a protocol of an older one keeps draining its
socket but tells the connection nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, cast

from asyncgraph.errors import AsyncGraphError, ServerUnavailableError, error_from_code
from asyncgraph.protocol import ClientSession, ErrorResponse, HandshakeComplete, Response

__all__ = ["ClientProtocol", "ProtocolOwner"]


class ProtocolOwner(Protocol):
    """What ``ClientProtocol`` reads and calls on its ``Connection``."""

    name: str
    _session: ClientSession
    _transport: asyncio.Transport | None
    _pending: dict[int, asyncio.Future[Any]]
    _writable: asyncio.Event

    def _on_ready(self, event: HandshakeComplete) -> None: ...

    def _fail(self, exc: AsyncGraphError) -> None: ...


class ClientProtocol(asyncio.BufferedProtocol):
    """Feeds received bytes to the session and its events to the connection."""

    def __init__(self, conn: ProtocolOwner) -> None:
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
