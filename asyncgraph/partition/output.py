"""Writing a partition folder safely: the target checked before anything is written, output built
in a temporary sibling named after its writer (pid@host) and renamed into place at the end, and
the leftovers of killed runs removed. Shared by the in-memory and the out-of-core partitioners.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

from asyncgraph.errors import InvalidRequestError

logger = logging.getLogger("asyncgraph.partition")

__all__ = ["check_out_path", "commit", "glob_escape", "pid_alive", "remove_stale_temp", "temp_name"]


def check_out_path(out_path: Path, overwrite: bool) -> None:
    """Reject an out_path we must not replace (before anything is written)."""
    if out_path.exists() or out_path.is_symlink():
        if not out_path.is_dir():
            raise InvalidRequestError(f"out_path {out_path} exists and is not a directory")
        if not overwrite and any(out_path.iterdir()):
            raise InvalidRequestError(
                f"out_path {out_path} exists and is not empty; pass overwrite=True to replace it"
            )
    parent = out_path.parent
    if parent.exists() and not parent.is_dir():
        raise InvalidRequestError(f"parent of out_path {out_path} is not a directory")



_TEMP = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)@(?P<host>.+)-[0-9a-f]{12}$")


def temp_name(out: Path, kind: str) -> str:
    """A sibling folder name for ``out`` that says who wrote it (pid@host), so leftovers are known."""
    return f".{out.name}.{kind}-{os.getpid()}@{socket.gethostname()}-{uuid.uuid4().hex[:12]}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temp(out: Path) -> list[Path]:
    """Remove temporary siblings of ``out`` left by killed runs on this host; returns them."""
    removed: list[Path] = []
    if not out.parent.is_dir():
        return removed
    host = socket.gethostname()
    for path in out.parent.glob(f".{glob_escape(out.name)}.*-*@*-*"):
        m = _TEMP.match(path.name)
        if m is None or m["name"] != out.name or m["host"] != host or not path.is_dir():
            continue
        if pid_alive(int(m["pid"])):
            continue  # a run in progress (or a live process that reused the pid: leave it)
        shutil.rmtree(path, ignore_errors=True)
        logger.info("removed %s left by a killed run", path)
        removed.append(path)
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def commit(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` folder to ``out``, replacing an existing (empty or old) one."""
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
        return
    trash = out.parent / temp_name(out, "old")
    os.rename(out, trash)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(trash, out)
        raise
    shutil.rmtree(trash, ignore_errors=True)
