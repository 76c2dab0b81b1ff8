"""Memory of a process tree and of the machine, sampled while one stage of a benchmark runs.

Used by ``benchmarks.e2e_scale`` (and its DGL counterpart, so it needs only the standard library
and psutil). Per sample, summed over the stage's root process and all its descendants:

* ``rss``: resident pages (a page shared by N processes counts N times);
* ``pss``: proportional set size (``/proc/PID/smaps_rollup``: a shared page counts 1/N in each),
  the tree's own memory with shared memory and page cache counted once;
* ``unswappable``: ``RssAnon + RssShmem``, what the kernel cannot drop (the partitioner's limit);

and for the whole machine (``/proc/meminfo``): ``used`` = MemTotal - MemAvailable, ``shmem``
(shared memory: memfds, tmpfs, /dev/shm) and ``cached`` (page cache, shmem included). The issue
that asked for this counts page cache and shared memory apart, hence both. Sampling runs on a
thread of the benchmark's own process (the stages are child processes), every ``interval`` s;
spikes shorter than that are missed.

``run_stage`` runs one stage (a command, in its own session so a timeout can end the whole
group it started) under a :class:`TreeSampler`, with its output time-stamped line by line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

#: Machine-wide figures taken from /proc/meminfo (kB there, bytes here).
MEMINFO_KEYS = ("MemTotal", "MemAvailable", "Shmem", "Cached")


def meminfo() -> dict[str, int]:
    """``MEMINFO_KEYS`` of ``/proc/meminfo`` in bytes, plus ``used`` (MemTotal - MemAvailable)."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in MEMINFO_KEYS:
                out[key] = int(rest.split()[0]) * 1024
    out["used"] = out["MemTotal"] - out["MemAvailable"]
    return out


def _status_fields(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssShmem of one process in bytes (empty if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssShmem"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def _pss(pid: int) -> int:
    """Pss of one process in bytes (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def process_start(pid: int) -> float | None:
    """When ``pid`` started, in epoch seconds, to a clock tick (psutil's ``create_time`` adds the
    boot time, known to a whole second only): its age on the boot clock subtracted from now."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - (uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant."""
    try:
        return [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    except psutil.Error:
        return []


def tree_memory(root: int, pss: bool = True) -> dict[str, int]:
    """``rss``, ``pss`` (0 unless ``pss``), ``unswappable`` summed over ``root``'s tree, and
    ``procs``: how many processes were counted."""
    total = {"rss": 0, "pss": 0, "unswappable": 0, "procs": 0}
    for pid in tree_pids(root):
        st = _status_fields(pid)
        if not st:
            continue
        total["procs"] += 1
        total["rss"] += st.get("VmRSS", 0)
        total["unswappable"] += st.get("RssAnon", 0) + st.get("RssShmem", 0)
        if pss:
            total["pss"] += _pss(pid)
    return total


@dataclass
class TreeSampler:
    """Samples :func:`tree_memory` of ``root`` and :func:`meminfo` on a thread.

    ``with TreeSampler(pid) as s: ...``; then ``s.peak`` (the maximum of each figure),
    ``s.before`` (the machine figures when sampling started), ``s.series`` (``[t, tree pss,
    tree rss, machine used, shmem]`` rows, ``t`` in seconds since the start) and ``s.procs``
    (``pid -> {"start": create time (epoch s), "cmdline": [...]}`` of every process seen).
    """

    root: int
    interval: float = 0.25
    pss: bool = True
    peak: dict[str, int] = field(default_factory=dict)
    before: dict[str, int] = field(default_factory=dict)
    series: list[list[float]] = field(default_factory=list)
    procs: dict[int, dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def sample(self) -> None:
        """One sample: the tree and the machine, folded into ``peak`` and ``series``."""
        for pid in tree_pids(self.root):
            try:  # the command line again each time: a child seen between fork and exec changes it
                cmdline = psutil.Process(pid).cmdline()
            except psutil.Error:
                continue
            seen = self.procs.get(pid, {})
            start = seen.get("start") or process_start(pid)
            if start is not None:  # an exiting process (a zombie) reads as []: keep what it was
                self.procs[pid] = {"start": start, "cmdline": cmdline or seen.get("cmdline", [])}
        tree = tree_memory(self.root, self.pss)
        machine = meminfo()
        now = {**{f"tree_{k}": v for k, v in tree.items()}, **machine}
        for k, v in now.items():
            self.peak[k] = max(self.peak.get(k, 0), v)
        self.series.append(
            [
                round(time.monotonic() - self._t0, 3),
                tree["pss"],
                tree["rss"],
                machine["used"],
                machine["Shmem"],
            ]
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeSampler:
        self._t0 = time.monotonic()
        self.before = meminfo()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # the tree may be gone by now; the machine is not

    def summary(self) -> dict[str, Any]:
        """Peaks and the machine's figures before, for the results JSON."""
        return {
            "peak_tree_pss_bytes": self.peak.get("tree_pss", 0),
            "peak_tree_rss_bytes": self.peak.get("tree_rss", 0),
            "peak_tree_unswappable_bytes": self.peak.get("tree_unswappable", 0),
            "peak_tree_procs": self.peak.get("tree_procs", 0),
            "machine_used_before_bytes": self.before.get("used", 0),
            "machine_used_peak_bytes": self.peak.get("used", 0),
            "shmem_before_bytes": self.before.get("Shmem", 0),
            "shmem_peak_bytes": self.peak.get("Shmem", 0),
            "cached_before_bytes": self.before.get("Cached", 0),
            "cached_peak_bytes": self.peak.get("Cached", 0),
            "samples": len(self.series),
            "interval_s": self.interval,
        }


@dataclass
class StageRun:
    """What :func:`run_stage` saw: exit status, wall time, memory, and the output's lines with
    the wall-clock time (epoch s) each arrived."""

    rc: int
    wall_s: float
    t0: float
    memory: dict[str, Any]
    series: list[list[float]]
    procs: dict[int, dict[str, Any]]
    lines: list[tuple[float, str]]
    timed_out: bool


def run_stage(
    cmd: Sequence[str],
    *,
    timeout: float,
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    interval: float = 0.25,
    pss: bool = True,
) -> StageRun:
    """Run ``cmd`` (stdout and stderr into ``log``), sampling its process tree; past ``timeout``
    seconds its process group (which this call started) gets SIGTERM, then SIGKILL."""
    lines: list[tuple[float, str]] = []
    t0 = time.time()
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
        bufsize=1,
    )

    def read() -> None:
        assert proc.stdout is not None
        with open(log, "w") as out:
            for line in proc.stdout:
                lines.append((time.time(), line.rstrip("\n")))
                out.write(line)
                out.flush()

    reader = threading.Thread(target=read, name="stage-output", daemon=True)
    reader.start()
    timed_out = False
    with TreeSampler(proc.pid, interval=interval, pss=pss) as sampler:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _end_group(proc)
    wall = time.perf_counter() - start
    reader.join(30)
    return StageRun(
        proc.returncode, wall, t0, sampler.summary(), sampler.series, sampler.procs, lines, timed_out
    )


def _end_group(proc: subprocess.Popen[str], grace: float = 15.0) -> None:
    """SIGTERM the process group ``proc`` leads (started by :func:`run_stage`), then SIGKILL;
    returns once the leader has exited and no other member of the group is left running (a
    child signalled with the leader may still be alive for a moment after the leader is reaped)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        while _group_running(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not _group_running(proc.pid):
            return


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is alive and not a zombie (``/proc``)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            return True
    return False
