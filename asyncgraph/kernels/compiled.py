"""Compiled (numba) form of the sampling kernel's hot branch: uniform, without replacement.

``sample_csc`` spends most of a small request in numpy call overhead (Floyd's algorithm is
``3 * fanout`` vector calls, plus ~40 others for offsets, repeats and gathers, each 2-5 µs on a
small machine). One compiled pass over the seeds does the same work in a few microseconds per
hundred seeds: for each seed, every in-edge when ``deg <= fanout``, else Floyd's algorithm with
a linear membership scan (``fanout <= 32``). The random stream is SplitMix64 keyed by one draw
from the caller's generator, so results stay a function of the caller's RNG state (the same
seed gives the same sample, served or standalone).

numba is an optional speed-up: without it (or with ``ASYNCGRAPH_NO_JIT=1``) ``available()`` is
False and ``sample_csc`` keeps its vectorised numpy path. Compiled code is cached on disk
(``cache=True``), so only the first process on a machine pays the ~2 s compile.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["available", "uniform_positions"]

_kernel: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
_tried = False


def _build() -> Callable[..., tuple[np.ndarray, np.ndarray]] | None:
    if os.environ.get("ASYNCGRAPH_NO_JIT", "") not in ("", "0"):
        return None
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; kept optional on purpose
        return None

    @numba.njit(cache=True, nogil=True)
    def positions(
        indptr: np.ndarray, seeds: np.ndarray, k: int, key: np.uint64
    ) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled; tested through sample_csc
        n = seeds.size
        total = 0
        for i in range(n):
            d = indptr[seeds[i] + 1] - indptr[seeds[i]]
            total += d if d < k else k
        pos = np.empty(total, np.int64)
        seg = np.empty(total, np.int64)
        state = np.uint64(key)
        golden = np.uint64(0x9E3779B97F4A7C15)
        m1 = np.uint64(0xBF58476D1CE4E5B9)
        m2 = np.uint64(0x94D049BB133111EB)
        scale = 1.0 / 9007199254740992.0  # 2**-53
        p = 0
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
            for j in range(deg - k, deg):
                state += golden
                z = state
                z = (z ^ (z >> np.uint64(30))) * m1
                z = (z ^ (z >> np.uint64(27))) * m2
                z = z ^ (z >> np.uint64(31))
                t = np.int64(float(z >> np.uint64(11)) * scale * (j + 1))
                if t > j:  # float rounding of u * (j + 1) up to j + 1
                    t = np.int64(j)
                pick = start + t
                for q in range(first, p):
                    if pos[q] == pick:
                        pick = start + j
                        break
                pos[p] = pick
                seg[p] = i
                p += 1
        return pos, seg

    result: Callable[..., tuple[np.ndarray, np.ndarray]] = positions
    return result


def available() -> bool:
    """True when the compiled kernel can be used (numba importable, not disabled)."""
    global _kernel, _tried
    if not _tried:
        _tried = True
        _kernel = _build()
    return _kernel is not None


def uniform_positions(
    indptr: np.ndarray, seeds: np.ndarray, fanout: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, seg)`` for uniform sampling without replacement, ``0 < fanout <= 32``: in-edge
    positions into ``indices``/``eids`` and the seed position of each, grouped by seed in order
    (a seed with ``deg <= fanout`` keeps all its in-edges in CSC order). Call ``available()``
    first. ``indptr`` and ``seeds`` are int64; one 63-bit draw of ``rng`` keys the stream."""
    assert _kernel is not None, "call available() first"
    key: Any = np.uint64(int(rng.integers(0, 2**63)))
    return _kernel(indptr, seeds, int(fanout), key)
