"""The layout of a live overlay (``storage/overlay.py``): its arrays' first room and growth, and
the two-level offsets of its destination index.

Node ``v``'s appended in-edges are ``add_order[start(v):start(v + 1)]`` with ``start(v) =
add_block[v >> INDEX_SHIFT] + add_indptr[v]``: the edges to the blocks of ``2**INDEX_SHIFT``
nodes below ``v``'s, plus those to the nodes below ``v`` in its block. A batch then moves the
offsets of the blocks it touches and one word a block after them (``kernels/overlay_index.py``),
not one word a node above its lowest destination.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "FIRST_CAPACITY",
    "INDEX_SHIFT",
    "blocks",
    "doubled",
    "first_edge_capacity",
    "grown",
    "index_bytes",
    "split",
    "starts",
]

#: Room for nodes (and, at least, appended edges) a new overlay starts with.
FIRST_CAPACITY = 1024
#: log2 of the nodes a block of the destination index covers.
INDEX_SHIFT = 8


def blocks(size: int) -> int:
    """Blocks of the index over ``size`` offsets."""
    return ((size - 1) >> INDEX_SHIFT) + 1


def index_bytes(size: int) -> int:
    """Bytes of the index over ``size`` offsets: ``add_indptr``, ``dead_deg`` and ``touched``
    per node, ``add_block`` per block."""
    return size * 17 + blocks(size) * 8


def starts(block: np.ndarray, within: np.ndarray, local: np.ndarray) -> np.ndarray:
    """``start(v)`` of every node in ``local``."""
    return np.asarray(block[local >> INDEX_SHIFT] + within[local], dtype=np.int64)


def grown(block: np.ndarray, within: np.ndarray, size: int) -> np.ndarray:
    """One-level offsets over ``size`` nodes from these over fewer: the new ones have no edges."""
    old = starts(block, within, np.arange(within.size, dtype=np.int64))
    flat = np.full(size, old[-1], np.int64)
    flat[: old.size] = old
    return flat


def split(flat: np.ndarray, block: np.ndarray, within: np.ndarray) -> None:
    """Write one-level offsets ``flat`` (``start`` of every node) into ``block`` and ``within``."""
    block[:] = flat[:: 1 << INDEX_SHIFT]
    within[:] = flat - np.repeat(block, 1 << INDEX_SHIFT)[: flat.size]


def first_edge_capacity(num_base_edges: int) -> int:
    """Room for appended edges a new overlay starts with: 1/32 of its partition's base edges, at
    least 1,024. A growth copies the arrays into new memfds and every co-located reader re-maps
    the catalog: on DGL's 2^20 graph at 10k edges/s, growing from 1,024 meant 7 growths in 13 s,
    each a 30-45 ms p99 spike of the serve process. Room not yet written is not yet memory."""
    return max(FIRST_CAPACITY, num_base_edges >> 5)


def doubled(capacity: int, need: int, first: int = FIRST_CAPACITY) -> int:
    """The capacity that holds ``need``: ``capacity`` (at least ``first``) doubled."""
    cap = max(first, capacity)
    while cap < need:
        cap *= 2
    return cap
