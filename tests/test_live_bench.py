"""``benchmarks/live_bench.py --quick`` runs end to end (real servers, a writer and a reader
process) and writes every figure, so the benchmark cannot rot between full runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncgraph.testing import PACKAGE_ROOT, subprocess_env


@pytest.mark.timeout(600)
def test_live_bench_quick_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.live_bench",
        "--quick",
        "--cache",
        str(tmp_path),
        "--out",
        str(out),
    ]
    run = subprocess.run(
        cmd, cwd=PACKAGE_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=540
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    plain = result["plain"]
    for key in ("static", "under_updates", "idle_after_updates"):
        assert plain[key]["requests"] > 0 and plain[key]["p99_ms"] > 0
    assert plain["under_updates"]["writer"]["edges"] > 0
    assert plain["staleness"]["seen"] == plain["staleness"]["edges"] > 0  # every edge was sampled
    comp = plain["compaction"]
    assert all(s["compactions"] == 1 and s["folded_edges"] > 0 for s in comp["servers"])
    assert comp["overlay_share_of_edges"] >= 0.1
    for mode in ("plain", "wal"):
        assert set(result[mode]["updates"]) == {"1", "100", "10000"}
        assert all(u["edges_per_s"] > 0 for u in result[mode]["updates"].values())
    assert set(result["summary"]["met"]) == {"sampling_under_updates", "staleness"}
