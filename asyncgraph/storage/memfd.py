"""Anonymous shared-memory arrays: numpy arrays backed by ``memfd_create`` files.

The memory has no name, so nothing can leak when a process is SIGKILLed and two servers on one
host can never collide. Other processes get access only by receiving the file descriptors
(``fdpass.py`` sends them over a Unix socket with SCM_RIGHTS).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import mmap
import os
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError

__all__ = ["SharedArray", "memfd"]


# memfd names are limited to 249 bytes (the kernel prefixes "memfd:").
_MAX_LABEL_BYTES = 240
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def memfd(label: str, size: int) -> int:
    """A close-on-exec memfd of ``size`` zero bytes whose size is sealed.

    Sealing the size means no process holding the fd can truncate it under another process's
    mapping (which would turn the next access into SIGBUS).
    """
    name = label.replace("\0", "_").encode("utf-8", "replace")[:_MAX_LABEL_BYTES].decode("utf-8", "ignore")
    fd = os.memfd_create(name or "asyncgraph", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    if any(int(d) < 0 for d in shape):
        raise InvalidRequestError(f"array shape {shape} has a negative dimension")
    return math.prod(shape) * dtype.itemsize


_HUGE_PAGE = 2 << 20


def _advise_huge_pages(mm: mmap.mmap, nbytes: int) -> None:
    """Ask for transparent huge pages on a large mapping: random row gathers then miss the TLB
    far less. Honoured only where the kernel allows huge pages for shared memory
    (``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` = ``advise``, ``within_size`` or
    ``always``); elsewhere it is a harmless no-op."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < _HUGE_PAGE:
        return
    with contextlib.suppress(OSError):
        mm.madvise(advice)


class SharedArray:
    """A numpy array in an anonymous memfd: shareable by fd, unlinkable by construction.

    The object holds two descriptors for a non-empty array: ``fd`` (the one to send to other
    processes) and the private duplicate that Python's ``mmap`` keeps. Empty arrays (any zero
    dimension) cannot be mapped; they get a plain empty numpy array and a size-0 memfd.
    """

    def __init__(
        self, fd: int, mm: mmap.mmap | None, array: np.ndarray, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> None:
        self._fd = fd
        self._mmap = mm
        self._array: np.ndarray | None = array
        self.shape = shape
        self.dtype = dtype

    @classmethod
    def create(cls, label: str, shape: tuple[int, ...], dtype: np.dtype[Any] | str) -> SharedArray:
        """A zero-filled array; ``label`` is the memfd's debug name (seen in /proc/<pid>/fd)."""
        dt = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        fd = memfd(label, _nbytes(shape, dt))
        return cls._map(fd, shape, dt, writable=True)

    @classmethod
    def from_fd(
        cls, fd: int, shape: tuple[int, ...], dtype: np.dtype[Any] | str, *, writable: bool = True
    ) -> SharedArray:
        """Map an array another process created; takes ownership of ``fd`` (closed on error too)."""
        try:
            dt = np.dtype(dtype)
            shape = tuple(int(d) for d in shape)
            need = _nbytes(shape, dt)
            have = os.fstat(fd).st_size
            if have < need:
                raise InvalidRequestError(
                    f"shared memory fd {fd} holds {have} bytes, array {shape} {dt} needs {need}"
                )
        except BaseException:
            os.close(fd)
            raise
        return cls._map(fd, shape, dt, writable=writable)

    @classmethod
    def _map(cls, fd: int, shape: tuple[int, ...], dt: np.dtype[Any], *, writable: bool) -> SharedArray:
        nbytes = _nbytes(shape, dt)
        if nbytes == 0:
            arr = np.empty(shape, dtype=dt)
            arr.flags.writeable = writable
            return cls(fd, None, arr, shape, dt)
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=prot)
        except BaseException:
            os.close(fd)
            raise
        _advise_huge_pages(mm, nbytes)
        # frombuffer keeps a memoryview (a buffer export) as the base, so mmap.close() refuses
        # while any view is alive instead of unmapping under it; np.ndarray(buffer=mm) would not.
        # A read-only mapping gives a read-only array.
        arr = np.frombuffer(mm, dtype=dt, count=math.prod(shape)).reshape(shape)
        return cls(fd, mm, arr, shape, dt)

    @property
    def array(self) -> np.ndarray:
        """The mapped array (raises after ``close``)."""
        if self._array is None:
            raise InvalidRequestError("shared array is closed")
        return self._array

    @property
    def fd(self) -> int:
        """The memfd to send to other processes (valid until ``close``)."""
        if self._fd < 0:
            raise InvalidRequestError("shared array is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Close the fd and the mapping; idempotent.

        If the caller still holds views of ``array``, the mapping (and mmap's own descriptor)
        stays valid until the last view is garbage-collected instead of being torn down under it.
        """
        self._array = None
        if self._mmap is not None:
            with contextlib.suppress(BufferError):  # views still alive: unmapped at their GC
                self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"fd={self._fd}"
        return f"SharedArray(shape={self.shape}, dtype={self.dtype}, {state})"
