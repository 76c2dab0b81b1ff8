"""The e2e benchmark's memory sampler and stage runner (benchmarks.e2e_memory), on real processes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks.e2e_memory import meminfo, process_start, run_stage

MIB = 1 << 20

# A child that starts a grandchild holding 96 MiB of anonymous memory and maps 64 MiB of a memfd
# (shared memory), both touched; it prints "ready" once both are resident, then both sleep.
HOLD_ANON = (
    "import time\nb = bytearray(96 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    "print('kid', flush=True)\ntime.sleep(3)"
)

TREE = f"""
import mmap, os, subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", {HOLD_ANON!r}], stdout=subprocess.PIPE, text=True)
kid.stdout.readline()
fd = os.memfd_create("e2e-memory-test")
os.ftruncate(fd, 64 << 20)
m = mmap.mmap(fd, 64 << 20)
for off in range(0, 64 << 20, 4096):
    m[off] = 1
print("ready", flush=True)
time.sleep(3)
kid.wait()
"""


def test_a_stage_counts_its_whole_process_tree_and_shared_memory(tmp_path: Path) -> None:
    run = run_stage([sys.executable, "-c", TREE], timeout=60, log=tmp_path / "tree.log", interval=0.1)
    assert run.rc == 0 and not run.timed_out, run.lines
    mem = run.memory
    assert mem["peak_tree_procs"] >= 2  # the grandchild is found through its parent
    assert mem["peak_tree_rss_bytes"] >= (96 + 64) * MIB
    assert mem["peak_tree_pss_bytes"] >= (96 + 64) * MIB * 0.9
    assert mem["peak_tree_unswappable_bytes"] >= (96 + 64) * MIB  # RssAnon + RssShmem (the memfd)
    assert mem["machine_used_peak_bytes"] > 0 and mem["shmem_peak_bytes"] > 0
    assert [line for _, line in run.lines] == ["ready"]
    assert (tmp_path / "tree.log").read_text() == "ready\n"
    assert len(run.series) >= 3 and all(len(row) == 5 for row in run.series)
    assert len(run.procs) == 2 and all(p["cmdline"][0] == sys.executable for p in run.procs.values())


def test_a_stage_past_its_timeout_is_ended_with_its_children(tmp_path: Path) -> None:
    sleeper = "import time; time.sleep(120)"
    start = f"subprocess.Popen([sys.executable, '-c', {sleeper!r}])"
    code = f"import subprocess, sys, time\n{start}\ntime.sleep(120)"
    t0 = time.monotonic()
    run = run_stage([sys.executable, "-c", code], timeout=2, log=tmp_path / "slow.log", interval=0.1)
    assert run.timed_out and run.rc != 0
    assert time.monotonic() - t0 < 30
    import psutil

    left = [pid for pid in run.procs if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert left == []  # the whole group went, the grandchild too


def test_meminfo_reads_the_machine_figures() -> None:
    m = meminfo()
    assert m["MemTotal"] > m["used"] > 0 and m["MemAvailable"] > 0 and "Shmem" in m and "Cached" in m


def test_process_start_is_the_moment_the_process_was_started() -> None:
    """To a clock tick (server start-up is measured from it; psutil's create_time is off by up
    to a second)."""
    import subprocess

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    after = time.time()
    try:
        start = process_start(child.pid)
        assert start is not None and before - 0.05 <= start <= after + 0.05, (before, start, after)
    finally:
        child.kill()
        child.wait()
    assert process_start(child.pid) is None  # gone (reaped)
