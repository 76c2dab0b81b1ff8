"""No orphans: what the launcher starts dies with it, however the launcher dies.

Two mechanisms, because each alone has holes:

* ``die_with_parent`` (``preexec_fn`` of every child): Linux ``prctl(PR_SET_PDEATHSIG)`` so
  the kernel signals the child the moment the launcher's thread that forked it is gone (SIGKILL
  included); if the launcher died before the child got there, the child kills itself.
* a watchdog process (``python -m asyncgraph.launch.lifeline --dir LAUNCH_DIR``) that the launcher
  feeds one line per child process group over a pipe (its stdin). EOF without ``done`` means the
  launcher died: the watchdog SIGTERMs every group (grandchildren included, which the
  parent-death signal does not reach), SIGKILLs what is left after a grace period and removes
  the launch directory (the secret, ready files, ip_config). After ``done`` (a launcher that
  cleaned up itself) it only removes the directory if still there.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["bind_to_parent", "die_with_parent", "exit_status", "group_alive", "watchdog"]

_PR_SET_PDEATHSIG = 1
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def exit_status(returncode: int) -> int:
    """A child's ``Popen.returncode`` in the shell's convention: ``-N`` (killed by signal N) is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child receive ``sig`` when the calling process dies."""
    parent = os.getpid()
    libc = _libc  # loaded before fork: the child only calls into it

    def preexec() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def bind_to_parent(parent: int, sig: int = signal.SIGTERM) -> bool:
    """In a child process: receive ``sig`` when ``parent`` dies; SIGKILL itself if it is already gone.

    Returns whether the parent-death signal is set (False where the platform has none: the
    caller then watches the parent's PID itself).
    """
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return _libc is not None


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_groups(groups: list[int], grace: float) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(group_alive(g) for g in groups):
        time.sleep(0.05)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def watchdog(launch_dir: Path | None, grace: float, lines: Iterable[str] | None = None) -> int:
    """Read ``pgid N`` / ``done`` lines until EOF; then clean up as the module docstring says."""
    stream = sys.stdin if lines is None else lines
    groups: list[int] = []
    done = False
    for line in stream:
        word, _, arg = line.strip().partition(" ")
        if word == "pgid" and arg.isdigit():
            groups.append(int(arg))
        elif word == "done":
            done = True
    if not done and groups:
        _kill_groups(groups, grace)
    if launch_dir is not None:
        shutil.rmtree(launch_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m asyncgraph.launch.lifeline", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dir", type=Path, help="launch directory to remove when the launcher is gone")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    ns = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):  # outlive a Ctrl-C or hang-up of the launcher
        signal.signal(sig, signal.SIG_IGN)
    return watchdog(ns.dir, ns.grace)


if __name__ == "__main__":
    sys.exit(main())
