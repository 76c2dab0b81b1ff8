"""End-to-end: the launcher, seed coverage across trainers, and training accuracy (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from asyncgraph.testing import shm_entries

ROOT = Path(__file__).resolve().parent.parent

LAUNCH = [sys.executable, "-m", "asyncgraph.launch"]
TRAIN = [sys.executable, str(ROOT / "examples" / "train_dist.py")]


def run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def result_of(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "RESULT " in line]
    assert lines, proc.stdout[-3000:]
    return json.loads(lines[-1].split("RESULT ", 1)[1])  # type: ignore[no-any-return]


def test_every_training_seed_is_visited_exactly_once_per_epoch(cora2, tmp_path: Path) -> None:
    proc = run(
        [
            *LAUNCH,
            "--part-config",
            str(cora2.part_config),
            "--num-trainers",
            "2",
            "--",
            sys.executable,
            str(ROOT / "tests" / "workers" / "visit_seeds.py"),
            str(tmp_path),
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[trainer 3]" in proc.stdout + proc.stderr or len(list(tmp_path.glob("nids_r*.npy"))) == 4
    train = np.flatnonzero(cora2.raw["train_mask"][cora2.orig_nids])
    shares = [np.load(tmp_path / f"nids_r{r}.npy") for r in range(4)]
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # force_even
    for epoch in range(2):
        visited = np.concatenate([np.load(tmp_path / f"seeds_r{r}_e{epoch}.npy") for r in range(4)])
        assert len(visited) == len(train)
        np.testing.assert_array_equal(np.sort(visited), train)
    assert shm_entries() == set()


def test_launcher_stops_everything_when_a_trainer_fails(cora2, tmp_path: Path) -> None:
    script = (
        "import os, sys, time, pathlib\n"
        f"pathlib.Path({str(tmp_path)!r}, 'pid' + os.environ['RANK']).write_text(str(os.getpid()))\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(1.0); sys.exit(3)\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    proc = run(
        [
            *LAUNCH,
            "--part-config",
            str(cora2.part_config),
            "--num-trainers",
            "2",
            "--",
            sys.executable,
            "-c",
            script,
        ],
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert elapsed < 30
    assert "trainer 1 failed with status 3" in proc.stderr
    pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
    assert len(pids) == 4
    time.sleep(0.2)
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids
    )
    assert "server 0" in proc.stdout + proc.stderr  # output prefixed by role and rank


@pytest.mark.parametrize(
    ("dataset", "fixture", "threshold", "epochs"),
    [
        ("pubmed", "pubmed2", 0.74, 40),
        ("cora", "cora2", 0.76, 40),
    ],
)
def test_launched_training_accuracy_matches_standalone(
    dataset: str, fixture: str, threshold: float, epochs: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """2 partitions x 2 trainers vs one standalone process, same hyper-parameters and seed."""
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    parted = request.getfixturevalue(fixture)
    one = tmp_path / "one"
    partition_graph(Graph.from_npz(ROOT / "examples" / "data" / f"{dataset}.npz"), dataset, 1, one)
    common = ["--epochs", str(epochs), "--no-progress", "--seed", "0", "--num-threads", "1"]
    alone = result_of(run([*TRAIN, "--part-config", str(one / f"{dataset}.json"), *common]))
    launched = result_of(
        run([*LAUNCH, "--part-config", str(parted.part_config), "--num-trainers", "2", "--", *TRAIN, *common])
    )
    assert launched["world_size"] == 4
    assert float(launched["test_acc"]) >= threshold, launched  # type: ignore[arg-type]
    assert float(alone["test_acc"]) >= threshold, alone  # type: ignore[arg-type]
    assert abs(float(launched["test_acc"]) - float(alone["test_acc"])) <= 0.03, (alone, launched)  # type: ignore[arg-type]


def test_launcher_restarts_a_killed_server_from_its_state(cora2, tmp_path: Path) -> None:
    """--restart-servers: server 0 is SIGKILLed mid-loop, restarted from --state-dir with its WAL,
    and the trainers ride through; every push-add is counted exactly once."""
    proc = run(
        [
            *LAUNCH,
            "--part-config",
            str(cora2.part_config),
            "--restart-servers",
            "1",
            "--reconnect-window",
            "60",
            f"--server-arg=--state-dir={tmp_path / 'state'}",
            "--server-arg=--wal",
            "--",
            sys.executable,
            str(ROOT / "tests" / "workers" / "ride_restart.py"),
        ],
        timeout=240,
    )
    result = result_of(proc)
    assert result["total"] == result["expected"]
    assert "restarting it from its state" in proc.stderr


def test_launcher_refuses_restarts_without_a_state_folder(cora2) -> None:
    proc = run([*LAUNCH, "--part-config", str(cora2.part_config), "--restart-servers", "1", "--", "true"])
    assert proc.returncode == 2
    assert "needs servers with a state folder" in proc.stderr


@pytest.fixture(scope="module")
def cora_train_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cora in 2 partitions with ``train_mask`` as its only mask, as many real data sets come."""
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    with np.load(ROOT / "examples" / "data" / "cora.npz") as z:
        ndata = {k: z[k] for k in ("feat", "label", "train_mask")}
        graph = Graph(ndata["label"].shape[0], z["src"], z["dst"], ndata)
    out = tmp_path_factory.mktemp("cora_train_only")
    partition_graph(graph, "cora", 2, out)
    return out / "cora.json"


def test_train_dist_trains_a_graph_with_a_train_mask_only(cora_train_only: Path) -> None:
    """The issue's command (--eval-every 0) read val_mask anyway and failed; standalone it now
    trains without reading the masks it does not need."""
    common = [
        "--epochs",
        "1",
        "--max-batches",
        "2",
        "--eval-every",
        "0",
        "--no-progress",
        "--num-threads",
        "1",
    ]
    alone = result_of(run([*TRAIN, "--part-config", str(cora_train_only), *common], timeout=180))
    assert alone["world_size"] == 1 and alone["final_loss"] is not None


def test_launched_training_skips_the_missing_masks_and_says_so_once(cora_train_only: Path) -> None:
    """2 servers x 1 trainer with evaluation on: validation and test are skipped, and the skipped
    masks are named in one line (rank 0's), not once per trainer."""
    common = ["--epochs", "2", "--max-batches", "2", "--no-progress", "--num-threads", "1"]
    proc = run(
        [*LAUNCH, "--part-config", str(cora_train_only), "--num-trainers", "1", "--", *TRAIN, *common],
        timeout=180,
    )
    result = result_of(proc)
    assert result["world_size"] == 2 and result["final_loss"] is not None
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "has no val_mask, test_mask" in line]
    assert len(said) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert shm_entries() == set()
