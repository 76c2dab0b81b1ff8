"""Memory accounting for the out-of-core partitioner: sizes, the default limit, a peak sampler.

The limit is on ``RssAnon + RssShmem`` summed over the run's processes (the main process and
every worker it started): memory the kernel cannot drop. Clean pages of memory-mapped input
and output files are not counted (the kernel drops them under pressure), which is why the
pipeline reads chunks and writes outputs through memory maps and plain file writes.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import uuid
from types import TracebackType
from typing import Any

import psutil

from asyncgraph.errors import InvalidRequestError, MemoryBudgetError

__all__ = ["DaskPeaks", "PeakSampler", "default_memory_limit", "format_size", "parse_size", "tree_memory"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4,
          "tib": 1 << 40}  # fmt: skip

#: The default ``--memory-limit``: this fraction of the memory available when the run starts.
DEFAULT_FRACTION = 0.5


def parse_size(text: str | int) -> int:
    """``"2GiB"``, ``"512M"``, ``"1.5g"`` or an int of bytes -> bytes (binary units for k/m/g/t)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if m is None or m[2].lower() not in _UNITS:
            raise InvalidRequestError(f"memory size {text!r} is not a size such as 2GiB, 512MiB or 1e9")
        value = int(float(m[1]) * _UNITS[m[2].lower()])
    if value <= 0:
        raise InvalidRequestError(f"memory size must be positive, got {text!r}")
    return value


def format_size(n: float) -> str:
    """Bytes as a short binary-unit string (``1.50 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def default_memory_limit() -> int:
    """``DEFAULT_FRACTION`` of the memory available now (``MemAvailable``)."""
    return int(psutil.virtual_memory().available * DEFAULT_FRACTION)


def _unswappable(pid: int) -> int:
    """``RssAnon + RssShmem`` of one process in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return 0
    total = 0
    for key in ("RssAnon:", "RssShmem:"):
        i = text.find(key)
        if i >= 0:
            total += int(text[i + len(key) :].split(None, 1)[0]) * 1024
    return total


def tree_memory(root: int | None = None, exclude: int | None = None) -> int:
    """``RssAnon + RssShmem`` summed over ``root`` (default: this process) and its descendants.

    ``exclude``: a process left out of the sum (the sampler itself).
    """
    pid = os.getpid() if root is None else root
    try:
        kids = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        kids = []
    return sum(_unswappable(p) for p in [pid, *kids] if p != exclude)


_SAMPLER = r"""
import sys, time
from asyncgraph.partition.memory import tree_memory
import os
root, interval = int(sys.argv[1]), float(sys.argv[2])
me, peak = os.getpid(), 0
import select
while True:
    peak = max(peak, tree_memory(root, exclude=me))
    if select.select([sys.stdin], [], [], interval)[0]:
        line = sys.stdin.readline()
        print(peak, flush=True)
        if line.strip() != "peek":
            break
"""


class PeakSampler:
    """Samples :func:`tree_memory` of a process tree every ``interval`` s; ``peak`` (bytes).

    ``with PeakSampler() as s: ...; s.peak``. The sampling runs in a small child process (its
    own memory is left out of the sum), not a thread: a C extension holding the GIL (pymetis
    does, for the whole METIS call) would stop a sampling thread exactly at the peak. Sampling
    still misses spikes shorter than the interval.
    """

    def __init__(self, root: int | None = None, interval: float = 0.05) -> None:
        self.root = os.getpid() if root is None else root
        self.interval = interval
        self.peak = 0
        self.start = 0  # the tree's memory when sampling began
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> PeakSampler:
        self.start = tree_memory(self.root)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SAMPLER, str(self.root), str(self.interval)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate("stop\n", timeout=30)
        self.peak = max(self.peak, int(out.strip() or 0), tree_memory(self.root))

    def peek(self) -> int:
        """The peak so far (the sampler keeps sampling): what ``peak`` would be now."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("peek\n")
        proc.stdin.flush()
        self.peak = max(self.peak, int(proc.stdout.readline().strip() or 0), tree_memory(self.root))
        return self.peak

    def check(self, limit: int, base: int) -> None:
        """``MemoryBudgetError`` when the peak so far is over ``limit``: a run calls this before it
        puts its output in place, so a run that went over its limit leaves nothing behind (issue
        32, item 10: the plan's estimates are the first line, this measurement the last).

        What the process tree held at the start beyond ``base`` (a fresh run's own main process)
        is the caller's, not the run's: a library call from a big process (a notebook, a test
        runner with its servers) is not charged for it."""
        peak = self.peek() - max(0, self.start - base)
        if peak > limit:
            raise MemoryBudgetError(
                f"the run's peak memory of {format_size(peak)} (all its processes) went over the "
                f"--memory-limit of {format_size(limit)}; nothing was written: raise --memory-limit "
                "or lower --workers"
            )


_WORKER_SAMPLERS: dict[str, tuple[threading.Event, list[int], threading.Thread]] = {}


def _sample_worker(token: str, interval: float) -> None:
    """On a Dask worker: sample its process tree's memory on a thread until stopped."""
    stop, peak = threading.Event(), [0]

    def loop() -> None:
        while True:
            peak[0] = max(peak[0], tree_memory())
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, daemon=True, name=f"asyncgraph-peak-{token}")
    _WORKER_SAMPLERS[token] = (stop, peak, thread)
    thread.start()


def _stop_worker(token: str) -> int:
    """On a Dask worker: stop the sampler of ``token``; its peak (0 if it never started here)."""
    entry = _WORKER_SAMPLERS.pop(token, None)
    if entry is None:
        return 0
    stop, peak, thread = entry
    stop.set()
    thread.join(timeout=10)
    return max(peak[0], tree_memory())


class DaskPeaks:
    """The peak memory of each Dask worker (its process tree) over a ``with`` block.

    Dask workers are not the run's child processes, so :class:`PeakSampler` does not see them;
    each worker samples itself on a thread (started and stopped with ``client.run``).
    ``peaks``: ``{worker address: bytes}``; their sum bounds the workers' joint peak from above
    (each worker's peak may come at another moment). No client: nothing is sampled.
    """

    def __init__(self, client: Any, interval: float = 0.05) -> None:
        self.client = client
        self.interval = interval
        self.token = uuid.uuid4().hex[:12]
        self.peaks: dict[str, int] = {}

    def __enter__(self) -> DaskPeaks:
        if self.client is not None:
            self.client.run(_sample_worker, self.token, self.interval)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.client is None:
            return
        if et is not None:  # failed or interrupted: stop the samplers, wait for nothing
            with contextlib.suppress(Exception):
                self.client.run(_stop_worker, self.token, wait=False)
            return
        self.peaks = {str(k): int(v) for k, v in self.client.run(_stop_worker, self.token).items()}
