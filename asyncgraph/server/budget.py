"""Server-wide caps on what clients can make a server hold (issue 22).

Each cap is one number per server, not per request or per tensor:

- tensors (``--max-tensors``): every tensor holds a file descriptor (its memfd; before, also
  the duplicate Python's ``mmap`` kept), so 9,982 tiny tensors used every descriptor, new
  connections failed and a restart from that state failed with EMFILE. The server raises its
  soft descriptor limit to the hard one at start and, by default, allows as many tensors as
  leave ``FD_RESERVE`` descriptors for connections, logs and snapshots; a restore then needs no
  more descriptors than the state that was accepted.
- memory (``--memory-budget``): every tensor's rows held in memory of the server's own
  (memfds: run-time tensors, copies of partition data; ``PartitionStore.memory_bytes``) together
  (before, the only limit was one tensor's rows: a 21 GiB zeros tensor was accepted at once,
  its pages untouched). Partition files served in place (issue 34) are page cache, which the
  kernel drops and rereads under pressure: not counted. Default: the cgroup's memory limit
  when there is one, else physical memory.
- bytes queued for replies nobody reads (``--max-queued-reply-bytes``): ``ReplyBudget``. Each
  connection already stops reading once its own write buffer passes 64 MiB; 2,000 clients that
  never read could still pin 64 MiB each. Over the budget, the connections with the most queued
  bytes stop being read until the total is back under three quarters of it.
- connections (``--max-connections``, ``--max-connections-per-holder``): see
  ``asyncgraph.server.transport`` (authenticated connections beyond the cap are refused).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from pathlib import Path
from typing import Protocol

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_HOLDER",
    "DEFAULT_MAX_QUEUED_REPLY_BYTES",
    "DEFAULT_MAX_TENSORS",
    "FDS_PER_TENSOR",
    "FD_RESERVE",
    "ConnectionCap",
    "ReplyBudget",
    "default_max_tensors",
    "memory_budget",
    "raise_fd_limit",
]

log = logging.getLogger("asyncgraph.server")

#: The most tensors a server holds by default, whatever the descriptor limit.
DEFAULT_MAX_TENSORS = 4096
#: Descriptors held per tensor: its memfd (``storage/memfd.py`` maps it through libc, no dup).
FDS_PER_TENSOR = 1
#: Descriptors kept for everything else (connections, logs, snapshot files, libraries).
FD_RESERVE = 1024


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. a hard limit of RLIM_INFINITY on macOS
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def default_max_tensors(fd_limit: int) -> int:
    """Tensors a server with ``fd_limit`` descriptors allows by default (at least 64)."""
    return max(64, min(DEFAULT_MAX_TENSORS, (fd_limit - FD_RESERVE) // FDS_PER_TENSOR))


#: Authenticated connections a server holds at once by default (``--max-connections``).
DEFAULT_MAX_CONNECTIONS = 1024
#: Authenticated connections one holder keeps to a server by default (``--max-connections-per-holder``).
DEFAULT_MAX_CONNECTIONS_PER_HOLDER = 64


class ConnectionCap:
    """Counts a server's authenticated connections; refuses those past ``limit``, or past
    ``per_holder`` for one holder (0: no cap per holder).

    Before, 2,000 authenticated connections were all kept (+500 MB). A connection over a cap is
    told why (``ServerUnavailableError`` naming the limit) and closed right after its handshake.
    The holder is the one the client names in its hello (``ClientHello.holder``); connections
    that name none share one anonymous count under the same cap, so omitting it evades nothing.
    """

    def __init__(self, limit: int = DEFAULT_MAX_CONNECTIONS, per_holder: int = 0) -> None:
        self.limit = limit
        self.per_holder = per_holder
        self.open = 0
        self.refused = 0
        self.by_holder: dict[str | None, int] = {}  # None: the anonymous connections

    def admit(self, holder: str | None = None) -> str | None:
        """Count one more connection of ``holder``; None when admitted, else why not."""
        if self.open >= self.limit:
            self.refused += 1
            return (
                f"server has {self.open} connections, its limit (--max-connections {self.limit}); "
                "close some or raise the limit"
            )
        held = self.by_holder.get(holder, 0)
        if self.per_holder and held >= self.per_holder:
            self.refused += 1
            who = "connections without a holder" if holder is None else f"holder {holder[:64]!r}"
            return (
                f"{who} already has {held} connections to this server, its limit "
                f"(--max-connections-per-holder {self.per_holder}); close some or raise the limit"
            )
        self.by_holder[holder] = held + 1
        self.open += 1
        return None

    def release(self, holder: str | None = None) -> None:
        self.open -= 1
        held = self.by_holder.pop(holder, 0) - 1
        if held > 0:
            self.by_holder[holder] = held


_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def memory_budget() -> int:
    """The default memory budget: this cgroup's memory limit (v2 or v1), else physical memory."""
    import psutil

    physical = int(psutil.virtual_memory().total)
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < physical:
            return int(text)
    return physical


#: Bytes of replies queued for all connections together before the worst offenders are paused.
DEFAULT_MAX_QUEUED_REPLY_BYTES = 512 << 20
#: How often a server over its reply budget looks at its queues again (seconds).
REPLY_BUDGET_CHECK = 0.02


class _Queued(Protocol):
    def queued_bytes(self) -> int: ...
    def budget_pause(self, paused: bool) -> None: ...


class ReplyBudget:
    """One budget for the reply bytes queued on all of a server's connections (see above)."""

    def __init__(self, limit: int = DEFAULT_MAX_QUEUED_REPLY_BYTES) -> None:
        self.limit = limit
        self.total = 0
        self.sheds = 0  # connections paused for the budget, in all
        self._queued: dict[_Queued, int] = {}
        self._paused: set[_Queued] = set()
        self._timer: asyncio.TimerHandle | None = None

    def report(self, conn: _Queued, size: int) -> None:
        """``conn`` has ``size`` bytes queued now (after a write); shed load when over budget."""
        old = self._queued.get(conn, 0)
        if size:
            self._queued[conn] = size
        else:
            self._queued.pop(conn, None)
        self.total += size - old
        if self.total > self.limit:
            self._shed()

    def forget(self, conn: _Queued) -> None:
        self.total -= self._queued.pop(conn, 0)
        self._paused.discard(conn)

    def _shed(self) -> None:
        unpaused = self.total - sum(self._queued.get(c, 0) for c in self._paused)
        for conn, size in sorted(self._queued.items(), key=lambda kv: -kv[1]):
            if unpaused <= self.limit:
                break
            if conn not in self._paused:
                self._paused.add(conn)
                conn.budget_pause(True)
                self.sheds += 1
                unpaused -= size
        if self._paused and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(REPLY_BUDGET_CHECK, self._check)

    def _check(self) -> None:
        self._timer = None
        for conn in list(self._queued):
            size = conn.queued_bytes()
            self.total += size - self._queued[conn]
            if size:
                self._queued[conn] = size
            else:
                del self._queued[conn]
        if self.total <= self.limit * 3 // 4:
            for conn in self._paused:
                conn.budget_pause(False)
            self._paused.clear()
        elif self._paused:
            self._timer = asyncio.get_running_loop().call_later(REPLY_BUDGET_CHECK, self._check)
