"""Reader/writer locks for a partition store: in-process, and cross-process over a memfd.

The cross-process lock is ``fcntl.flock`` on a small memfd. flock locks belong to the *open file
description*, so every process re-opens the received fd through ``/proc/self/fd/<fd>`` to get
its own description (a received fd shares the sender's), and threads of one process are
ordered by an in-process reader/writer lock that sits in front of the flock. The kernel drops
a flock when its holder dies, so a crashed client cannot wedge the server.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import threading
import weakref
from threading import get_ident
from typing import Protocol

from asyncgraph.errors import InvalidRequestError
from asyncgraph.storage.memfd import memfd

__all__ = ["LocalRWLock", "RWLock", "SharedRWLock"]

_HEADER = struct.Struct("=Q")  # the catalog generation at the start of the lock's memfd


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
        # the uncontended path is on every pull: the mutex is taken and released directly, and
        # the thread id is only looked up when some thread writes
        tls = self._tls
        depth = getattr(tls, "depth", 0)
        writer = self._writer
        if depth or (writer is not None and writer == get_ident()):  # nested: already covered
            tls.depth = depth + 1
            return
        mutex = self._mutex
        mutex.acquire()
        try:
            while self._writer is not None or self._waiting_writers:
                self._wait()
            if not self._readers:
                self._first_reader()
            self._readers += 1
        finally:
            mutex.release()
        tls.depth = 1

    def _release_read(self) -> None:
        tls = self._tls
        depth = tls.depth - 1
        tls.depth = depth
        # a read taken under this thread's write ends under it too (proper nesting)
        writer = self._writer
        if depth or (writer is not None and writer == get_ident()):
            return
        mutex = self._mutex
        mutex.acquire()
        try:
            self._readers -= 1
            if not self._readers:
                try:
                    self._last_reader()
                finally:
                    if self._waiting:
                        self._cond.notify_all()
        finally:
            mutex.release()

    #: ``read()`` without the context manager, for hot paths: pair with ``try``/``finally``.
    acquire_read = _acquire_read
    release_read = _release_read

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

    The memfd's first 8 bytes also hold the store's *catalog generation*, a counter its owner
    advances whenever a tensor is created or deleted, so that every process mapping the store
    notices a changed catalog with one memory read instead of asking the server.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._header: mmap.mmap | None = None
        if os.fstat(fd).st_size >= _HEADER.size:
            self._header = mmap.mmap(fd, _HEADER.size)
        super().__init__()

    @classmethod
    def create(cls, label: str) -> SharedRWLock:
        """A new lock; ``label`` is the memfd's debug name."""
        return cls(memfd(label, _HEADER.size))

    @property
    def generation(self) -> int:
        """The catalog generation (0 before the first change)."""
        header = self._header
        return _HEADER.unpack_from(header)[0] if header is not None else 0

    def advance_generation(self) -> int:
        """Count one catalog change (the owner, after the change is visible); the new value."""
        header = self._header
        if header is None:
            return 0
        value: int = _HEADER.unpack_from(header)[0] + 1
        _HEADER.pack_into(header, 0, value)  # one aligned 8-byte store: readers see old or new
        return value

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
        fd = self._fd  # ``_flock`` inlined: this runs on every uncontended pull
        if fd < 0:
            raise InvalidRequestError("lock is closed")
        fcntl.flock(fd, fcntl.LOCK_SH)

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
        header, self._header = self._header, None
        if header is not None:
            header.close()
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
