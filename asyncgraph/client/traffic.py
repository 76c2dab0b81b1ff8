"""What a trainer's requests cost: the counters the pull and sample paths fill in and the
loaders report (per batch and per epoch), with the rule that counts a request as remote."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from asyncgraph.protocol.ops import Op
from asyncgraph.service.base import Partition

__all__ = ["Traffic", "count_remote"]


@dataclass
class Traffic:
    """What requests cost: rows/bytes pulled over a socket, requests sent over a socket (pulls and
    samples), cache hits/misses.

    ``cache_hits``/``cache_misses`` count remote-owned rows looked up in a cache; ``waves`` counts
    sequential rounds that sent at least one request over a socket (filled in by the loaders).
    """

    remote_rows: int = 0
    remote_bytes: int = 0
    remote_requests: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    waves: int = 0
    pulled_into_bytes: int = 0  # host bytes written by pulls into a caller's buffer (pull_numpy(out=))

    def add(self, other: Traffic) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}

    @property
    def hit_rate(self) -> float:
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if total else 0.0


def count_remote(
    partitions: Sequence[Partition], parts: Sequence[np.ndarray], op: Op, traffic: Traffic
) -> int:
    """Count in ``traffic`` the requests of ``parts`` (positions per partition) that go over a
    socket; returns their rows."""
    rows = 0
    for part, pos in zip(partitions, parts, strict=True):
        if pos.size and not part.runs_here(op):
            rows += int(pos.size)
            traffic.remote_requests += 1
    return rows
