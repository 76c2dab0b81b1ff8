"""A TCP proxy for fault tests: sits between a client and one real server and breaks things on demand.

The idea is asyncpg's ``TCPFuzzingProxy``: instead of killing processes or sleeping, a test
tells the proxy to black-hole traffic (both directions stop, nothing is lost, ``restore``
delivers it), to cut every connection (now, or a given number of bytes into the next
server->client frame, so a reply is torn mid-frame), or to stop or slow reading from the
server (a client that does not read its replies). It follows the length-prefixed framing of
the server's stream so "mid-frame" is exact. Everything runs on the test's own event loop.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, cast

_PREFIX = struct.Struct(">I")


class _Side(asyncio.Protocol):
    """One socket of a link: the client's (``downstream``) or the server's (``upstream``)."""

    def __init__(self, link: _Link, upstream: bool) -> None:
        self.link = link
        self.upstream = upstream
        self.transport: asyncio.Transport | None = None
        self.write_paused = False  # our write buffer towards this socket is full
        self.reading = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=256 << 10)
        if not self.upstream:
            self.link.on_client(self)

    def data_received(self, data: bytes) -> None:
        if self.upstream:
            self.link.from_server(data)
        else:
            self.link.from_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.close()

    def pause_writing(self) -> None:
        self.write_paused = True
        self.link.update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.link.update_reading()

    def set_reading(self, on: bool) -> None:
        if self.transport is None or self.transport.is_closing() or on == self.reading:
            return
        self.reading = on
        if on:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()


class _Link:
    """One proxied connection: forwards bytes both ways and applies the proxy's faults."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.client: _Side | None = None
        self.server: _Side | None = None
        self.held: list[tuple[bool, bytes]] = []  # (to_server, data) while black-holed
        self.to_server_bytes = 0  # bytes handed to the server-side transport
        self.to_client_bytes = 0
        self.prefix = bytearray()  # server->client frame tracking
        self.frame_total: int | None = None
        self.frame_pos = 0
        self.throttle_until = 0.0
        self.closed = False

    def on_client(self, side: _Side) -> None:
        self.client = side
        side.set_reading(False)  # until the server side is connected
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await loop.create_connection(lambda: _Side(self, True), *self.proxy.target)
        except OSError:
            self.close()
            return
        self.server = proto
        self.update_reading()

    @property
    def server_accepted(self) -> int:
        """Client->server bytes the server's socket has taken (no longer queued in the proxy)."""
        if self.server is None or self.server.transport is None:
            return self.to_server_bytes
        return self.to_server_bytes - self.server.transport.get_write_buffer_size()

    @property
    def pending_to_server(self) -> int:
        """Client->server bytes still queued in the proxy, waiting for the server to read."""
        return self.to_server_bytes - self.server_accepted

    def update_reading(self) -> None:
        if self.closed or self.client is None or self.server is None:
            return
        proxy = self.proxy
        loop = asyncio.get_running_loop()
        self.client.set_reading(not proxy.black_holed and not self.server.write_paused)
        server_ok = not (proxy.black_holed or proxy.server_reads_paused or self.client.write_paused)
        self.server.set_reading(server_ok and loop.time() >= self.throttle_until)

    def from_client(self, data: bytes) -> None:
        if self.proxy.black_holed:
            self.held.append((True, data))
            return
        self._write(True, data)

    def from_server(self, data: bytes) -> None:
        if self.proxy.black_holed:
            self.held.append((False, data))
            return
        cut = self._cut_point(data)
        if cut is not None:
            self._write(False, data[:cut])
            self.proxy.cuts += 1
            self.close(graceful_client=True)
            return
        self._write(False, data)
        rate = self.proxy.throttle_bytes_per_s
        if rate:
            loop = asyncio.get_running_loop()
            self.throttle_until = loop.time() + len(data) / rate
            assert self.server is not None
            self.server.set_reading(False)
            loop.call_at(self.throttle_until, self.update_reading)

    def _cut_point(self, data: bytes) -> int | None:
        """Track frames; the offset in ``data`` where an armed mid-frame cut falls, if it does."""
        armed = self.proxy.cut_after
        pos = 0
        while pos < len(data):
            if self.frame_total is None:
                step = min(_PREFIX.size - len(self.prefix), len(data) - pos)
                self.prefix += data[pos : pos + step]
                if len(self.prefix) == _PREFIX.size:
                    self.frame_total = _PREFIX.size + _PREFIX.unpack(bytes(self.prefix))[0]
            else:
                step = min(self.frame_total - self.frame_pos, len(data) - pos)
            longer = self.frame_total is None or self.frame_total > (armed or 0)
            if armed is not None and longer and self.frame_pos < armed <= self.frame_pos + step:
                return pos + armed - self.frame_pos
            self.frame_pos += step
            pos += step
            if self.frame_total is not None and self.frame_pos == self.frame_total:
                self.prefix.clear()
                self.frame_total = None
                self.frame_pos = 0
        return None

    def _write(self, to_server: bool, data: bytes) -> None:
        side = self.server if to_server else self.client
        if side is None or side.transport is None or side.transport.is_closing():
            return
        side.transport.write(data)
        if to_server:
            self.to_server_bytes += len(data)
        else:
            self.to_client_bytes += len(data)

    def flush_held(self) -> None:
        held, self.held = self.held, []
        for to_server, data in held:
            (self.from_client if to_server else self.from_server)(data)

    def close(self, graceful_client: bool = False) -> None:
        """Cut the link: the client gets what was already written, then EOF; the server a reset."""
        if self.closed:
            return
        self.closed = True
        self.proxy.links.discard(self)
        if self.client is not None and self.client.transport is not None:
            if graceful_client:
                self.client.transport.close()
            else:
                self.client.transport.abort()
        if self.server is not None and self.server.transport is not None:
            self.server.transport.abort()


