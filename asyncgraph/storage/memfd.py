"""Anonymous shared-memory arrays: numpy arrays backed by ``memfd_create`` files.

The memory has no name, so nothing can leak when a process is SIGKILLed and two servers on one
host can never collide. Other processes get access only by receiving the file descriptors
(``fdpass.py`` sends them over a Unix socket with SCM_RIGHTS).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import logging
import math
import mmap
import os
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError

__all__ = ["SharedArray", "memfd"]


# memfd names are limited to 249 bytes (the kernel prefixes "memfd:").
_MAX_LABEL_BYTES = 240
_SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
#: Linux 5.1: no new writable mapping and no write(2) by anyone, while the mappings that exist
#: (the owner's) stay writable. Python 3.11's fcntl does not name it.
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)


def memfd(label: str, size: int, *, final: bool = True) -> int:
    """A close-on-exec memfd of ``size`` zero bytes whose size is sealed.

    Sealing the size means no process holding the fd can truncate it under another process's
    mapping (which would turn the next access into SIGBUS). ``final`` also seals the seals (no
    process can add one); else ``seal`` must be called once the memory is filled.
    """
    name = label.replace("\0", "_").encode("utf-8", "replace")[:_MAX_LABEL_BYTES].decode("utf-8", "ignore")
    fd = os.memfd_create(name or "asyncgraph", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SIZE_SEALS | (fcntl.F_SEAL_SEAL if final else 0))
    except BaseException:
        os.close(fd)
        raise
    return fd


@functools.cache
def _warn_no_future_write() -> None:
    logging.getLogger("asyncgraph.storage").warning(
        "this kernel has no F_SEAL_FUTURE_WRITE (Linux >= 5.1): read-only tensors are mapped "
        "read-only by well-behaved processes only"
    )


def _nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    if any(int(d) < 0 for d in shape):
        raise InvalidRequestError(f"array shape {shape} has a negative dimension")
    return math.prod(shape) * dtype.itemsize


_HUGE_PAGE = 2 << 20

# Python's mmap.mmap(fd) keeps its own dup of fd (until 3.13's trackfd=False), so a tensor held
# two descriptors (issue 22 item 9); libc's mmap keeps none: a mapping outlives its descriptor.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_int = ctypes.c_int
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _int, _int, _int, ctypes.c_long]  # off_t: long
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """One ``MAP_SHARED`` mapping of a memfd, unmapped when the last numpy array over it goes.

    Arrays made with ``np.asarray(mapping)`` keep it as their base (views keep those arrays), so
    the memory stays mapped while any view exists. The object exposes no buffer, so numpy refuses
    to make an array over a read-only mapping writable.
    """

    __slots__ = ("__array_interface__", "_addr", "_nbytes")

    def __init__(self, fd: int, nbytes: int, *, writable: bool, offset: int = 0, huge: bool = True) -> None:
        # mmap takes a page-aligned file offset: map from the page that holds ``offset`` (an
        # ``.npy`` file's data starts after its header) and point the array past the gap.
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        length = offset - start + nbytes
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        addr = _libc.mmap(None, length, prot, mmap.MAP_SHARED, fd, start)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {nbytes} bytes failed: {os.strerror(err)}")
        self._addr: int = addr
        self._nbytes = length
        self.__array_interface__ = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (addr + offset - start, not writable),
        }
        if huge:
            _advise_huge_pages(addr, length)

    def __del__(self) -> None:
        addr, self._addr = getattr(self, "_addr", 0), 0  # no attribute when mmap failed
        if addr:
            _libc.munmap(addr, self._nbytes)


def _advise_huge_pages(addr: int, nbytes: int) -> None:
    """Ask for transparent huge pages on a large mapping: random row gathers then miss the TLB
    far less. Honoured only where the kernel allows huge pages for shared memory
    (``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` = ``advise``, ``within_size`` or
    ``always``); elsewhere it is a harmless no-op (its error is ignored)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < _HUGE_PAGE:
        return
    _libc.madvise(addr, nbytes, advice)


class SharedArray:
    """A numpy array in an anonymous memfd: shareable by fd, unlinkable by construction.

    The object holds one descriptor, ``fd`` (the one to send to other processes); the mapping
    (``_Mapping``, through libc) keeps none. Empty arrays (any zero dimension) cannot be mapped;
    they get a plain empty numpy array and a size-0 memfd.
    """

    #: Where the array's bytes start in the file ``fd`` refers to (0 for a memfd; an ``.npy``
    #: header's length for a ``FileArray``); co-located processes map it at that offset.
    offset = 0
    #: Whether the bytes are a file's (page cache, read-only) rather than memory of their own.
    file_backed = False

    def __init__(self, fd: int, array: np.ndarray, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self._fd = fd
        self._array: np.ndarray | None = array
        self.shape = shape
        self.dtype = dtype

    @classmethod
    def create(
        cls, label: str, shape: tuple[int, ...], dtype: np.dtype[Any] | str, *, final: bool = True
    ) -> SharedArray:
        """A zero-filled array; ``label`` is the memfd's debug name (seen in /proc/<pid>/fd).

        ``final=False`` leaves its seals open until ``seal`` (for memory that may become
        read-only once filled)."""
        dt = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        fd = memfd(label, _nbytes(shape, dt), final=final)
        return cls._map(fd, shape, dt, writable=True)

    def seal(self, *, read_only: bool) -> None:
        """Close the seals; ``read_only`` first forbids every later writable mapping and write
        (``F_SEAL_FUTURE_WRITE``): a process sent this fd can then only read, whatever it tries
        (mmap PROT_WRITE, mprotect, write(2), reopening /proc/<pid>/fd/N), while this
        process's own mapping stays writable. Idempotent; a no-op once the seals are closed.
        A kernel before 5.1 lacks that seal: logged once, the memory stays as before (attachers
        map it read-only, a hostile one could map it writable)."""
        seals = fcntl.fcntl(self.fd, fcntl.F_GET_SEALS)
        if seals & fcntl.F_SEAL_SEAL:
            return
        if read_only:
            try:
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                _warn_no_future_write()
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)

    @property
    def write_sealed(self) -> bool:
        """True when no new writable mapping of this memory can be made (``seal(read_only=True)``)."""
        return bool(fcntl.fcntl(self.fd, fcntl.F_GET_SEALS) & F_SEAL_FUTURE_WRITE)

    @classmethod
    def from_fd(
        cls,
        fd: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | str,
        *,
        writable: bool = True,
        offset: int = 0,
    ) -> SharedArray:
        """Map an array another process created (at byte ``offset`` of the file ``fd`` refers
        to: a served partition file's data); takes ownership of ``fd`` (closed on error too)."""
        try:
            dt = np.dtype(dtype)
            shape = tuple(int(d) for d in shape)
            need = _nbytes(shape, dt)
            offset = int(offset)
            have = os.fstat(fd).st_size
            if offset < 0 or have < offset + need:
                raise InvalidRequestError(
                    f"shared fd {fd} holds {have} bytes, array {shape} {dt} at offset {offset} needs "
                    f"{offset + need}"
                )
        except BaseException:
            os.close(fd)
            raise
        arr = cls._map(fd, shape, dt, writable=writable, offset=offset, huge=offset == 0)
        arr.offset = offset
        return arr

    @classmethod
    def _map(
        cls,
        fd: int,
        shape: tuple[int, ...],
        dt: np.dtype[Any],
        *,
        writable: bool,
        offset: int = 0,
        huge: bool = True,
    ) -> SharedArray:
        nbytes = _nbytes(shape, dt)
        if nbytes == 0:
            arr = np.empty(shape, dtype=dt)
            arr.flags.writeable = writable
            return cls(fd, arr, shape, dt)
        try:
            mapping = _Mapping(fd, nbytes, writable=writable, offset=offset, huge=huge)
        except BaseException:
            os.close(fd)
            raise
        # The array's base chain ends at the mapping: unmapped only once no view is left.
        # A read-only mapping gives a read-only array that cannot be made writable.
        arr = np.asarray(mapping).view(dt).reshape(shape)
        return cls(fd, arr, shape, dt)

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
        """Close the fd and drop the mapping; idempotent.

        The mapping is unmapped as soon as no array over it is left; if the caller still holds
        views of ``array``, it stays valid until the last view is garbage-collected instead of
        being torn down under it.
        """
        self._array = None
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"fd={self._fd}"
        return f"SharedArray(shape={self.shape}, dtype={self.dtype}, {state})"
