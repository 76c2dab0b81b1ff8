"""Bounds on connections that have not completed the handshake yet.

An unauthenticated peer costs the server a socket, a small frame buffer and a timer, nothing
more: at most ``max_pending`` such connections exist at once (a new one beyond that is closed
at once, before the server hello), and each is closed if its hello has not succeeded within
``handshake_timeout`` seconds. Authenticated connections do not count.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT", "DEFAULT_MAX_PENDING", "Admission"]

DEFAULT_HANDSHAKE_TIMEOUT = 5.0
DEFAULT_MAX_PENDING = 128

log = logging.getLogger("asyncgraph.server")


class Admission:
    """Counts pending (pre-handshake) connections of one server and arms their deadlines."""

    def __init__(
        self, *, handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT, max_pending: int = DEFAULT_MAX_PENDING
    ) -> None:
        if not handshake_timeout > 0:
            raise ValueError(f"handshake_timeout must be positive, got {handshake_timeout}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self.handshake_timeout = handshake_timeout
        self.max_pending = max_pending
        self.pending = 0
        self.refused = 0
        self.timed_out = 0

    def admit(self, peer: str, on_timeout: Callable[[], None]) -> asyncio.TimerHandle | None:
        """Count a new connection and return its handshake timer; None means close it now."""
        if self.pending >= self.max_pending:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "refusing connection from %s: %d connections are still in their handshake "
                    "(--max-pending-connections); %d refused so far",
                    peer,
                    self.pending,
                    self.refused,
                )
            return None
        self.pending += 1
        return asyncio.get_running_loop().call_later(self.handshake_timeout, on_timeout)

    def release(self, timer: asyncio.TimerHandle) -> None:
        """The connection completed its handshake or went away: stop counting it."""
        timer.cancel()
        self.pending -= 1
