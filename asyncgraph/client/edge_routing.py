"""Which partition owns each edge ID of a live graph (issue 35): the book's ranges below the
base edge count, arithmetic above it (new edge IDs are ``E_base + p + k * P``)."""

from __future__ import annotations

import numpy as np

from asyncgraph.errors import OutOfRangeError
from asyncgraph.partition.book import RangePartitionBook, split_by_owner

__all__ = ["edge_positions"]


def edge_positions(book: RangePartitionBook, eids: np.ndarray) -> list[np.ndarray]:
    """Positions of each partition's edge IDs in ``eids``: the book's ranges below the base
    edge count, ``(eid - E_base) % P`` above it (``OutOfRangeError`` for a negative ID)."""
    base = book.num_edges
    if not eids.size or int(eids.max()) < base:
        return book.positions(eids, "edge")
    if int(eids.min()) < 0:
        raise OutOfRangeError(f"edge ID {int(eids.min())} is negative")
    parts = book.num_partitions()
    above = eids >= base
    owner = np.empty(eids.size, np.int64)
    owner[above] = (eids[above] - base) % parts
    if not above.all():
        owner[~above] = book.owner(eids[~above], "edge")
    return split_by_owner(owner, parts)
