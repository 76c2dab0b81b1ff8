"""Named, reusable barriers that count distinct clients, not calls.

A barrier meant for ``num_clients`` clients is released when that many *different* clients have
arrived. A client is its ``holder`` (the id a client handle sends with its barrier requests)
bound to the connection it first used; a request without a holder (an older client) counts as
its connection. A second arrival of the same client in the same round is an
``InvalidRequestError`` (before: one client calling twice released a barrier meant for two); a
connection presenting another holder than its first is refused the same way, so one connection
cannot pose as several clients. An arrival whose connection goes away (its request cancelled)
or that times out is withdrawn, so the next round counts correctly.

Bounded (issue 32): a waiting arrival holds ``ARRIVAL_BYTES`` plus its names against the
server's memory budget (``room`` refuses one past it) until it is released, times out or goes;
a barrier nobody waits at any more is forgotten (300 timed-out barriers were kept before).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from asyncgraph.errors import BarrierTimeoutError, InvalidRequestError

__all__ = ["ARRIVAL_BYTES", "Barriers"]

#: What one waiting arrival holds in a server besides its names (its request, task and timer).
ARRIVAL_BYTES = 2048


@dataclass
class _Barrier:
    generation: int = 0
    arrived: set[tuple[str, object]] = field(default_factory=set)
    released: asyncio.Event = field(default_factory=asyncio.Event)


class Barriers:
    """Named, reusable barriers released when ``num_clients`` distinct clients have arrived."""

    def __init__(self, num_clients: int, room: Callable[[int], None] | None = None) -> None:
        """``room(bytes)`` raises when a waiting arrival of that size does not fit the budget."""
        self.num_clients = num_clients
        self.room = room
        #: Bytes the waiting arrivals hold (counted against the server's memory budget).
        self.held_bytes = 0
        self._rounds = 0  # rounds begun, all names together: each round's number (its generation)
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
        barrier = self._barriers.get(name)
        if barrier is None:
            self._rounds += 1
            barrier = self._barriers[name] = _Barrier(generation=self._rounds)
        if who in barrier.arrived:
            raise InvalidRequestError(
                f"barrier {name!r}: client {who[1] if who[0] == 'holder' else 'on this connection'} "
                f"already arrived in this round (generation {barrier.generation}); each of the "
                f"{self.num_clients} clients arrives once"
            )
        generation = barrier.generation
        if len(barrier.arrived) + 1 >= self.num_clients:
            barrier.arrived.add(who)
            self._release(name, barrier)
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            done.set_result(generation)
            return done
        cost = ARRIVAL_BYTES + len(name.encode()) + len((holder or "").encode())
        if self.room is not None:
            try:
                self.room(cost)
            except BaseException:
                self._forget(name, barrier)
                raise
        barrier.arrived.add(who)
        self.held_bytes += cost
        return self._wait(name, barrier, who, timeout, cost)

    async def wait(self, name: str, timeout: float, holder: str | None = None) -> int:
        """``arrive`` and await the release (for callers without a connection)."""
        return await self.arrive(name, timeout, holder)

    async def _wait(self, name: str, barrier: _Barrier, who: tuple[str, object], timeout: float,
                    cost: int) -> int:  # fmt: skip
        event = barrier.released
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            if not event.is_set():
                arrived = len(barrier.arrived)
                barrier.arrived.discard(who)  # withdraw, so the next attempt counts correctly
                self._forget(name, barrier)
                raise BarrierTimeoutError(
                    f"barrier {name!r} timed out after {timeout:g} s: "
                    f"{arrived} of {self.num_clients} clients arrived"
                ) from None
        except asyncio.CancelledError:
            if not event.is_set():
                barrier.arrived.discard(who)  # its connection went away: it no longer waits
                self._forget(name, barrier)
            raise
        finally:
            self.held_bytes -= cost
        return barrier.generation

    def _forget(self, name: str, barrier: _Barrier) -> None:
        """Drop a barrier nobody waits at (its next arrival starts a new one)."""
        if not barrier.arrived and self._barriers.get(name) is barrier:
            del self._barriers[name]

    def _release(self, name: str, barrier: _Barrier) -> None:
        barrier.released.set()
        self._barriers.pop(name, None)  # the next round starts afresh; nothing kept per name
