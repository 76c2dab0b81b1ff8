"""Trainer-side observability: the loader's per-epoch stats as a dict, the launcher's summary."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from asyncgraph.client import Client
from asyncgraph.client.traffic import Traffic
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import DistGraph
from asyncgraph.testing import PACKAGE_ROOT, subprocess_env


def test_loader_stats_per_epoch(cora2) -> None:
    client = Client.standalone(cora2.part_config)
    try:
        g = DistGraph("cora", client=client)
        nids = np.arange(0, g.num_nodes(), 10)
        loader = DistNodeDataLoader(g, nids, NeighborSampler([4, 3]), batch_size=50, prefetch=2, seed=1)
        for epoch in range(2):
            inputs = 0
            for input_nodes, _, _ in loader:
                inputs += len(input_nodes)
                time.sleep(0.01)  # the "compute" of this batch
            stats = loader.stats.as_dict()
            want = {"epoch", "batches", "sample", "pull", "wait", "compute", "input_nodes", "copy"}
            want |= {"feature_bytes", "host_copy_bytes", "structure_bytes"}
            want |= set(Traffic().as_dict()) | {"cache_hit_rate"}
            assert set(stats) == want
            assert stats["epoch"] == epoch
            assert stats["batches"] == len(loader)
            assert stats["input_nodes"] == inputs
            assert stats["compute"] >= 0.01 * len(loader) * 0.9
            assert stats["sample"] > 0 and stats["pull"] > 0 and stats["wait"] >= 0
    finally:
        client.close()


def launch(part_config: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``python -m asyncgraph.launch`` with 2 servers and ``python -c script`` as the trainers."""
    argv = [sys.executable, "-m", "asyncgraph.launch", "--part-config", str(part_config)]
    return subprocess.run(
        [*argv, "--", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
        cwd=PACKAGE_ROOT,
    )


def test_launcher_prints_one_summary_line_per_role(cora2, tmp_path: Path) -> None:
    script = "print('hello')"
    proc = launch(cora2.part_config, script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[launcher] summary ")]
    assert len(lines) == 2, proc.stderr[-3000:]
    server, trainer = lines
    assert re.fullmatch(
        r"\[launcher\] summary role=server count=2 exit_codes=-?\d+,-?\d+ failed=0 wall_s=\d+\.\d", server
    ), server
    assert re.fullmatch(
        r"\[launcher\] summary role=trainer count=2 exit_codes=0,0 failed=0 wall_s=\d+\.\d", trainer
    ), trainer


def test_launcher_summary_counts_a_failed_trainer(cora2) -> None:
    script = "import os, sys; sys.exit(5 if os.environ['RANK'] == '1' else 0)"
    proc = launch(cora2.part_config, script)
    assert proc.returncode == 5, proc.stderr[-3000:]
    trainer = [line for line in proc.stderr.splitlines() if "summary role=trainer" in line]
    assert len(trainer) == 1 and "failed=1" in trainer[0] and ",5 " in trainer[0] + " ", trainer
