"""Compiled (numba) forms of the data path's hot loops: the sampling kernel's main branch
(uniform, without replacement) and ``to_block``'s relabelling (``relabel``).

``sample_csc`` spends most of a small request in numpy call overhead (Floyd's algorithm is
``3 * fanout`` vector calls, plus ~40 others for offsets, repeats and gathers, each 2-5 µs on a
small machine). Two compiled passes over the seeds do the same work: count the seeds with more
in-edges than the fanout, then, with the uniforms numpy drew for them (``rng.random((fanout,
m))``, exactly as the numpy path draws them), take every in-edge of the small seeds and run
Floyd's algorithm for the others. The output is the numpy path's, bit for bit, so whether a
process has the compiled kernel yet never changes a sample (tested).

The compiled code loads in the background (``warm_up``): importing numba and loading the on-disk
cache (``cache=True``) takes ~1 s here, and no request waits for it: until it is ready
``ready()`` is False and the numpy path runs. The first process on a machine (no cache yet)
compiles in a child process (~5 s), since compiling in a thread would hold the GIL, and with it
the server's event loop, that long. Without numba, or with ``ASYNCGRAPH_NO_JIT=1``, it never
becomes ready.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.env import ENV_NO_JIT

__all__ = [
    "disabled",
    "ready",
    "relabel",
    "state",
    "uniform_edges",
    "uniform_positions",
    "wait_ready",
    "warm_up",
]

_Kernels = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], Callable[..., Any]]
_kernels: _Kernels | None = None
_started = False
_lock = threading.Lock()


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
    relabel(sd, sd, sd, np.full(2, -1, dtype=np.int64))  # blocks' arrays are writable
    return count_big, positions, edges, relabel


_loader_done = threading.Event()


def _marker() -> Path:
    """A file saying this source's kernels are in numba's on-disk cache (next to its index)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        numba_version = version("numba")
    except PackageNotFoundError:
        numba_version = "none"
    key = Path(__file__).read_bytes() + sys.version.encode() + numba_version.encode()
    digest = hashlib.sha256(key).hexdigest()[:16]
    return Path(__file__).parent / "__pycache__" / f"compiled-ready-{digest}"


def _prime_cache() -> None:
    """Compile into the on-disk cache in a child process, unless already done for this source.

    Compiling holds the GIL for seconds (~5 s here for every signature); in a child it costs
    this process nothing but the wait, and the in-process build then only loads the cache
    (~0.5 s). Best effort: a failed or unwritable cache leaves the in-process build to compile.
    """
    import subprocess

    marker = _marker()
    if marker.exists():
        return
    code = "from asyncgraph.kernels.compiled import _build; _build()"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=300,
            check=True,
        )


def _load() -> None:
    global _kernels
    try:
        _prime_cache()
        kernels = _build()
        with _lock:
            _kernels = kernels
        if kernels is not None:
            with contextlib.suppress(OSError):
                _marker().touch()
    finally:
        _loader_done.set()


def disabled() -> bool:
    """True when ``ASYNCGRAPH_NO_JIT`` is set (to anything but 0): the numpy path only."""
    return os.environ.get(ENV_NO_JIT, "") not in ("", "0")


def warm_up() -> None:
    """Load the compiled kernel on a daemon thread (once per process; a no-op when disabled)."""
    global _started
    with _lock:
        if _started or disabled():
            return
        _started = True
    threading.Thread(target=_load, name="asyncgraph-jit", daemon=True).start()


def ready() -> bool:
    """True once the compiled kernel is loaded; starts loading it on first call."""
    if _kernels is None:
        warm_up()
        return False
    return True


def state() -> str:
    """``"compiled"`` (loaded), ``"loading"`` (started, not done yet) or ``"numpy"`` (disabled,
    not started, or failed to load): which sampler a request gets now. Servers report it in
    ``info`` so a benchmark can wait for the steady state before timing."""
    if _kernels is not None:
        return "compiled"
    if _started and not _loader_done.is_set():
        return "loading"
    return "numpy"


def wait_ready(timeout: float) -> bool:
    """Start loading the compiled kernel and wait up to ``timeout`` s for it (benchmarks that
    measure the steady state, tests); False if it did not load (disabled, no numba, too slow)."""
    import time

    if disabled():
        return False
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() >= deadline or (_started and _loader_done.is_set()):
            return ready()
        time.sleep(0.02)
    return True


def uniform_positions(
    indptr: np.ndarray, seeds: np.ndarray, fanout: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(pos, seg)`` of uniform sampling without replacement, ``fanout > 0``, exactly as the
    numpy path computes them: in-edge positions into ``indices``/``eids`` and each one's seed
    position, grouped by seed in order. Call only when ``ready()``. int64 ``indptr``/``seeds``."""
    assert _kernels is not None, "call only when ready()"
    count_big, positions, _, _ = _kernels
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
    assert _kernels is not None, "call only when ready()"
    count_big, _, edges, _ = _kernels
    u = rng.random((fanout, int(count_big(indptr, seeds, fanout))))
    out: tuple[np.ndarray, np.ndarray, np.ndarray] = edges(
        indptr, indices, eids, seeds, global_seeds, int(fanout), u
    )
    return out


def relabel(
    src: np.ndarray, dst: np.ndarray, dst_nodes: np.ndarray, table: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """``(src_local, dst_local, new_src, dst_nodes_unique)`` of a block's edges, as
    ``block._relabel_table`` computes them (same output, one compiled pass), or None when the
    compiled kernel is not loaded or an array is not a writable, contiguous int64 one (another
    type would compile a new specialisation here). ``table``: every entry -1, longer than any
    ID; left all -1. Destinations missing from ``dst_nodes`` get -1 in ``dst_local``."""
    if _kernels is None:
        ready()
        return None
    for a in (src, dst, dst_nodes, table):
        if type(a) is not np.ndarray or a.dtype != np.int64 or a.ndim != 1:
            return None
        if not (a.flags.writeable and a.flags.c_contiguous):
            return None
    out: tuple[np.ndarray, np.ndarray, np.ndarray, bool] = _kernels[3](src, dst, dst_nodes, table)
    return out
