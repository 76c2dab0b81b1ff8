"""Which partition owns each node or edge ID of a live graph (issue 35): the book's ranges
below the base counts, arithmetic above them (new IDs are ``base + p + k * P``)."""

from __future__ import annotations

import numpy as np

from asyncgraph.errors import OutOfRangeError
from asyncgraph.partition.book import RangePartitionBook, split_by_owner

__all__ = ["edge_positions", "node_positions", "owner_positions"]


def node_positions(book: RangePartitionBook, ids: np.ndarray) -> list[np.ndarray]:
    """Positions of each partition's node IDs in ``ids``: the book's ranges below the base node
    count, ``(id - N_base) % P`` above it (added nodes; their owner says whether they exist)."""
    return _positions(book, ids, "node", book.num_nodes)


def edge_positions(book: RangePartitionBook, eids: np.ndarray) -> list[np.ndarray]:
    """Positions of each partition's edge IDs in ``eids``: the book's ranges below the base
    edge count, ``(eid - E_base) % P`` above it (``OutOfRangeError`` for a negative ID)."""
    return _positions(book, eids, "edge", book.num_edges)


def owner_positions(book: RangePartitionBook, ids: np.ndarray, policy: str) -> list[np.ndarray]:
    """Positions of each partition's IDs of ``policy`` ("node" or "edge"): rows of a tensor,
    new IDs of a live graph included (their owner says whether they exist). The book's own
    split first: a pull of base rows pays nothing more."""
    try:
        return book.positions(ids, policy)
    except OutOfRangeError:
        return node_positions(book, ids) if policy == "node" else edge_positions(book, ids)


def _positions(book: RangePartitionBook, ids: np.ndarray, kind: str, base: int) -> list[np.ndarray]:
    """``book.positions`` extended past ``base`` by the strided rule of added IDs."""
    if not ids.size or int(ids.max()) < base:
        return book.positions(ids, kind)
    if int(ids.min()) < 0:
        raise OutOfRangeError(f"{kind} ID {int(ids.min())} is negative")
    parts = book.num_partitions()
    above = ids >= base
    owner = np.empty(ids.size, np.int64)
    owner[above] = (ids[above] - base) % parts
    if not above.all():
        owner[~above] = book.owner(ids[~above], kind)
    return split_by_owner(owner, parts)
