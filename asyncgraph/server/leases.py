"""Holder leases: references of a client that vanished are dropped (issue 22, item 2).

A client handle (its ``holder`` id) takes references to the non-persistent tensors it creates;
before, only a clean ``Client.close`` dropped them, so a killed trainer's tensors stayed forever.
With ``--holder-lease S`` the server ties each holder to the connections that named it (its
hello, ``create_tensor``, ``release_tensors`` and ``barrier`` carry it): when the last one is
gone for ``S`` seconds (choose at least the clients' reconnect window) and none came back, the
holder's references are released as ``release_tensors(holder, all=True)`` would, through the same
write path. A connection that presents the holder again before then keeps the lease.

A client also names its holder in every hello (``AsyncClient`` does, reconnects included), so
each of its connections holds the lease from the handshake on and a client that only reads keeps
it across a dropped connection. A lease that expires releases through the write path, so the
release is logged like any other; the lease is off by default.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable

__all__ = ["HolderLeases"]

log = logging.getLogger("asyncgraph.server")


class HolderLeases:
    """Which connections each holder has, and the timers of holders that have none."""

    def __init__(self, window: float, release: Callable[[str], object]) -> None:
        self.window = window
        self._release = release
        self._conns: dict[str, weakref.WeakSet[object]] = {}
        self._holders_of: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.expired = 0

    def bind(self, holder: str | None, connection: object | None) -> None:
        """``holder`` was seen on ``connection``: it holds the lease (a pending expiry is cancelled)."""
        if holder is None or connection is None:
            return
        self._conns.setdefault(holder, weakref.WeakSet()).add(connection)
        self._holders_of.setdefault(connection, set()).add(holder)
        timer = self._timers.pop(holder, None)
        if timer is not None:
            timer.cancel()

    def connection_lost(self, connection: object) -> None:
        """``connection`` closed: holders left without a connection start their lease timer."""
        for holder in self._holders_of.pop(connection, set()):
            conns = self._conns.get(holder)
            if conns is not None:
                conns.discard(connection)
                if not conns and holder not in self._timers:
                    loop = asyncio.get_running_loop()
                    self._timers[holder] = loop.call_later(self.window, self._expire, holder)

    def _expire(self, holder: str) -> None:
        self._timers.pop(holder, None)
        if self._conns.get(holder):
            return  # came back meanwhile
        self._conns.pop(holder, None)
        self.expired += 1
        try:
            released = self._release(holder)
        except Exception:  # a failed release must not kill the loop; it is logged
            log.exception("releasing the references of holder %r after its lease failed", holder)
            return
        log.info(
            "holder %r: no connection for %g s, its references released (%s)", holder, self.window, released
        )

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
