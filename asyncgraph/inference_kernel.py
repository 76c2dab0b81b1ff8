"""Neighbour sums read straight from a partition's rows: the compiled kernel of direct layer-wise
inference (``asyncgraph.inference_direct``).

``neighbour_sum(out, starts, ends, indices, rows, lo)`` adds, for every destination ``i``, the
rows ``rows[s - lo]`` of its in-edges' sources ``s = indices[starts[i]:ends[i]]`` that fall in
``[lo, lo + len(rows))`` to ``out[i]``: one pass over the edges that reads each source row once
where it is stored (shared memory of a co-located partition), with no ``[edges, feats]`` gather
and no relabelling. Sources outside the range are skipped (another partition's call adds them).
``lo = 0`` with ``indices`` already made row positions (``-1`` to skip) serves pulled rows.

Compiled with numba (``BackgroundJit``: loaded on a daemon thread; ``wait_ready`` for callers
that can wait); without numba, or until it is loaded, ``neighbour_sum`` runs a numpy form
(gather + ``np.add.reduceat``) that gives the same sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from asyncgraph.kernels.jit import BackgroundJit

__all__ = ["NEIGHBOUR_SUM", "neighbour_sum", "wait_ready"]


def _build() -> Callable[..., Any] | None:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; kept optional on purpose
        return None

    @numba.njit(cache=True, nogil=True)
    def kernel(
        out: np.ndarray, starts: np.ndarray, ends: np.ndarray, indices: np.ndarray, rows: np.ndarray, lo: int
    ) -> None:  # pragma: no cover - compiled; tested against the numpy form
        hi = lo + rows.shape[0]
        d = out.shape[1]
        for i in range(out.shape[0]):
            for e in range(starts[i], ends[i]):
                s = indices[e]
                if s >= lo and s < hi:
                    r = s - lo
                    for k in range(d):
                        out[i, k] += rows[r, k]

    # compile the signatures callers use: float32 rows (writable or read-only), int64 IDs
    out = np.zeros((1, 2), dtype=np.float32)
    ptr = np.array([0], dtype=np.int64)
    idx = np.array([0], dtype=np.int64)
    rows = np.ones((1, 2), dtype=np.float32)
    kernel(out, ptr, ptr + 1, idx, rows, 0)
    rows.flags.writeable = False
    kernel(out, ptr, ptr + 1, idx, rows, 0)
    return kernel


#: The compiled kernel, loaded in the background.
NEIGHBOUR_SUM: BackgroundJit[Callable[..., Any]] = BackgroundJit("asyncgraph.inference_kernel", "_build")


def wait_ready(timeout: float) -> bool:
    """Start loading the kernel and wait up to ``timeout`` s for it."""
    return NEIGHBOUR_SUM.wait_ready(timeout)


def _numpy_sum(
    out: np.ndarray, starts: np.ndarray, ends: np.ndarray, indices: np.ndarray, rows: np.ndarray, lo: int
) -> None:
    """The kernel's sums without it: gather the in-range sources' rows, add them per destination
    (torch's ``index_add_``, many times faster than ``np.add.at``)."""
    import torch

    counts = ends - starts
    total = int(counts.sum())
    if total == 0:
        return
    # edge positions of every destination's in-edges, destination by destination
    first = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    src = indices[first + np.arange(total)]
    dst = np.repeat(np.arange(out.shape[0]), counts)
    keep = (src >= lo) & (src < lo + rows.shape[0])
    gathered = np.ascontiguousarray(rows[src[keep] - lo], dtype=out.dtype)
    torch.from_numpy(out).index_add_(0, torch.from_numpy(dst[keep]), torch.from_numpy(gathered))


def neighbour_sum(
    out: np.ndarray, starts: np.ndarray, ends: np.ndarray, indices: np.ndarray, rows: np.ndarray, lo: int
) -> None:
    """``out[i] += sum(rows[s - lo])`` over destination ``i``'s sources ``s`` in ``indices[starts[i]:
    ends[i]]`` with ``lo <= s < lo + len(rows)`` (see the module's docstring)."""
    kernel = NEIGHBOUR_SUM.kernels
    if kernel is None:
        NEIGHBOUR_SUM.ready()
    compiled = (
        kernel is not None
        and out.dtype == np.float32
        and rows.dtype == np.float32
        and rows.ndim == 2
        and rows.flags.c_contiguous
        and out.flags.c_contiguous
        and all(a.dtype == np.int64 and a.ndim == 1 for a in (starts, ends, indices))
    )
    if compiled:
        assert kernel is not None
        kernel(out, starts, ends, indices, rows, int(lo))
    else:
        _numpy_sum(out, starts, ends, indices, rows, int(lo))
