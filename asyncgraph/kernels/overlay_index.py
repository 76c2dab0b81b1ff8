"""The writer's side of a live partition's destination index: appended edges taken into
``add_order`` and the two-level offsets ``add_block``/``add_indptr`` (their layout:
``storage/overlay_layout.py``), in place. ``merge_order`` inserts the new slots (sorted by
destination, then slot) after the earlier edges of their destinations, from the back, with no
temporary array; ``shift_offsets`` moves the offsets of the blocks a batch touches and one word a
block after them. The compiled pair loads in the background (``INDEX``, started with the server);
until then, and without numba (``ASYNCGRAPH_NO_JIT``), ``storage/overlay.py`` uses ``np.insert``
and ``shift_offsets_numpy``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from asyncgraph.kernels.jit import BackgroundJit

__all__ = ["INDEX", "IndexKernels", "merge_order", "shift_offsets", "shift_offsets_numpy"]


def merge_order(order: np.ndarray, first: int, at: np.ndarray, new_slots: np.ndarray) -> None:
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


def shift_offsets(block: np.ndarray, within: np.ndarray, sorted_dst: np.ndarray, shift: int) -> None:
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


def shift_offsets_numpy(block: np.ndarray, within: np.ndarray, sorted_dst: np.ndarray, shift: int) -> None:
    """``shift_offsets`` in numpy (while the compiled pair loads, or without numba): the touched
    blocks' running counts as one ``[blocks, 2**shift]`` cumulative sum, then one add a block."""
    width = 1 << shift
    blocks, rank = np.unique(sorted_dst >> shift, return_inverse=True)
    counts = np.zeros((blocks.size, width + 1), np.int64)
    np.add.at(counts, (rank, (sorted_dst & (width - 1)) + 1), 1)
    rows = (blocks[:, None] << shift) + np.arange(width)  # every node of each touched block
    inside = rows < within.size
    within[rows[inside]] += np.cumsum(counts, axis=1)[:, :width][inside]
    step = np.bincount(blocks + 1, weights=counts.sum(axis=1), minlength=block.size + 1)
    block += np.cumsum(step[: block.size]).astype(np.int64)


class IndexKernels(NamedTuple):
    """``merge_order`` and ``shift_offsets``, compiled."""

    merge_order: Any
    shift_offsets: Any


def _build() -> IndexKernels | None:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    kernels = IndexKernels(
        numba.njit(cache=True, nogil=True)(merge_order),
        numba.njit(cache=True, nogil=True)(shift_offsets),
    )
    one, two = np.zeros(1, np.int64), np.zeros(2, np.int64)  # the signatures the overlay uses
    kernels.merge_order(two, 1, one, one + 1)
    kernels.shift_offsets(one.copy(), two, one, 8)
    return kernels


#: The compiled pair, loaded in the background (``INDEX.kernels`` once ``INDEX.ready()``).
INDEX: BackgroundJit[IndexKernels] = BackgroundJit("asyncgraph.kernels.overlay_index", "_build")
