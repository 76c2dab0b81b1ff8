"""What a primary reads from ``/proc`` to tell a real replica from a process that claims to be one.

A replica runs on its primary's host and maps the primary's memory (``server/replica.py``). So
before counting one (issue 32), the primary checks, for the pid the replica announced,

- that this process listens on the announced TCP port (its socket inodes against the
  listening entries of ``/proc/net/tcp`` and ``tcp6``): not pid 1 or a bystander, and
- that it maps this primary's memory (the inodes of the primary's structure memfds appear in
  its ``/proc/<pid>/maps``): a server that answers ``info`` as a replica but serves rows of its
  own (forged, or swallowing pushes) maps none of them.

Both need the replica to run as this user (``/proc/<pid>`` readable), as servers of one job do.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["listening_inodes", "mapped_inodes", "socket_inodes", "unproven"]

_LISTEN = "0A"


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[int]:
    """Inodes of the TCP sockets (v4 and v6) listening on ``port`` on this host."""
    found: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            if int(cols[1].rpartition(":")[2], 16) == port:
                found.add(int(cols[9]))
    return found


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """Inodes of the sockets process ``pid`` holds (OSError when its fds are not readable)."""
    folder = proc / str(pid) / "fd"
    found: set[int] = set()
    for name in os.listdir(folder):
        try:
            target = os.readlink(folder / name)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def mapped_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """Inodes of the files process ``pid`` maps (OSError when its maps are not readable)."""
    found: set[int] = set()
    for line in (proc / str(pid) / "maps").read_text().splitlines():
        cols = line.split(maxsplit=5)
        if len(cols) >= 5 and cols[4] != "0":
            found.add(int(cols[4]))
    return found


def unproven(pid: int, port: int, memory: set[int]) -> str | None:
    """Why process ``pid`` is not shown to be a replica listening on ``port`` and mapping the
    memfds ``memory`` (inodes), or None when it is."""
    try:
        sockets = socket_inodes(pid)
        maps = mapped_inodes(pid)
    except OSError as exc:
        return f"process {pid} cannot be inspected on this host ({exc.strerror or exc})"
    if not sockets & listening_inodes(port):
        return f"process {pid} does not listen on port {port}"
    if not memory <= maps:
        return f"process {pid} does not map this primary's memory"
    return None