class FaultProxy:
    """Listens on 127.0.0.1:0 and forwards every accepted connection to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.links: set[_Link] = set()
        self.black_holed = False
        self.server_reads_paused = False
        self.throttle_bytes_per_s = 0.0
        self.cut_after: int | None = None
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    async def start(self) -> FaultProxy:
        def accept() -> _Side:
            link = _Link(self)
            self.links.add(link)
            return _Side(link, False)

        self._server = await asyncio.get_running_loop().create_server(accept, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (str(host), int(port))
        return self

    async def close(self) -> None:
        for link in list(self.links):
            link.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _update(self) -> None:
        for link in list(self.links):
            link.update_reading()

    # --- faults ---------------------------------------------------------------------------
    def black_hole(self) -> None:
        """Stop forwarding in both directions; bytes already read are held, not dropped."""
        self.black_holed = True
        self._update()

    def restore(self) -> None:
        """Undo ``black_hole``: deliver what was held and forward again."""
        self.black_holed = False
        for link in list(self.links):
            link.flush_held()
        self._update()

    def cut(self, after: int | None = None) -> None:
        """Cut every connection now, or (``after``) once that many bytes of a server->client
        frame longer than ``after`` have been forwarded: the client sees a torn frame, then EOF."""
        if after is None:
            for link in list(self.links):
                self.cuts += 1
                link.close()
        else:
            self.cut_after = after

    def pause_server_reads(self) -> None:
        """Stop reading from the server (as a client that stops reading its replies would)."""
        self.server_reads_paused = True
        self._update()

    def resume_server_reads(self) -> None:
        self.server_reads_paused = False
        self._update()

    def throttle(self, bytes_per_s: float) -> None:
        """Read from the server at about this rate (0: no limit)."""
        self.throttle_bytes_per_s = bytes_per_s
        self._update()

    @property
    def pending_to_server(self) -> int:
        """Client->server bytes queued in the proxy because the server is not reading them."""
        return sum(link.pending_to_server for link in self.links)

    @property
    def server_accepted(self) -> int:
        """Client->server bytes the server's sockets have taken, over all live connections."""
        return sum(link.server_accepted for link in self.links)
