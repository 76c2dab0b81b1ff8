"""Named, reusable barriers that count distinct clients, not calls.

A barrier meant for ``num_clients`` clients is released when that many *different* clients have
arrived. A client is its ``holder`` (the id a client handle sends with its barrier requests)
bound to the connection it first used; a request without a holder (an older client) counts as
its connection. A second arrival of the same client in the same round is an
``InvalidRequestError`` (before: one client calling twice released a barrier meant for two); a
connection presenting another holder than its first is refused the same way, so one connection
cannot pose as several clients. An arrival whose connection goes away (its request cancelled)
or that times out is withdrawn, so the next round counts correctly.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass, field

from asyncgraph.errors import BarrierTimeoutError, InvalidRequestError

__all__ = ["Barriers"]


@dataclass
class _Barrier:
    generation: int = 0
    arrived: set[tuple[str, object]] = field(default_factory=set)
    released: asyncio.Event = field(default_factory=asyncio.Event)


class Barriers:
    """Named, reusable barriers released when ``num_clients`` distinct clients have arrived."""

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self._barriers: dict[str, _Barrier] = {}
        #: The holder each connection presented first (connections are weakly held).
        self._holder_of: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()

    def _who(self, name: str, holder: str | None, connection: object | None) -> tuple[str, object]:
        if connection is None:
            return ("holder", holder) if holder is not None else ("call", object())
        if holder is None:
            return ("connection", id(connection))
        first = self._holder_of.setdefault(connection, holder)
        if first != holder:
            raise InvalidRequestError(
                f"barrier {name!r}: this connection arrived as client {first!r} before, now as "
                f"{holder!r}; one connection is one client"
            )
        return ("holder", holder)

    def arrive(
        self, name: str, timeout: float, holder: str | None = None, connection: object | None = None
    ) -> Awaitable[int]:
        """Register an arrival now (a duplicate raises here) and return what to await: the
        barrier's generation once ``num_clients`` distinct clients have arrived."""
        who = self._who(name, holder, connection)
        barrier = self._barriers.setdefault(name, _Barrier())
        if who in barrier.arrived:
            raise InvalidRequestError(
                f"barrier {name!r}: client {who[1] if who[0] == 'holder' else 'on this connection'} "
                f"already arrived in this round (generation {barrier.generation}); each of the "
                f"{self.num_clients} clients arrives once"
            )
        barrier.arrived.add(who)
        generation = barrier.generation
        if len(barrier.arrived) >= self.num_clients:
            self._release(name, barrier)
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            done.set_result(generation)
            return done
        return self._wait(name, barrier, who, timeout)

    async def wait(self, name: str, timeout: float, holder: str | None = None) -> int:
        """``arrive`` and await the release (for callers without a connection)."""
        return await self.arrive(name, timeout, holder)

    async def _wait(self, name: str, barrier: _Barrier, who: tuple[str, object], timeout: float) -> int:
        event = barrier.released
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            if not event.is_set():
                arrived = len(barrier.arrived)
                barrier.arrived.discard(who)  # withdraw, so the next attempt counts correctly
                raise BarrierTimeoutError(
                    f"barrier {name!r} timed out after {timeout:g} s: "
                    f"{arrived} of {self.num_clients} clients arrived"
                ) from None
        except asyncio.CancelledError:
            if not event.is_set():
                barrier.arrived.discard(who)  # its connection went away: it no longer waits
            raise
        return barrier.generation

    def _release(self, name: str, barrier: _Barrier) -> None:
        barrier.released.set()
        self._barriers[name] = _Barrier(generation=barrier.generation + 1)
