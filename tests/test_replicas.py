"""Several server processes per partition (issue 9, item 6): replicas over the primary's memory.

Real servers: each PubMed partition gets a primary and a replica (``start_servers(num_servers=2)``).
Clients that reach a partition over the socket spread reads and pushes over both; tensors the
primary creates or deletes later are seen by the replica (catalog generation); ops that change
the catalog are refused by a replica with a message naming its primary; a lost replica leaves
the primary serving; a replica whose primary dies exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.client.replicated import ReplicatedPartition
from asyncgraph.errors import InvalidRequestError, UnknownTensorError
from asyncgraph.launch.processes import process_alive, replica_args
from asyncgraph.net.connection import Connection
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol.ops import Op, PullArgs, PushArgs
from asyncgraph.testing import ServerGroup, start_servers


@pytest.fixture
def replicated(pubmed2: Any, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(pubmed2.part_config, tmp_path / "srv", num_parts=2, num_servers=2)
    yield group
    group.stop()


async def _raw(address: tuple[str, int]) -> Connection:
    return await Connection.open(address[0], address[1], graph_name=None, secret=None, timeout=10.0)


async def _served(conn: Connection) -> int:
    stats = await conn.call(Op.STATS, {}, 10.0)
    return int(stats["requests_served"])


def test_replica_args_drop_only_primary_options() -> None:
    args = [
        "--state-dir",
        "/s",
        "--wal",
        "--wal-fsync=interval",
        "--max-frame-size",
        "9",
        "--snapshot-interval",
        "5",
    ]
    assert replica_args(args) == ["--max-frame-size", "9"]
    assert replica_args(["--state-dir=/s", "--metrics-port=0"]) == ["--metrics-port=0"]


def test_process_alive() -> None:
    assert process_alive(os.getpid())
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not process_alive(proc.pid)


async def test_reads_and_pushes_take_turns_over_primary_and_replica(
    replicated: ServerGroup, pubmed2: Any
) -> None:
    client = await AsyncClient.connect(replicated.addresses, use_shared_memory=False)
    replicas = [await _raw(a) for a in replicated.bound[2:]]
    try:
        assert all(isinstance(p, ReplicatedPartition) for p in client.partitions)
        info = await client.info(0)
        assert info["role"] == "primary" and info["replicas"] == [replicated.bound[2][1]]
        before = [await _served(c) for c in replicas]
        ids = np.arange(0, client.book.num_nodes, 97)
        for _ in range(10):
            got = (await client.pull("node:feat", ids)).numpy()
            np.testing.assert_array_equal(got, pubmed2.original_rows("feat", ids))
        after = [await _served(c) for c in replicas]
        # 10 pulls to each partition, alternating primary and replica: 5 each (+1: the STATS call)
        assert [a - b for a, b in zip(after, before, strict=True)] == [6, 6]

        await client.create_tensor("emb", "node", [client.book.num_nodes, 3], "float32")
        values = np.arange(ids.size * 3, dtype=np.float32).reshape(-1, 3)
        for k in range(4):  # pushes alternate too; every read sees the last one
            await client.push("emb", ids, values + k)
            for _ in range(2):
                np.testing.assert_array_equal((await client.pull("emb", ids)).numpy(), values + k)
    finally:
        await client.close()
        for c in replicas:
            c.close()


async def test_replica_follows_the_primary_catalog(replicated: ServerGroup) -> None:
    client = await AsyncClient.connect(replicated.addresses, use_shared_memory=False)
    replica = await _raw(replicated.bound[2])  # partition 0's replica, asked directly
    try:
        n = client.book.num_nodes
        ids = np.arange(0, 50)
        await client.create_tensor("t", "node", [n, 2], "int64")
        await client.push("t", ids, np.ones((50, 2), dtype=np.int64))
        rows = await replica.call(Op.PULL, PullArgs("t", ids).encode(), 10.0)
        np.testing.assert_array_equal(np.asarray(rows), 1)

        await client.delete_tensor("t")
        with pytest.raises(UnknownTensorError):
            await replica.call(Op.PULL, PullArgs("t", ids).encode(), 10.0)

        # the same name and shape again: new memory, which the replica must map afresh
        await client.create_tensor("t", "node", [n, 2], "int64")
        await client.push("t", ids, np.full((50, 2), 7, dtype=np.int64))
        rows = await replica.call(Op.PULL, PullArgs("t", ids).encode(), 10.0)
        np.testing.assert_array_equal(np.asarray(rows), 7)
        listed = await replica.call(Op.LIST_TENSORS, {}, 10.0)
        assert "t" in {m["name"] for m in listed}
    finally:
        await client.close()
        replica.close()


async def test_replica_refuses_catalog_ops_and_keeps_serving(replicated: ServerGroup) -> None:
    replica = await _raw(replicated.bound[3])  # partition 1's replica
    primary = f"127.0.0.1:{replicated.addresses[1][1]}"
    try:
        info = await replica.call(Op.INFO, {}, 10.0)
        assert info["role"] == "replica" and info["primary"] == primary and info["shm"] is None
        create = {"name": "x", "policy": "node", "shape": [info["num_nodes"], 1], "dtype": "float32"}
        for op, args in [
            (Op.CREATE_TENSOR, create),
            (Op.DELETE_TENSOR, {"name": "node:feat"}),
            (Op.BARRIER, {"name": "b", "timeout": 1.0}),
            (Op.ADD_REPLICA, {"port": 1, "pid": 1}),
        ]:
            with pytest.raises(
                InvalidRequestError, match=f"replica of partition 1; send {op} to its primary {primary}"
            ):
                await replica.call(op, args, 10.0)
        lo, _ = RangePartitionBook.from_dict(info["book"]).node_range(1)
        rows = await replica.call(Op.PULL, PullArgs("node:feat", np.arange(lo, lo + 5)).encode(), 10.0)
        assert np.asarray(rows).shape[0] == 5
        assert await replica.call(Op.PING, {}, 10.0) > 0
    finally:
        replica.close()


async def test_lost_replica_leaves_the_primary_serving(replicated: ServerGroup, pubmed2: Any) -> None:
    client = await AsyncClient.connect(replicated.addresses, use_shared_memory=False)
    try:
        replicated.kill(2)  # partition 0's replica
        ids = np.arange(0, 40)
        for _ in range(4):
            got = (await client.pull("node:feat", ids)).numpy()
            np.testing.assert_array_equal(got, pubmed2.original_rows("feat", ids))
        part = client.partitions[0]
        assert (
            isinstance(part, ReplicatedPartition) and part.replicas == [] and part._members == [part.primary]
        )
        assert (await client.info(0))["replicas"] == []

        # the replica comes back on its port: the next refresh finds it and it serves again
        replicated.restart(2)
        part.refresh_interval, part._next_refresh = 0.1, 0.0
        deadline = time.monotonic() + 20
        while not part.replicas and time.monotonic() < deadline:
            await client.pull("node:feat", ids)
            await asyncio.sleep(0.05)
        assert len(part.replicas) == 1, replicated.log_text(2)
        replica = await _raw(replicated.bound[2])
        try:
            before = await _served(replica)
            for _ in range(6):
                np.testing.assert_array_equal(
                    (await client.pull("node:feat", ids)).numpy(), pubmed2.original_rows("feat", ids)
                )
            assert await _served(replica) - before >= 3 + 1  # half the pulls, and the STATS call
        finally:
            replica.close()
    finally:
        await client.close()


def test_replica_exits_when_its_primary_dies(replicated: ServerGroup) -> None:
    replicated.kill(1, signal.SIGKILL)
    proc = replicated.procs[3]
    deadline = time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.returncode == 1, replicated.log_text(3)
    assert "went away" in replicated.log_text(3)


async def test_durable_primary_takes_every_push(pubmed2: Any, tmp_path: Path) -> None:
    group = start_servers(
        pubmed2.part_config,
        tmp_path / "srv",
        num_parts=2,
        num_servers=2,
        extra_args=["--state-dir", str(tmp_path / "state"), "--wal"],
    )
    replica = await _raw(group.bound[2])
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    try:
        assert all(isinstance(p, ReplicatedPartition) and p.writes_via_primary for p in client.partitions)
        n = client.book.num_nodes
        ids = np.arange(0, 10)
        await client.create_tensor("w", "node", [n], "float32")
        with pytest.raises(InvalidRequestError, match="primary logs every write"):
            await replica.call(
                Op.PUSH, PushArgs("w", ids, np.ones(10, dtype=np.float32), "assign").encode(), 10.0
            )
        for k in range(3):
            await client.push("w", ids, np.full(10, k, dtype=np.float32))
        rows = await replica.call(Op.PULL, PullArgs("w", ids).encode(), 10.0)
        np.testing.assert_array_equal(np.asarray(rows), 2)
    finally:
        await client.close()
        replica.close()
        group.stop()


async def test_colocated_clients_see_each_others_deletes(pubmed2: Any, tmp_path: Path) -> None:
    """A tensor deleted (or re-created) by one trainer is gone (or new) for a co-located other."""
    group = start_servers(pubmed2.part_config, tmp_path / "srv", num_parts=2)
    a = await AsyncClient.connect(group.addresses)
    b = await AsyncClient.connect(group.addresses)
    try:
        assert all(p.store is not None for p in b.partitions)  # both through shared memory
        n = a.book.num_nodes
        ids = np.arange(0, n, 1000)
        await a.create_tensor("c", "node", [n], "int32")
        await a.push("c", ids, np.full(ids.size, 3, dtype=np.int32))
        np.testing.assert_array_equal((await b.pull("c", ids)).numpy(), 3)
        await a.delete_tensor("c")
        with pytest.raises(UnknownTensorError):
            await b.pull("c", ids)
        await a.create_tensor("c", "node", [n], "int32")
        await a.push("c", ids, np.full(ids.size, 5, dtype=np.int32))
        np.testing.assert_array_equal((await b.pull("c", ids)).numpy(), 5)
    finally:
        await a.close()
        await b.close()
        group.stop()


def test_concurrent_add_pushes_through_primary_and_replica_all_count(replicated: ServerGroup) -> None:
    """Two trainers over the socket push ``add`` to the same rows; their pushes alternate between
    each partition's primary and replica, which write the same memory under the shared lock."""
    from asyncgraph.client import Client

    root = Path(__file__).resolve().parent.parent
    client = Client.connect(replicated.addresses, use_shared_memory=False)
    try:
        n = client.book.num_nodes
        client.create_tensor("node:counter", "node", [n, 2], "float64")
        rounds = 60
        procs = [
            subprocess.Popen(
                [sys.executable, str(root / "tests" / "workers" / "push_add.py"),
                 str(replicated.ip_config()), "", str(rounds), str(seed), "0"],
                env={**os.environ, "PYTHONPATH": str(root)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for seed in (1, 2)
        ]  # fmt: skip
        expected = np.zeros((n, 2))
        for proc, seed in zip(procs, (1, 2), strict=True):
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            rng = np.random.default_rng(seed)
            for _ in range(rounds):
                ids = rng.integers(0, 64, 50)
                ids[::2] += n - 64
                np.add.at(expected, ids, 1.0)
        touched = np.unique(np.concatenate([np.arange(64), np.arange(n - 64, n)]))
        np.testing.assert_array_equal(client.pull("node:counter", touched).numpy(), expected[touched])
    finally:
        client.close()


def test_launcher_runs_two_servers_per_partition(cora2: Any) -> None:
    root = Path(__file__).resolve().parent.parent
    cmd = [
        sys.executable, "-m", "asyncgraph.launch", "--part-config", str(cora2.part_config),
        "--num-servers", "2", "--", sys.executable, str(root / "tests" / "workers" / "replica_trainer.py"),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, timeout=180, env={**os.environ, "PYTHONPATH": str(root)}, cwd=root
    )
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, out
    assert "replicated partitions: 2" in out
