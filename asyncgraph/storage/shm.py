"""Anonymous shared memory (memfd) arrays and a cross-process reader/writer lock.

Everything here lives in ``os.memfd_create`` files rather than named ``/dev/shm`` segments:
the memory has no name, so nothing can leak when a process is SIGKILLed and two servers on one
host can never collide. Other processes get access only by receiving the file descriptors
(``fdpass.py`` sends them over a Unix socket with SCM_RIGHTS).

The lock is ``fcntl.flock`` on a small memfd. flock locks belong to the *open file
description*, so every process re-opens the received fd through ``/proc/self/fd/<fd>`` to get
its own description (a received fd shares the sender's), and threads of one process are
ordered by an in-process reader/writer lock that sits in front of the flock. The kernel drops
a flock when its holder dies, so a crashed client cannot wedge the server.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import mmap
import os
import threading
import weakref
from typing import Any, Protocol

import numpy as np

from asyncgraph.errors import InvalidRequestError

__all__ = ["LocalRWLock", "RWLock", "SharedArray", "SharedRWLock"]

# memfd names are limited to 249 bytes (the kernel prefixes "memfd:").
_MAX_LABEL_BYTES = 240
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _memfd(label: str, size: int) -> int:
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
        fd = _memfd(label, _nbytes(shape, dt))
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


class RWLock(Protocol):
    """What a store needs from a lock: shared reads and exclusive writes."""

    def read(self) -> contextlib.AbstractContextManager[None]: ...

    def write(self) -> contextlib.AbstractContextManager[None]: ...


_LIVE_LOCKS: weakref.WeakSet[LocalRWLock] = weakref.WeakSet()  # reset in forked children


class _ReadGuard(contextlib.AbstractContextManager[None]):
    """Context manager of ``LocalRWLock.read`` (preallocated: no generator per use)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: LocalRWLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock._acquire_read()

    def __exit__(self, *exc: object) -> None:
        self._lock._release_read()


class _WriteGuard(contextlib.AbstractContextManager[None]):
    """Context manager of ``LocalRWLock.write``."""

    __slots__ = ("_lock",)

    def __init__(self, lock: LocalRWLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock._acquire_write()

    def __exit__(self, *exc: object) -> None:
        self._lock._release_write()


class LocalRWLock:
    """A writer-preferring reader/writer lock for the threads of one process.

    Re-entrant where it cannot deadlock: a thread that holds the write lock may take read or
    write again, and a thread that holds a read lock may take read again. Upgrading a read to
    a write raises ``RuntimeError`` (it would deadlock). Subclasses hook the first reader in /
    last reader out / writer in / writer out (``SharedRWLock`` takes the matching flock there).
    """

    def __init__(self) -> None:
        self._reset()
        self._read_guard = _ReadGuard(self)
        self._write_guard = _WriteGuard(self)
        _LIVE_LOCKS.add(self)

    def _after_fork(self) -> None:
        """In a forked child (one thread): forget the parent's holders and waiters."""
        self._reset()

    def _reset(self) -> None:
        self._mutex = threading.Lock()  # entered directly: cheaper than Condition.__enter__
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer: int | None = None
        self._write_depth = 0
        self._waiting = 0  # threads blocked in _cond.wait()
        self._waiting_writers = 0
        self._tls = threading.local()  # .depth: read nesting of this thread (incl. reads under its write)

    # hooks, called with the mutex held
    def _first_reader(self) -> None:
        pass

    def _last_reader(self) -> None:
        pass

    def _writer_in(self) -> None:
        pass

    def _writer_out(self) -> None:
        pass

    def read(self) -> contextlib.AbstractContextManager[None]:
        """Shared access (context manager)."""
        return self._read_guard

    def write(self) -> contextlib.AbstractContextManager[None]:
        """Exclusive access (context manager)."""
        return self._write_guard

    def _wait(self) -> None:
        self._waiting += 1
        try:
            self._cond.wait()
        finally:
            self._waiting -= 1

    def _acquire_read(self) -> None:
        tls = self._tls
        depth = getattr(tls, "depth", 0)
        if depth or self._writer == threading.get_ident():  # nested: already covered
            tls.depth = depth + 1
            return
        with self._mutex:
            while self._writer is not None or self._waiting_writers:
                self._wait()
            if self._readers == 0:
                self._first_reader()
            self._readers += 1
        tls.depth = 1

    def _release_read(self) -> None:
        tls = self._tls
        depth = tls.depth - 1
        tls.depth = depth
        # a read taken under this thread's write ends under it too (proper nesting)
        if depth or self._writer == threading.get_ident():
            return
        with self._mutex:
            self._readers -= 1
            if self._readers == 0:
                try:
                    self._last_reader()
                finally:
                    if self._waiting:
                        self._cond.notify_all()

    def _acquire_write(self) -> None:
        me = threading.get_ident()
        if self._writer == me:
            self._write_depth += 1
            return
        if getattr(self._tls, "depth", 0):
            raise RuntimeError("cannot take the write lock while this thread holds the read lock")
        with self._mutex:
            self._waiting_writers += 1
            try:
                while self._writer is not None or self._readers:
                    self._wait()
            finally:
                self._waiting_writers -= 1
            try:
                self._writer_in()
            except BaseException:
                if self._waiting:
                    self._cond.notify_all()
                raise
            self._writer = me
            self._write_depth = 1

    def _release_write(self) -> None:
        self._write_depth -= 1
        if self._write_depth:
            return
        with self._mutex:
            self._writer = None
            try:
                self._writer_out()
            finally:
                if self._waiting:
                    self._cond.notify_all()


class SharedRWLock(LocalRWLock):
    """Reader/writer lock shared by every process holding the memfd; ``flock`` underneath.

    Reads take ``LOCK_SH``, writes ``LOCK_EX`` on this process's own open file description;
    the in-process lock orders threads first, because flock does not exclude threads sharing a
    description. A forked child re-opens the description automatically (at-fork hook).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        super().__init__()

    @classmethod
    def create(cls, label: str) -> SharedRWLock:
        """A new lock; ``label`` is the memfd's debug name."""
        return cls(_memfd(label, 0))

    @classmethod
    def from_fd(cls, fd: int) -> SharedRWLock:
        """Join a lock received from another process; takes ownership of ``fd``.

        Re-opens ``/proc/self/fd/<fd>`` for a private open file description (a received fd
        shares the sender's, and flock would then treat both processes as one holder).
        """
        try:
            own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        finally:
            os.close(fd)
        return cls(own)

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise InvalidRequestError("lock is closed")
        return self._fd

    def _flock(self, op: int) -> None:
        if self._fd < 0:
            raise InvalidRequestError("lock is closed")
        fcntl.flock(self._fd, op)

    def _first_reader(self) -> None:
        self._flock(fcntl.LOCK_SH)

    def _last_reader(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _writer_in(self) -> None:
        self._flock(fcntl.LOCK_EX)

    def _writer_out(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _after_fork(self) -> None:
        """In a forked child: own open file description, nothing held (the child has one thread)."""
        self._reset()
        if self._fd >= 0:
            own = os.open(f"/proc/self/fd/{self._fd}", os.O_RDWR | os.O_CLOEXEC)
            os.dup2(own, self._fd, inheritable=False)
            os.close(own)

    def close(self) -> None:
        """Close the descriptor (releasing any flock it holds); idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __repr__(self) -> str:
        return f"SharedRWLock(fd={self._fd})"


def _after_fork_in_child() -> None:
    for lock in list(_LIVE_LOCKS):
        with contextlib.suppress(OSError):
            lock._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
