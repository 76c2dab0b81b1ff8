"""The writer's side of a live partition's destination index (``storage/overlay.py``): appended
edges taken into ``add_order`` and the two-level offsets ``add_block``/``add_indptr``, in place,
in compiled passes.

A node ``v``'s appended in-edges are ``add_order[start(v):start(v + 1)]`` with ``start(v) =
add_block[v >> INDEX_SHIFT] + add_indptr[v]`` (``storage.overlay.INDEX_SHIFT``): the edges to
the blocks below ``v``'s block of ``2**INDEX_SHIFT`` nodes, plus those to the nodes below ``v``
in its block. A batch of ``m`` edges then moves the offsets of the blocks it touches and one
word a block after them, not one word a node after its lowest destination (a one-level prefix
over DGL's 2^20-node graph is 4 MiB written under the write lock per batch: at 10k edges/s in
batches of 100 it was the servers' largest cost, and the co-located readers waited for it).
``merge_order`` inserts the new slots (sorted by destination, then slot) after the earlier edges
of their destinations, from the back, with no temporary array. Without numba
(``ASYNCGRAPH_NO_JIT``) ``storage/overlay.py`` takes its numpy form instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from asyncgraph.kernels.jit import disabled

__all__ = ["merge_order", "shift_offsets"]


def _jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    if disabled():
        return fn
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return fn
    compiled: Callable[..., Any] = numba.njit(cache=True, nogil=True)(fn)
    return compiled


@_jit
def merge_order(
    order: np.ndarray, first: int, at: np.ndarray, new_slots: np.ndarray
) -> None:  # pragma: no cover - compiled
    """``order[:first + m] = np.insert(order[:first], at, new_slots)``, in place (``at``
    non-decreasing; ``order`` holds at least ``first + m`` entries)."""
    i = first - 1
    j = new_slots.size - 1
    w = first + j
    while j >= 0:
        if i >= 0 and i >= at[j]:
            order[w] = order[i]
            i -= 1
        else:
            order[w] = new_slots[j]
            j -= 1
        w -= 1


@_jit
def shift_offsets(
    block: np.ndarray, within: np.ndarray, sorted_dst: np.ndarray, shift: int
) -> None:  # pragma: no cover - compiled
    """Count new edges to ``sorted_dst`` (non-decreasing) into the two-level offsets, in place:
    ``within[v]`` gains the new edges to the nodes below ``v`` in its block, ``block[b]`` those
    to the blocks below ``b``. Between two new destinations each increment is constant."""
    m = sorted_dst.size
    size = within.size
    run = 0  # new edges so far in the current block
    for j in range(m):
        d = sorted_dst[j]
        b = d >> shift
        if j == 0 or (sorted_dst[j - 1] >> shift) != b:
            run = 0
        run += 1
        hi = min((b + 1) << shift, size)
        if j + 1 < m and sorted_dst[j + 1] < hi:
            hi = sorted_dst[j + 1] + 1
        for v in range(d + 1, hi):
            within[v] += run
        hi_block = (sorted_dst[j + 1] >> shift) + 1 if j + 1 < m else block.size
        for c in range(b + 1, hi_block):
            block[c] += j + 1
