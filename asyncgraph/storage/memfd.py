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
import queue
import threading
import weakref
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

    __slots__ = ("__array_interface__", "__weakref__", "_addr", "_nbytes")

    def __init__(
        self,
        fd: int,
        nbytes: int,
        *,
        writable: bool,
        offset: int = 0,
        huge: bool = True,
        populate: bool = False,
    ) -> None:
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
        elif populate and length >= _HUGE_PAGE:  # a file's pages: page tables filled in the background
            _populate_later(self)

    def __del__(self) -> None:
        addr, self._addr = getattr(self, "_addr", 0), 0  # no attribute when mmap failed
        if addr:
            _libc.munmap(addr, self._nbytes)


_MADV_POPULATE_READ = 22  # Linux 5.14: fault a range in (page tables filled, pages read if not cached)
_POPULATE_CHUNK = 64 << 20
_populate_queue: queue.SimpleQueue[weakref.ref[_Mapping]] | None = None
_populate_lock = threading.Lock()
_populated_bytes = 0


def _available_bytes() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _populate_later(mapping: _Mapping) -> None:
    """Queue ``mapping`` for a background thread that faults its pages in ahead of use.

    A file mapping has no huge pages: a random row gather then takes one page fault per 4 KiB
    page it first touches in each process (250k rows of a 2 GiB feature file: 0.54 s, against
    0.09 s once the page tables are filled). ``MADV_POPULATE_READ`` fills them from the page
    cache (reading what is not cached) on a daemon thread, in chunks, with the GIL released.
    Done where rows are gathered, in co-located processes mapping a server's files, not in the
    server (its start-up reads metadata only), and only while this process's populated files fit
    in half the memory available (a graph larger than memory is left to the page cache's own
    choice). ``ASYNCGRAPH_POPULATE_FILES=0`` turns it off; kernels before 5.14 refuse the
    advice, which is then a no-op."""
    global _populate_queue, _populated_bytes
    if os.environ.get("ASYNCGRAPH_POPULATE_FILES", "1") == "0":
        return
    with _populate_lock:
        if _populated_bytes + mapping._nbytes > _available_bytes() // 2:
            return
        _populated_bytes += mapping._nbytes
    with _populate_lock:
        if _populate_queue is None:
            _populate_queue = queue.SimpleQueue()
            threading.Thread(
                target=_populate_loop, args=(_populate_queue,), name="asyncgraph-populate", daemon=True
            ).start()
    _populate_queue.put(weakref.ref(mapping))


def _populate_loop(todo: queue.SimpleQueue[weakref.ref[_Mapping]]) -> None:
    while True:
        ref = todo.get()
        done = 0
        while True:
            mapping = ref()  # held during each call: the range cannot be unmapped under it
            if mapping is None or not mapping._addr or done >= mapping._nbytes:
                break
            step = min(_POPULATE_CHUNK, mapping._nbytes - done)
            failed = _libc.madvise(mapping._addr + done, step, _MADV_POPULATE_READ) != 0
            del mapping
            if failed:
                break  # an old kernel, or an I/O error a read would also meet: leave it to faults
            done += step


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
        # a file's data (offset past its header): no huge pages, page tables filled ahead of use
        in_file = offset != 0
        arr = cls._map(fd, shape, dt, writable=writable, offset=offset, huge=not in_file, populate=in_file)
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
        populate: bool = False,
    ) -> SharedArray:
        nbytes = _nbytes(shape, dt)
        if nbytes == 0:
            arr = np.empty(shape, dtype=dt)
            arr.flags.writeable = writable
            return cls(fd, arr, shape, dt)
        try:
            mapping = _Mapping(fd, nbytes, writable=writable, offset=offset, huge=huge, populate=populate)
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
