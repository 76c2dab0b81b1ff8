"""Row gathers straight into a caller's buffer: ``out[where[i]] = rows[local[i]]`` in one copy.

numpy can gather into a buffer (``np.take(..., out=)``) only in order, and a scatter to chosen
positions (``out[where] = rows.take(local)``) copies every row twice (a temporary, then the
scatter). A data loader's feature rows must land at the input node's position in a staging
buffer that several partitions fill, so ``gather_into`` copies each row once: with the compiled
kernel (numba, ``nogil``, loaded in the background like the sampling kernels) when it is ready,
else in order with ``np.take(out=)`` where that is possible, else numpy's two copies. It returns
the host bytes it wrote, so a loader can count them (``LoaderStats.host_copy_bytes``).

``set_gather_threads(n)`` splits large gathers into ``n`` chunks run at once on a small thread
pool (the compiled kernel releases the GIL): a loader worker gathering a large batch from the
co-located partitions uses the cores it was given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from asyncgraph.kernels.jit import BackgroundJit

__all__ = ["GATHER", "gather_into", "gather_threads", "set_gather_threads"]

#: Below this many bytes a gather runs in one piece (threads cost more than they save).
PARALLEL_MIN_BYTES = 4 << 20


def _build() -> Callable[..., Any] | None:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; kept optional on purpose
        return None

    @numba.njit(cache=True, nogil=True)
    def gather_rows(
        src: np.ndarray, local: np.ndarray, dst: np.ndarray, where: np.ndarray
    ) -> None:  # pragma: no cover - compiled; tested against numpy
        width = src.shape[1]
        for i in range(local.size):
            s = local[i]
            d = where[i]
            for j in range(width):
                dst[d, j] = src[s, j]

    ix = np.array([1, 0], dtype=np.int64)
    for word in (np.uint64, np.uint32, np.uint16, np.uint8):  # every row width's specialisation
        a = np.zeros((2, 8), dtype=word)
        gather_rows(a, ix, a.copy(), ix)
        a.flags.writeable = False  # rows served read-only from partition files (issue 34)
        gather_rows(a, ix, a.copy(), ix)
    return gather_rows


#: The gather kernel, loaded in the background.
GATHER: BackgroundJit[Callable[..., Any]] = BackgroundJit("asyncgraph.kernels.gather", "_build")

_threads = 1
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def set_gather_threads(threads: int) -> None:
    """Split gathers over ``threads`` threads from now on (1: run them on the caller's thread)."""
    global _threads, _pool
    if threads < 1:
        raise ValueError(f"gather threads must be at least 1, got {threads}")
    with _pool_lock:
        _threads = int(threads)
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None


def gather_threads() -> int:
    """The number of threads a large gather is split over."""
    return _threads


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_threads, thread_name_prefix="asyncgraph-gather")
        return _pool


def _as_words2d(a: np.ndarray, word: np.dtype[Any]) -> np.ndarray | None:
    """``a`` as a C-contiguous ``word[rows, row_bytes / word size]`` view, or None if it is not one
    (the widest word dividing the row moves the row in the fewest, vectorised, steps)."""
    if not a.flags.c_contiguous or a.ndim == 0 or a.shape[0] == 0:
        return None
    return a.reshape(a.shape[0], -1).view(np.uint8).view(word)


def _word(row_bytes: int) -> np.dtype[Any]:
    for dtype in (np.uint64, np.uint32, np.uint16):
        if row_bytes % np.dtype(dtype).itemsize == 0:
            return np.dtype(dtype)
    return np.dtype(np.uint8)


def gather_into(rows: np.ndarray, local: np.ndarray, out: np.ndarray, where: np.ndarray | None) -> int:
    """``out[where[i]] = rows[local[i]]`` (``where`` None: ``out[:len(local)]``); the bytes written.

    ``rows`` and ``out`` have the same dtype and row shape; ``local`` and ``where`` are int64.
    Each row is copied once when the compiled kernel is loaded (or ``where`` is None); before
    that a scatter with ``where`` costs numpy's two copies, and the count says so.
    """
    n = int(local.size)
    row_bytes = int(rows.itemsize * (int(np.prod(rows.shape[1:])) if rows.ndim > 1 else 1))
    if n == 0:
        return 0
    if where is None:
        np.take(rows, local, axis=0, out=out[:n])
        return n * row_bytes
    kernel = GATHER.kernels if GATHER.ready() else None
    word = _word(row_bytes)
    src2, dst2 = _as_words2d(rows, word), _as_words2d(out, word)
    if kernel is None or src2 is None or dst2 is None:
        out[where] = rows.take(local, axis=0)
        return 2 * n * row_bytes
    loc = np.ascontiguousarray(local, dtype=np.int64)
    pos = np.ascontiguousarray(where, dtype=np.int64)
    threads = _threads
    if threads > 1 and n * row_bytes >= PARALLEL_MIN_BYTES:
        bounds = np.linspace(0, n, threads + 1).astype(np.int64)
        pool = _executor()
        futures = [
            pool.submit(kernel, src2, loc[a:b], dst2, pos[a:b])
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
            if b > a
        ]
        for f in futures:
            f.result()
    else:
        kernel(src2, loc, dst2, pos)
    return n * row_bytes


def warm_up() -> None:
    """Start loading the kernel on a daemon thread (once per process)."""
    GATHER.warm_up()
