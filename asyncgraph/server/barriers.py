"""Named, reusable barriers: a server releases one when every expected client has arrived."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from asyncgraph.errors import BarrierTimeoutError

__all__ = ["Barriers"]


@dataclass
class _Barrier:
    generation: int = 0
    arrived: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)


class Barriers:
    """Named, reusable barriers released when ``num_clients`` clients have arrived."""

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self._barriers: dict[str, _Barrier] = {}

    async def wait(self, name: str, timeout: float) -> int:
        """Arrive at barrier ``name``; returns its generation once released.

        ``BarrierTimeoutError`` after ``timeout`` seconds (the arrival is withdrawn)."""
        barrier = self._barriers.setdefault(name, _Barrier())
        barrier.arrived += 1
        generation = barrier.generation
        if barrier.arrived >= self.num_clients:
            self._release(name, barrier)
            return generation
        event = barrier.released
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            if not event.is_set():
                arrived = barrier.arrived
                barrier.arrived -= 1  # withdraw, so the next attempt counts correctly
                raise BarrierTimeoutError(
                    f"barrier {name!r} timed out after {timeout:g} s: "
                    f"{arrived} of {self.num_clients} clients arrived"
                ) from None
        return generation

    def _release(self, name: str, barrier: _Barrier) -> None:
        barrier.released.set()
        self._barriers[name] = _Barrier(generation=barrier.generation + 1)
