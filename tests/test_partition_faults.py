"""The partitioner under faults: bad npz files, SIGTERM mid-write, leftovers of killed runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition import partition_graph
from asyncgraph.partition.graph import Graph
from asyncgraph.partition.output import remove_stale_temp
from asyncgraph.testing import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
CORA = ROOT / "examples" / "data" / "cora.npz"


def _cli(input_path: Path, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "asyncgraph.partition", "--input", str(input_path)]
    cmd += ["--graph-name", "g", "--num-parts", "2", "--method", "random", "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=subprocess_env(), check=False)


@pytest.mark.parametrize("kind", ["empty", "truncated", "npy"])
def test_empty_truncated_or_wrong_npz_is_one_clear_error_line(tmp_path: Path, kind: str) -> None:
    bad = tmp_path / "bad.npz"
    if kind == "empty":
        bad.write_bytes(b"")
    elif kind == "truncated":
        bad.write_bytes(CORA.read_bytes()[: CORA.stat().st_size // 2])
    else:
        with open(bad, "wb") as fh:
            np.save(fh, np.arange(3))
    with pytest.raises(InvalidRequestError, match=r"is not a readable \.npz archive"):
        Graph.from_npz(bad)
    res = _cli(bad, tmp_path / "out")
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert ": error: graph file " in errors[-1] and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def test_sigterm_mid_write_removes_the_temporary_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = (
        "import sys, time\n"
        "import asyncgraph.partition.partitioner as p\n"
        "write = p._write_rows\n"
        "def slow(*a, **k):\n"
        "    time.sleep(0.5)\n"
        "    return write(*a, **k)\n"
        "p._write_rows = slow\n"
        "from asyncgraph.partition.__main__ import main\n"
        f"sys.exit(main(['--input', {str(CORA)!r}, '--graph-name', 'g', '--num-parts', '2',"
        f" '--method', 'random', '--out', {str(out)!r}]))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env=subprocess_env(), stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".out.tmp-*")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert list(tmp_path.glob(".out.tmp-*")), "the temporary folder never appeared"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert list(tmp_path.iterdir()) == []


def test_stale_temporary_folders_of_killed_runs_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    host = socket.gethostname()
    out = tmp_path / "out"
    stale = [
        tmp_path / f".out.tmp-{dead.pid}@{host}-0123456789ab",
        tmp_path / f".out.old-{dead.pid}@{host}-ba9876543210",
    ]
    live = tmp_path / f".out.tmp-{os.getpid()}@{host}-0123456789ab"  # a run in progress
    other_host = tmp_path / f".out.tmp-{dead.pid}@not-{host}-0123456789ab"
    other_out = tmp_path / f".other.tmp-{dead.pid}@{host}-0123456789ab"
    for path in [*stale, live, other_host, other_out]:
        (path / "part0").mkdir(parents=True)
    partition_graph(Graph.from_npz(CORA), "g", 2, out, part_method="random")
    assert (out / "g.json").is_file()
    assert not any(p.exists() for p in stale)
    assert live.exists() and other_host.exists() and other_out.exists()
    assert remove_stale_temp(out) == []
