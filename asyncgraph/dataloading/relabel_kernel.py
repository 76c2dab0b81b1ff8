"""The compiled (numba) form of ``to_block``'s relabelling: trainer-side, so it lives with the
loaders (the server's compiled kernels are ``asyncgraph.kernels.compiled``).

``relabel`` gives ``block._relabel_table``'s output in one compiled pass (~5x faster) once the
kernel is loaded, and None until then (the numpy path runs). It loads in the background
(``RELABEL``, a ``BackgroundJit``) from the first call on, or from ``warm_up``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from asyncgraph.kernels.jit import BackgroundJit

__all__ = ["RELABEL", "relabel", "wait_batch_kernels", "wait_ready", "warm_up"]


def _build() -> Callable[..., Any] | None:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; kept optional on purpose
        return None

    @numba.njit(cache=True, nogil=True)
    def relabel(
        src: np.ndarray, dst: np.ndarray, dst_nodes: np.ndarray, table: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:  # pragma: no cover - compiled; tested against numpy
        # ``block._relabel_table`` in one pass over the edges: destinations get their position
        # in dst_nodes, sources that are not destinations num_dst + their rank of first
        # appearance; ``table`` (every entry -1, longer than any ID) is left all -1 again.
        nd = dst_nodes.size
        for i in range(nd):
            table[dst_nodes[i]] = i
        unique = True
        for i in range(nd):
            if table[dst_nodes[i]] != i:
                unique = False
        dst_local = np.empty(dst.size, np.int64)
        for e in range(dst.size):
            dst_local[e] = table[dst[e]]
        src_local = np.empty(src.size, np.int64)
        new_src = np.empty(src.size, np.int64)
        k = 0
        for e in range(src.size):
            v = table[src[e]]
            if v < 0:
                v = nd + k
                table[src[e]] = v
                new_src[k] = src[e]
                k += 1
            src_local[e] = v
        for i in range(nd):
            table[dst_nodes[i]] = -1
        for i in range(k):
            table[new_src[i]] = -1
        return src_local, dst_local, new_src[:k].copy(), unique

    sd = np.array([0, 1], dtype=np.int64)
    relabel(sd, sd, sd, np.full(2, -1, dtype=np.int64))  # compiled now: blocks' arrays are writable
    return relabel


#: The relabelling kernel, loaded in the background.
RELABEL: BackgroundJit[Callable[..., Any]] = BackgroundJit("asyncgraph.dataloading.relabel_kernel", "_build")


def warm_up() -> None:
    """Start loading the kernel on a daemon thread (once per process)."""
    RELABEL.warm_up()


def wait_ready(timeout: float) -> bool:
    """Start loading the kernel and wait up to ``timeout`` s for it (benchmarks, tests)."""
    return RELABEL.wait_ready(timeout)


def wait_batch_kernels(timeout: float) -> None:
    """Wait up to ``timeout`` s each for every compiled kernel a batch needs (relabelling,
    gather, sampling), so none compiles beside the first batches (loader workers, serving)."""
    from asyncgraph.kernels import gather
    from asyncgraph.kernels.compiled import wait_ready as sampling_ready

    for ready in (wait_ready, gather.GATHER.wait_ready, sampling_ready):
        ready(timeout)


def relabel(
    src: np.ndarray, dst: np.ndarray, dst_nodes: np.ndarray, table: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """``(src_local, dst_local, new_src, dst_nodes_unique)`` of a block's edges, as
    ``block._relabel_table`` computes them (same output, one compiled pass), or None when the
    compiled kernel is not loaded or an array is not a writable, contiguous int64 one (another
    type would compile a new specialisation here). ``table``: every entry -1, longer than any
    ID; left all -1. Destinations missing from ``dst_nodes`` get -1 in ``dst_local``."""
    kernel = RELABEL.kernels
    if kernel is None:
        RELABEL.ready()
        return None
    for a in (src, dst, dst_nodes, table):
        if type(a) is not np.ndarray or a.dtype != np.int64 or a.ndim != 1:
            return None
        if not (a.flags.writeable and a.flags.c_contiguous):
            return None
    out: tuple[np.ndarray, np.ndarray, np.ndarray, bool] = kernel(src, dst, dst_nodes, table)
    return out
