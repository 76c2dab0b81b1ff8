"""Interruptions of the out-of-core partitioner as Slurm and Kubernetes deliver them (issue 33,
item 5): SIGTERM keeps the resume state, workers die with their parent, an empty ``--resume``
says so. Real CLI runs in ``tmp_path``; the run is held inside a stage by the testing hook
``ASYNCGRAPH_PARTITION_PAUSE_IN`` (each task of that stage writes ``<mark dir>/<pid>`` and sleeps).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from _partition_helpers import make_graph

from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.stream import partition_chunked
from asyncgraph.testing import subprocess_env

PAUSE = 120.0  # seconds a paused task sleeps: far longer than any bounded wait below


@pytest.fixture(scope="module")
def cora_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chunked(make_graph("cora"), tmp_path_factory.mktemp("cora"), 2, "numpy", "cora")


def _cmd(meta: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "asyncgraph.partition", "--input", str(meta), "--num-parts", "2",
            "--method", "random", "--out", str(out), "--memory-limit", "1GiB", *extra]  # fmt: skip


def _same_tree(a: Path, b: Path) -> None:
    fa = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert fa == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert [f for f in fa if (a / f).read_bytes() != (b / f).read_bytes()] == []


def _paused(meta: Path, out: Path, marks: Path, stage: str, workers: int) -> subprocess.Popen[str]:
    """A CLI run on ``workers`` processes held inside ``stage`` until every worker is in a task."""
    marks.mkdir()
    hook = {"IN": stage, "S": str(PAUSE), "MARKS": str(marks)}
    env = {**subprocess_env(), **{f"ASYNCGRAPH_PARTITION_PAUSE_{k}": v for k, v in hook.items()}}
    proc = subprocess.Popen(_cmd(meta, out, "--workers", str(workers)), env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)  # fmt: skip
    deadline = time.monotonic() + 90
    while len(list(marks.iterdir())) < workers and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if len(list(marks.iterdir())) < workers:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"the run never paused in {stage} on {workers} workers: {err[-2000:]}")
    return proc


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    """The PIDs still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not _gone(p)]


def _kill(pids: list[int]) -> None:
    """Cleanup: SIGKILL the processes this test started that are still there (by PID)."""
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_mid_stage_keeps_state_and_resume_finishes_the_same(cora_npy: Path, tmp_path: Path) -> None:
    """SIGTERM while workers run sort tasks: exit 143 promptly, the workers stopped, the work folder
    kept with assign and shuffle recorded; ``--resume`` skips them and writes a fresh run's bytes."""
    out, marks = tmp_path / "o", tmp_path / "marks"
    proc = _paused(cora_npy, out, marks, "sort", 2)
    workers = [int(p.name) for p in marks.iterdir()]
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < PAUSE / 4  # the paused tasks were not waited for
        assert proc.returncode == 143, err
        assert _wait_gone(workers, 10) == []
        last = err.strip().splitlines()[-1]
        assert "interrupted by SIGTERM" in last and "--resume" in last and "assign, shuffle" in last, err
        state = json.loads((tmp_path / ".o.work" / "state.json").read_text())["state"]
        assert state["done"] == ["assign", "shuffle"]
        assert not out.exists()
    finally:
        _kill([proc.pid, *workers])
    res = subprocess.run(_cmd(cora_npy, out, "--workers", "2", "--resume"), capture_output=True, text=True,
                         timeout=120, env=subprocess_env())  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "assign: done by an earlier run, skipped" in res.stderr
    assert "shuffle: done by an earlier run, skipped" in res.stderr
    assert "resumed after assign, shuffle\n" in res.stderr
    partition_chunked(cora_npy, 2, tmp_path / "fresh", part_method="random", workers=1)
    _same_tree(out, tmp_path / "fresh")
    assert not (tmp_path / ".o.work").exists()


def test_sigkill_of_the_main_process_leaves_no_worker(cora_npy: Path, tmp_path: Path) -> None:
    """``kill -9`` of the partitioner: every process it started is gone within seconds."""
    proc = _paused(cora_npy, tmp_path / "o", tmp_path / "marks", "shuffle", 2)
    children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    workers = [int(p.name) for p in (tmp_path / "marks").iterdir()]
    assert set(workers) <= set(children)
    try:
        proc.kill()
        proc.wait(timeout=30)
        assert _wait_gone(children, 15) == [], "orphaned processes of the partitioner"
    finally:
        _kill(children)


def test_resume_with_nothing_to_resume_says_so_and_starts_fresh(cora_npy: Path, tmp_path: Path) -> None:
    """A requeued job passes ``--resume`` on its first run too: one line, then a whole run."""
    res = subprocess.run(_cmd(cora_npy, tmp_path / "o", "--workers", "1", "--resume"), capture_output=True,
                         text=True, timeout=120, env=subprocess_env())  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if "nothing to resume" in x]
    assert len(lines) == 1, res.stderr
    assert str(tmp_path / ".o.work") in lines[0] and "starting from the first stage" in lines[0]
    assert "resumed after" not in res.stderr
    partition_chunked(cora_npy, 2, tmp_path / "fresh", part_method="random", workers=1)
    _same_tree(tmp_path / "o", tmp_path / "fresh")
