"""``benchmarks/serve_bench.py --scale N`` (issue 36: figures on DGL's 2^20 graph): the option
generates the synthetic graph, partitions it, serves it and writes a result, here at 2^10 with a
short, slow load over two serve processes sharing a port (the 2^20 figure itself is a benchmark
run, not a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncgraph.testing import PACKAGE_ROOT, subprocess_env


@pytest.mark.timeout(400)
@pytest.mark.parametrize("generator", ["frames", "client"])
def test_serve_bench_runs_on_a_synthetic_graph(tmp_path: Path, generator: str) -> None:
    """Both load generators (pre-encoded frames on sockets; ``AsyncInferenceClient``)."""
    cmd = [
        sys.executable, "-m", "benchmarks.serve_bench", "--scale", "10", "--data-dir", str(tmp_path / "data"),
        "--results-dir", str(tmp_path / "results"), "--partition-method", "random", "--rates", "20",
        "--seconds", "0.5", "--connections", "4", "--hidden", "8", "--name", "t", "--serve-procs", "2",
        "--generator", generator,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=PACKAGE_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=380
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "results" / "t.json").read_text())
    assert result["graph"] == "synth10.npz" and result["partition_method"] == "random"
    assert result["serve_procs"] == 2  # two processes on one msgpack port, their metrics summed
    (point,) = result["points"]
    assert point["ok"] == 10 and not point["errors"] and point["p99_ms"] > 0  # 20/s for 0.5 s
    assert result["generator"] == generator and len(point["timeline"]) == 1
    assert {"steal_ms", "steal_max_cpu_ms"} <= set(point["timeline"][0])  # the VM's, per window
    assert point["windows"] == 1 and point["quiet_windows"] in (0, 1)
    assert (tmp_path / "results" / "t.png").is_file()
    from benchmarks.serve_bench import npz_shape

    with np.load(tmp_path / "data" / "synth10.npz") as raw:
        assert npz_shape(tmp_path / "data" / "synth10.npz", "feat") == raw["feat"].shape == (1024, 128)
