"""Opening a connection to a server that may not be up yet: retried with jittered backoff.

Trainers start before or beside their servers, and a replica before its primary answers, so
both the client and the server (a replica's link to its primary) open connections this way.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from asyncgraph.errors import ServersMissingError, ServerUnavailableError

from .connection import Connection
from .tls import TlsConfig

__all__ = ["ATTEMPT_TIMEOUT", "MAX_BACKOFF", "open_retrying"]

log = logging.getLogger("asyncgraph.client")

#: Longest pause between two connection attempts to one server (the first is 50 ms).
MAX_BACKOFF = 2.0
#: Longest single attempt (connect + handshake) within the overall deadline.
ATTEMPT_TIMEOUT = 10.0


async def open_retrying(
    part_id: int,
    host: str,
    port: int,
    deadline: float,
    *,
    graph_name: str | None,
    secret: bytes | None,
    max_frame_size: int,
    max_inflight: int,
    reconnect_window: float = 0.0,
    holder: str | None = None,
    tls: TlsConfig | None = None,
    holder_key: bytes | None = None,
) -> Connection:
    """Connect to one server, retrying refused or lost connections with jittered exponential
    backoff until ``deadline`` (``time.monotonic()``), since servers may start after trainers.

    Authentication and version failures are final and raised at once; running out of time
    raises ``ServersMissingError`` naming this server and its last error.
    """
    delay = 0.05
    attempts = 0
    while True:
        attempts += 1
        remaining = deadline - time.monotonic()
        try:
            return await Connection.open(
                host,
                port,
                graph_name=graph_name,
                secret=secret,
                timeout=max(0.05, min(ATTEMPT_TIMEOUT, remaining)),
                max_frame_size=max_frame_size,
                max_inflight=max_inflight,
                reconnect_window=reconnect_window,
                holder=holder,
                part_id=part_id,
                tls=tls,
                holder_key=holder_key,
            )
        except ServerUnavailableError as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServersMissingError(
                    f"server {host}:{port} (partition {part_id}) unreachable after "
                    f"{attempts} attempts: {exc}",
                    [(part_id, f"{host}:{port}", str(exc))],
                ) from None
            if attempts == 1:
                log.info("server %s:%d not up yet (%s); retrying", host, port, exc)
            await asyncio.sleep(min(remaining, random.uniform(0.5 * delay, delay)))
            delay = min(MAX_BACKOFF, delay * 2)
