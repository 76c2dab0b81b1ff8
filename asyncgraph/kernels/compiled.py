"""Compiled (numba) form of the server's hottest loop: the sampling kernel's main branch
(uniform, without replacement). The loaders' relabelling has its own compiled form
(``asyncgraph.dataloading.relabel_kernel``).

``sample_csc`` spends most of a small request in numpy call overhead (Floyd's algorithm is
``3 * fanout`` vector calls, plus ~40 others for offsets, repeats and gathers, each 2-5 µs on a
small machine). Two compiled passes over the seeds do the same work: count the seeds with more
in-edges than the fanout, then, with the uniforms numpy drew for them (``rng.random((fanout,
m))``, exactly as the numpy path draws them), take every in-edge of the small seeds and run
Floyd's algorithm for the others. The output is the numpy path's, bit for bit, so whether a
process has the compiled kernel yet never changes a sample (tested).

The compiled code loads in the background (``warm_up``, ``SAMPLING``: a ``BackgroundJit``,
see ``kernels.jit``): no request waits for it; until it is ready ``ready()`` is False and the
numpy path runs. Without numba, or with ``ASYNCGRAPH_NO_JIT=1``, it never becomes ready.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .jit import BackgroundJit, disabled

__all__ = [
    "SAMPLING",
    "disabled",
    "ready",
    "state",
    "uniform_edges",
    "uniform_positions",
    "wait_ready",
    "warm_up",
]

_Kernels = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]


def _build() -> _Kernels | None:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; kept optional on purpose
        return None

    @numba.njit(cache=True, nogil=True)
    def count_big(indptr: np.ndarray, seeds: np.ndarray, k: int) -> int:  # pragma: no cover
        m = 0
        for i in range(seeds.size):
            if indptr[seeds[i] + 1] - indptr[seeds[i]] > k:
                m += 1
        return m

    @numba.njit(cache=True, nogil=True)
    def positions(
        indptr: np.ndarray, seeds: np.ndarray, k: int, u: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled; tested against numpy
        n = seeds.size
        total = 0
        for i in range(n):
            d = indptr[seeds[i] + 1] - indptr[seeds[i]]
            total += d if d < k else k
        pos = np.empty(total, np.int64)
        seg = np.empty(total, np.int64)
        p = 0
        r = 0  # column of ``u``: the r-th seed with more in-edges than k
        for i in range(n):
            start = indptr[seeds[i]]
            deg = indptr[seeds[i] + 1] - start
            if deg <= k:
                for j in range(deg):
                    pos[p] = start + j
                    seg[p] = i
                    p += 1
                continue
            first = p
            for step in range(k):
                top = deg - k + step  # Floyd's j
                t = np.int64(u[step, r] * (top + 1))
                if t > top:  # the float rounding of u * (j + 1) up to j + 1
                    t = top
                pick = start + t
                for q in range(first, p):
                    if pos[q] == pick:
                        pick = start + top
                        break
                pos[p] = pick
                seg[p] = i
                p += 1
            r += 1
        return pos, seg

    @numba.njit(cache=True, nogil=True)
    def edges(
        indptr: np.ndarray,
        indices: np.ndarray,
        eids: np.ndarray,
        seeds: np.ndarray,
        global_seeds: np.ndarray,
        k: int,
        u: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled; tested against numpy
        # ``positions`` with the gathers in the same call: (indices[pos], global_seeds[seg],
        # eids[pos]). Picks first (``src`` holds positions), then one tight gather loop: the
        # reads of ``indices``/``eids`` are cache misses, and a short loop body lets the CPU
        # keep many of them in flight (~30% faster than reading them inside Floyd's loop).
        n = seeds.size
        total = 0
        for i in range(n):
            d = indptr[seeds[i] + 1] - indptr[seeds[i]]
            total += d if d < k else k
        src = np.empty(total, np.int64)
        dst = np.empty(total, np.int64)
        eid = np.empty(total, np.int64)
        picked = np.empty(k, np.int64)
        p = 0
        r = 0
        for i in range(n):
            start = indptr[seeds[i]]
            deg = indptr[seeds[i] + 1] - start
            g = global_seeds[i]
            if deg <= k:
                for j in range(deg):
                    src[p] = start + j
                    dst[p] = g
                    p += 1
                continue
            for step in range(k):
                top = deg - k + step
                t = np.int64(u[step, r] * (top + 1))
                if t > top:
                    t = top
                pick = start + t
                for q in range(step):
                    if picked[q] == pick:
                        pick = start + top
                        break
                picked[step] = pick
                src[p] = pick
                dst[p] = g
                p += 1
            r += 1
        for q in range(total):
            e = src[q]
            src[q] = indices[e]
            eid[q] = eids[e]
        return src, dst, eid

    # Compile (or load from the on-disk cache) now, off the request path: for writable structure
    # arrays (standalone stores) and read-only ones (servers and attached stores map theirs
    # read-only), which numba types apart; a signature first seen by a request would compile
    # there, holding the event loop for a second or two.
    sd = np.array([0, 1], dtype=np.int64)
    u = np.zeros((1, 1))
    for writable in (True, False):
        ip, ind = np.array([0, 3, 4], dtype=np.int64), np.arange(4, dtype=np.int64)
        ip.flags.writeable = ind.flags.writeable = writable
        count_big(ip, sd, 1)
        positions(ip, sd, 1, u)
        edges(ip, ind, ind, sd, sd, 1, u)
    return count_big, positions, edges


#: The sampling kernels, loaded in the background (``warm_up``).
SAMPLING: BackgroundJit[_Kernels] = BackgroundJit("asyncgraph.kernels.compiled", "_build")


def warm_up() -> None:
    """Load the compiled sampling kernels on a daemon thread (once per process; a no-op when
    disabled): a server calls it at start-up."""
    SAMPLING.warm_up()


def ready() -> bool:
    """True once the compiled sampling kernels are loaded; starts loading them on first call."""
    return SAMPLING.ready()


def state() -> str:
    """``"compiled"`` (loaded), ``"loading"`` or ``"numpy"``: which sampler a request gets now.
    Servers report it in ``info`` so a benchmark can wait for the steady state before timing."""
    return SAMPLING.state()


def wait_ready(timeout: float) -> bool:
    """Start loading the compiled sampling kernels and wait up to ``timeout`` s for them."""
    return SAMPLING.wait_ready(timeout)


def uniform_positions(
    indptr: np.ndarray, seeds: np.ndarray, fanout: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, seg)`` of uniform sampling without replacement, ``fanout > 0``, exactly as the
    numpy path computes them: in-edge positions into ``indices``/``eids`` and each one's seed
    position, grouped by seed in order. Call only when ``ready()``. int64 ``indptr``/``seeds``."""
    kernels = SAMPLING.kernels
    assert kernels is not None, "call only when ready()"
    count_big, positions, _ = kernels
    u = rng.random((fanout, int(count_big(indptr, seeds, fanout))))
    out: tuple[np.ndarray, np.ndarray] = positions(indptr, seeds, int(fanout), u)
    return out


def uniform_edges(
    indptr: np.ndarray,
    indices: np.ndarray,
    eids: np.ndarray,
    seeds: np.ndarray,
    global_seeds: np.ndarray,
    fanout: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indices[pos], global_seeds[seg], eids[pos])`` for ``uniform_positions``'s ``(pos, seg)``,
    gathered in the same compiled pass (no position arrays, no numpy gathers). Every array
    int64 (others would compile a new specialisation on the request path); call only when
    ``ready()``."""
    kernels = SAMPLING.kernels
    assert kernels is not None, "call only when ready()"
    count_big, _, edges = kernels
    u = rng.random((fanout, int(count_big(indptr, seeds, fanout))))
    out: tuple[np.ndarray, np.ndarray, np.ndarray] = edges(
        indptr, indices, eids, seeds, global_seeds, int(fanout), u
    )
    return out
