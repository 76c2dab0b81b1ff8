"""Interruptions of the out-of-core partitioner, as Slurm and Kubernetes deliver them (issue 33).

* SIGTERM and SIGINT unwind the run as :class:`Interrupted` (a ``SystemExit`` with status
  128 + N). An interruption is not a failure: the work folder keeps its finished stages for
  ``--resume`` (before, it was removed and ``--resume`` silently recomputed everything). The end
  of a stage (removing its inputs, recording the state) and the final commit are not cut in
  two: a signal arriving inside :func:`held` takes effect when it is left.
* Worker processes die with the main process however it dies, SIGKILL included
  (:func:`worker_init`): Linux's parent-death signal (SIGKILL), elsewhere a thread that watches
  the parent's PID. They ignore SIGINT and SIGTERM, which the main process handles (a Ctrl-C
  reaches the whole process group, ``scancel`` every process of the step): it kills its workers
  by PID and records what it finished.
* A testing hook holds a stage's tasks: ``ASYNCGRAPH_PARTITION_PAUSE_IN=<stage>`` makes each task
  of that stage write ``$ASYNCGRAPH_PARTITION_PAUSE_MARKS/<pid>`` and sleep
  ``$ASYNCGRAPH_PARTITION_PAUSE_S`` seconds before it runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["Interrupted", "held", "install", "paused_task", "signal_name", "worker_init"]

_held = 0
_pending: int | None = None


class Interrupted(SystemExit):
    """The run was stopped by a signal (``code`` is 128 + its number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15."""
    return signal.Signals(signum).name


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _pending
    if _held:
        _pending = signum
        return
    raise Interrupted(signum)


def install() -> None:
    """SIGTERM and SIGINT raise :class:`Interrupted` in the main thread (the CLI's handler)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)


@contextmanager
def held() -> Iterator[None]:
    """A signal arriving inside takes effect once the block is done (when it ends normally)."""
    global _held, _pending
    _held += 1
    try:
        yield
    finally:
        _held -= 1
    if not _held and _pending is not None:
        signum, _pending = _pending, None
        raise Interrupted(signum)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def worker_init(parent: int) -> None:
    """Initializer of every worker process: die with ``parent``; leave signals to it."""
    from asyncgraph.launch.lifeline import bind_to_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not bind_to_parent(parent, signal.SIGKILL):  # no parent-death signal here: watch the PID
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="parent-watch").start()


def paused_task(fn: Callable[..., Any], stage: str, *args: Any) -> Any:
    """``fn(*args)``, held first when the testing hook names ``stage`` (see the module doc)."""
    if os.environ.get("ASYNCGRAPH_PARTITION_PAUSE_IN") == stage:
        marks = os.environ.get("ASYNCGRAPH_PARTITION_PAUSE_MARKS")
        if marks:
            Path(marks, str(os.getpid())).touch()
        time.sleep(float(os.environ.get("ASYNCGRAPH_PARTITION_PAUSE_S", "60")))
    return fn(*args)
