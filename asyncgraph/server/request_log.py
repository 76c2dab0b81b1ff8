"""The request ids of applied writes a server remembers, so a resent write is applied once."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

__all__ = ["RequestLog"]


class RequestLog:
    """Client request ids of applied non-idempotent writes, remembered for ``window`` seconds.

    A retried write whose id is here was applied before (its reply was lost): it is acknowledged
    again without being applied twice. Persisted with the WAL and the snapshot's manifest.
    """

    def __init__(self, window: float = 600.0, max_entries: int = 1 << 20) -> None:
        self.window = window
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, rid: str) -> bool:
        return rid in self._seen

    def add(self, rid: str, when: float | None = None) -> None:
        now = time.time() if when is None else when
        self._seen[rid] = now
        self._seen.move_to_end(rid)
        cutoff = time.time() - self.window
        while self._seen and (len(self._seen) > self.max_entries or next(iter(self._seen.values())) < cutoff):
            self._seen.popitem(last=False)

    def items(self) -> list[list[Any]]:
        return [[rid, t] for rid, t in self._seen.items()]

    def load(self, items: Any) -> None:
        for rid, when in items:
            self.add(str(rid), float(when))
