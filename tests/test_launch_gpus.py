"""Trainers per host follow the host's GPUs, not its partitions (issue 31, item 4).

On a host with one GPU and two partitions the launcher used to start two trainers, both on
``cuda:0`` (NCCL: "Duplicate GPU detected"). Checked on CPU with an explicit GPU count: the
launcher trusts the count, and the probe trainer (``tests/workers/launch_probe.py``) writes the
environment it got and pulls from every partition without touching CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from asyncgraph.distributed import ddp_backend, resolve_device
from asyncgraph.launch.processes import TrainerSlot, plan_trainers
from asyncgraph.testing import PACKAGE_ROOT, subprocess_env

PROBE = PACKAGE_ROOT / "tests" / "workers" / "launch_probe.py"


@pytest.fixture(scope="module")
def cora1(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Cora in one partition, shaped like conftest's ``cora2`` (what the checks below read)."""
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    out = tmp_path_factory.mktemp("cora1") / "out"
    data = PACKAGE_ROOT / "examples" / "data" / "cora.npz"
    orig_nids, _ = partition_graph(Graph.from_npz(data), "cora", 1, out, return_mapping=True)
    return SimpleNamespace(
        part_config=out / "cora.json", raw=dict(np.load(data)), orig_nids=np.asarray(orig_nids)
    )


def _launch(part_config: Path, out: Path, *opts: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "asyncgraph.launch", "--part-config", str(part_config), *opts]
    cmd += ["--", sys.executable, str(PROBE), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=PACKAGE_ROOT)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("gpus", [1, 2])
