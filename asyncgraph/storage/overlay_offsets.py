"""The layout of a live overlay's destination index (``storage/overlay.py``): two-level offsets.

Node ``v``'s appended in-edges are ``add_order[start(v):start(v + 1)]`` with ``start(v) =
add_block[v >> INDEX_SHIFT] + add_indptr[v]``: the edges to the blocks of ``2**INDEX_SHIFT``
nodes below ``v``'s, plus those to the nodes below ``v`` in its block. A batch then moves the
offsets of the blocks it touches and one word a block after them (``kernels/overlay_index.py``),
not one word a node above its lowest destination.
"""

from __future__ import annotations

import numpy as np

__all__ = ["INDEX_SHIFT", "blocks", "grown", "index_bytes", "split", "starts"]

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
