"""Process-wide glibc malloc tuning for large, short-lived buffers (message bodies, gathered rows).

Kept apart from the protocol, which stays pure: servers call it at start-up and clients when
they connect, so big buffers are recycled from the heap instead of being ``mmap``-ed and
page-faulted afresh on every message.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["release_free_memory", "retain_large_allocations"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_malloc_tuned = False


def retain_large_allocations(mmap_threshold: int = 1 << 30, trim_threshold: int = 1 << 30) -> bool:
    """Make glibc serve big allocations from the heap and keep freed memory for reuse.

    By default glibc ``mmap``s every allocation over 32 MiB and unmaps it on free, so each
    large message body or gathered result costs a fresh page fault per 4 KiB page (for a
    50 MB pull that is slower than the copy itself). Raising ``M_MMAP_THRESHOLD`` and
    ``M_TRIM_THRESHOLD`` keeps such memory warm for the next message; the price is that up to
    ``trim_threshold`` bytes of freed memory stay in the process. Process-wide and idempotent;
    returns False where it does not apply (not Linux/glibc, or already done).
    """
    global _malloc_tuned
    if _malloc_tuned or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    _malloc_tuned = ok
    return ok


def release_free_memory() -> bool:
    """Give freed heap memory back to the OS (glibc ``malloc_trim(0)``, every arena).

    ``retain_large_allocations`` keeps freed buffers for the next message; a server calls this
    when it has been idle for a while (issue 22: memory a burst of clients made it allocate, e.g.
    2,000 connections or huge requests, otherwise stayed in the process after they left).
    Returns False where it does not apply.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