def test_one_trainer_per_gpu_of_the_host_whatever_its_partitions(
    request: pytest.FixtureRequest, tmp_path: Path, parts: int, gpus: int
) -> None:
    graph = request.getfixturevalue(f"cora{parts}")
    proc = _launch(graph.part_config, tmp_path, "--num-gpus-per-host", str(gpus))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = sorted(
        (json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")), key=lambda r: int(r["env"]["RANK"])
    )
    # one host (every partition here): as many trainers as it has GPUs, each on its own GPU
    assert len(records) == gpus, proc.stderr[-3000:]
    envs = [r["env"] for r in records]
    assert [e["RANK"] for e in envs] == [str(r) for r in range(gpus)]
    assert {e["WORLD_SIZE"] for e in envs} == {str(gpus)}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {str(gpus)}
    assert sorted(e["LOCAL_RANK"] for e in envs) == [str(r) for r in range(gpus)]
    for e in envs:
        assert e["ASYNCGRAPH_DEVICE"] == f"cuda:{e['LOCAL_RANK']}"
        assert int(e["LOCAL_RANK"]) < gpus
        assert e["ASYNCGRAPH_DDP_BACKEND"] == "nccl"
        assert e["CUDA_VISIBLE_DEVICES"] is None  # device indices, not masks: each sees every GPU
        assert e["OMP_NUM_THREADS"] is not None
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", envs[0]["MASTER_PORT"])}
    assert 0 < int(envs[0]["MASTER_PORT"]) < 65536
    # every trainer reaches every partition, and the trainers' shares cover all training nodes
    train = np.flatnonzero(graph.raw["train_mask"][graph.orig_nids])
    for rec in records:
        assert len(rec["first_ids"]) == parts
        want = graph.raw["feat"][graph.orig_nids[rec["first_ids"]]]
        np.testing.assert_array_equal(np.asarray(rec["rows"], np.float32), want)
    shares = [np.asarray(r["train_share"], np.int64) for r in records]
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), train)


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_more_trainers_than_gpus_on_a_host_is_one_line_naming_both(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # 1 trainer per partition x 2 partitions on this host, 1 GPU: the old launcher's duplicate
    proc = _launch(cora2.part_config, tmp_path, "--num-gpus-per-host", "1", "--num-trainers", "1")
    _one_line_error(proc, "2 trainers", "1 GPU", "127.0.0.1")
    proc = _launch(cora2.part_config, tmp_path, "--num-gpus-per-host", "2", "--num-trainers", "3")
    _one_line_error(proc, "6 trainers", "2 GPUs")
    assert not list(tmp_path.iterdir())  # no trainer started


def test_an_explicit_trainer_count_within_the_gpus_is_kept(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = _launch(cora2.part_config, tmp_path, "--num-gpus-per-host", "2", "--num-trainers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    envs = [json.loads(p.read_text())["env"] for p in sorted(tmp_path.glob("rank*.json"))]
    placed = sorted((e["LOCAL_RANK"], e["ASYNCGRAPH_DEVICE"]) for e in envs)
    assert placed == [("0", "cuda:0"), ("1", "cuda:1")]


def _layout(slots: list[TrainerSlot]) -> list[tuple[str, int, int, str]]:
    return [(s.host, s.local_rank, s.local_world_size, s.device) for s in slots]


def test_trainer_plan_across_hosts_one_or_two_partitions_and_gpus_each() -> None:
    # 1 partition per host (DGL's deployment) and 2 per host; 1 and 2 GPUs per host
    one_each, two_each = ["a", "b"], ["a", "a", "b", "b"]
    for hosts in (one_each, two_each):
        assert _layout(plan_trainers(hosts, per_partition=None, gpus_per_host=1)) == [
            ("a", 0, 1, "cuda:0"), ("b", 0, 1, "cuda:0"),
        ]  # fmt: skip
        assert _layout(plan_trainers(hosts, per_partition=None, gpus_per_host=2)) == [
            ("a", 0, 2, "cuda:0"), ("a", 1, 2, "cuda:1"), ("b", 0, 2, "cuda:0"), ("b", 1, 2, "cuda:1"),
        ]  # fmt: skip
    # an explicit count is per partition, on the GPUs in order
    assert _layout(plan_trainers(two_each, per_partition=1, gpus_per_host=2)) == [
        ("a", 0, 2, "cuda:0"), ("a", 1, 2, "cuda:1"), ("b", 0, 2, "cuda:0"), ("b", 1, 2, "cuda:1"),
    ]  # fmt: skip
    # CPU trainers: per partition as before, local ranks counted per host
    assert _layout(plan_trainers(["a", "b", "a"], per_partition=2, gpus_per_host=None)) == [
        ("a", 0, 4, "cpu"), ("a", 1, 4, "cpu"), ("b", 0, 2, "cpu"), ("b", 1, 2, "cpu"),
        ("a", 2, 4, "cpu"), ("a", 3, 4, "cpu"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"4 trainers on b .*2 GPUs"):
        plan_trainers(["a", "b", "b"], per_partition=2, gpus_per_host=2)


def test_trainer_device_choice_and_nccl_only_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """What examples/train_dist.py --device uses: auto is the launcher's choice, a bare cuda
    is this trainer's GPU (cuda:LOCAL_RANK, not every trainer's cuda:0), and DDP uses nccl
    exactly when the device is CUDA."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("ASYNCGRAPH_DEVICE", "cuda:1")  # a GPU launch
    monkeypatch.setenv("ASYNCGRAPH_DDP_BACKEND", "nccl")
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert ddp_backend(resolve_device("auto")) == ddp_backend() == "nccl"
    assert resolve_device("cpu") == torch.device("cpu") and ddp_backend(torch.device("cpu")) == "gloo"
    monkeypatch.setenv("ASYNCGRAPH_DEVICE", "cpu")  # a CPU launch
    monkeypatch.setenv("ASYNCGRAPH_DDP_BACKEND", "gloo")
    assert resolve_device("auto") == torch.device("cpu") and ddp_backend(resolve_device("auto")) == "gloo"
    assert resolve_device("cuda") == torch.device("cuda", 1)  # the trainer picks its own GPU
    assert ddp_backend(resolve_device("cuda")) == "nccl"
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")
