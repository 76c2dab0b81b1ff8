"""Trainers started by any launcher: rank from torchrun/srun variables, servers from the
environment, and connecting that waits for servers started later (real servers, real sockets)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import asyncgraph
from asyncgraph.distributed.context import parse_server_list
from asyncgraph.env import ENV_CONNECT_TIMEOUT, ENV_IP_CONFIG, ProcessRank, process_rank
from asyncgraph.errors import AuthenticationError, InvalidRequestError, ServersMissingError
from asyncgraph.launch.processes import free_port
from asyncgraph.testing import start_servers, subprocess_env

WORKERS = Path(__file__).resolve().parent / "workers"


# --- pure parts ---------------------------------------------------------------------------------
def test_rank_from_torchrun_wins_over_slurm() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert process_rank(env) == ProcessRank(3, 4, 1, "torchrun")


def test_rank_from_srun() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    assert process_rank(env) == ProcessRank(5, 8, 1, "slurm")


def test_rank_default_single_process() -> None:
    assert process_rank({}) == ProcessRank(0, 1, 0, "default")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, r"\$RANK must be an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 of world size 2"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, "slurm environment"),
    ],
)
def test_rank_rejects_bad_values(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        process_rank(env)


def test_server_list_spellings() -> None:
    assert parse_server_list("a:1, b:2\nc") == [("a", 1), ("b", 2), ("c", 30050)]
    with pytest.raises(ValueError, match=r"the port \(field 2\) is not in \[1, 65535\]"):
        parse_server_list("a:0")


def test_connect_timeout_from_env_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCGRAPH_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv(ENV_CONNECT_TIMEOUT, "soon")
    with pytest.raises(InvalidRequestError, match=ENV_CONNECT_TIMEOUT):
        asyncgraph.initialize()


# --- real servers -------------------------------------------------------------------------------
def test_missing_servers_named_after_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = [free_port(), free_port()]
    monkeypatch.setenv("ASYNCGRAPH_SERVERS", ",".join(f"127.0.0.1:{p}" for p in ports))
    monkeypatch.setenv(ENV_CONNECT_TIMEOUT, "0.8")
    t0 = time.monotonic()
    with pytest.raises(ServersMissingError) as info:
        asyncgraph.initialize()
    assert 0.7 < time.monotonic() - t0 < 30
    message = str(info.value)
    assert "2 of 2 servers unreachable" in message
    assert f"partition 0 at 127.0.0.1:{ports[0]}" in message
    assert f"partition 1 at 127.0.0.1:{ports[1]}" in message
    assert [m[:2] for m in info.value.missing] == [(0, f"127.0.0.1:{ports[0]}"), (1, f"127.0.0.1:{ports[1]}")]


def test_trainer_started_before_servers(cora2, tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    ip_config = tmp_path / "ip_config.txt"
    ip_config.write_text("".join(f"127.0.0.1 {p}\n" for p in ports))
    outcome: dict[str, object] = {}

    def trainer() -> None:
        try:
            asyncgraph.initialize(ip_config, connect_timeout=90)
            g = asyncgraph.DistGraph("cora")
            outcome["rows"] = tuple(g.ndata["feat"][[0, g.num_nodes() - 1]].shape)
        except BaseException as exc:  # reported to the test thread below
            outcome["error"] = exc
        finally:
            asyncgraph.finalize()

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    time.sleep(1.0)  # the trainer is already retrying
    assert thread.is_alive() and not outcome, outcome
    group = start_servers(cora2.part_config, tmp_path / "late", num_parts=2, ports=ports)
    try:
        thread.join(timeout=90)
        assert not thread.is_alive()
        assert "error" not in outcome, outcome
        assert outcome["rows"] == (2, 1433)
    finally:
        group.stop()


def test_wrong_secret_is_not_retried(cora2, tmp_path: Path) -> None:
    group = start_servers(cora2.part_config, tmp_path / "auth", num_parts=2, secret=b"right")
    try:
        t0 = time.monotonic()
        with pytest.raises(AuthenticationError):
            asyncgraph.initialize(group.ip_config(), secret=b"wrong", connect_timeout=60)
        assert time.monotonic() - t0 < 30  # failed on the first answer, not at the deadline
        asyncgraph.finalize()
    finally:
        group.stop()


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="torchrun not installed"
)
def test_torchrun_against_separately_started_servers(cora2, tmp_path: Path) -> None:
    """torchrun --standalone starts 2 trainers (gloo DDP); the servers were started on their own."""
    group = start_servers(cora2.part_config, tmp_path / "servers", num_parts=2, num_clients=2)
    out = tmp_path / "out"
    out.mkdir()
    try:
        env = {**subprocess_env(), ENV_IP_CONFIG: str(group.ip_config()), "OMP_NUM_THREADS": "1"}
        for name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "ASYNCGRAPH_SERVERS",
        ):
            env.pop(name, None)
        torchrun = str(Path(sys.executable).parent / "torchrun")
        proc = subprocess.run(
            [
                torchrun,
                "--standalone",
                "--nproc-per-node",
                "2",
                str(WORKERS / "torchrun_trainer.py"),
                str(out),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert [(r["rank"], r["world_size"], r["local_rank"], r["source"]) for r in records] == [
            (0, 2, 0, "torchrun"),
            (1, 2, 1, "torchrun"),
        ]
        assert all(r["replicas_equal"] for r in records)  # DDP kept the replicas in step
        assert records[0]["first_seed"] != records[1]["first_seed"]  # node_split used the ranks
        assert all(r["num_seeds"] > 0 for r in records)
    finally:
        group.stop()


def test_refusal_ends_the_wait_while_another_server_is_missing(cora2, tmp_path: Path) -> None:
    """A wrong secret is final: no waiting out the deadline for a server that is still missing."""
    group = start_servers(cora2.part_config, tmp_path / "one", num_parts=1, secret=b"right")
    try:
        servers = ",".join([f"127.0.0.1:{free_port()}", f"{group.addresses[0][0]}:{group.addresses[0][1]}"])
        os.environ["ASYNCGRAPH_SERVERS"] = servers
        t0 = time.monotonic()
        with pytest.raises(AuthenticationError):
            asyncgraph.initialize(secret=b"wrong", connect_timeout=120)
        assert time.monotonic() - t0 < 60
        asyncgraph.finalize()
    finally:
        os.environ.pop("ASYNCGRAPH_SERVERS", None)
        group.stop()
