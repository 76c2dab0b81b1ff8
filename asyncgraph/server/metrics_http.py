"""The ``/metrics`` endpoint, served from the server's event loop with hard limits (issue 22).

``prometheus_client.start_http_server`` started one thread per connection with no timeout and no
header limit: 400 slow clients held 400 threads, 60 clients sending 6 MB of headers took the
server from 203 MB to 2.0 GB. This endpoint instead:

- binds where the server binds unless told otherwise (``--metrics-host``);
- holds at most ``max_connections`` connections (more are closed at once) and gives each
  ``timeout`` seconds to send its request, whose line and headers may take ``max_header_bytes``;
- answers ``GET /metrics`` only, one request per connection (``Connection: close``);
- with a token (``--metrics-token-file``) answers only requests carrying
  ``Authorization: Bearer <token>`` (Prometheus' ``authorization`` / ``bearer_token_file``), so
  tensor names and sizes are not shown to anyone who can reach the port.

The text is built by ``prometheus_client.generate_latest`` from the server's registry (a few
hundred microseconds for the families ``ServerMetrics`` exports).
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["DEFAULT_MAX_CONNECTIONS", "DEFAULT_MAX_HEADER_BYTES", "DEFAULT_TIMEOUT", "MetricsEndpoint"]

log = logging.getLogger("asyncgraph.server")

DEFAULT_MAX_CONNECTIONS = 16
DEFAULT_MAX_HEADER_BYTES = 8192
DEFAULT_TIMEOUT = 5.0


class MetricsEndpoint:
    """A minimal, bounded HTTP/1.1 server for one registry's ``/metrics``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        token: bytes | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.registry = registry
        self.token = token
        self.max_connections = max_connections
        self.max_header_bytes = max_header_bytes
        self.timeout = timeout
        self.open = 0
        self.refused = 0  # connections closed at once: too many open
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the bound port."""
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=self.max_header_bytes, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_connections:
            self.refused += 1
            writer.transport.abort()
            return
        self.open += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        clean = False
        try:
            status, body, ctype = await self._answer(reader)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n"
            )
            if status.startswith("401"):
                head += 'WWW-Authenticate: Bearer realm="asyncgraph"\r\n'
            writer.write(head.encode() + b"\r\n" + body)
            await asyncio.wait_for(writer.drain(), self.timeout)
            clean = True
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # slow, silent or gone: dropped below, nothing kept
        finally:
            self.open -= 1
            if task is not None:
                self._tasks.discard(task)
            if clean:
                writer.close()
            else:
                writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, bytes, str]:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
        except asyncio.LimitOverrunError:
            return "431 Request Header Fields Too Large", b"headers too large\n", "text/plain"
        except ValueError:  # StreamReader raises ValueError when the limit is passed mid-separator
            return "431 Request Header Fields Too Large", b"headers too large\n", "text/plain"
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[0] != "GET":
            return "405 Method Not Allowed", b"only GET /metrics\n", "text/plain"
        if parts[1].split("?", 1)[0] != "/metrics":
            return "404 Not Found", b"only /metrics\n", "text/plain"
        if self.token is not None:
            given = b""
            for line in lines[1:]:
                key, _, value = line.partition(":")
                if key.strip().lower() == "authorization":
                    scheme, _, cred = value.strip().partition(" ")
                    if scheme.lower() == "bearer":
                        given = cred.strip().encode("latin-1")
            if not hmac.compare_digest(given, self.token):
                return "401 Unauthorized", b"a bearer token is required\n", "text/plain"
        return "200 OK", generate_latest(self.registry), CONTENT_TYPE_LATEST
