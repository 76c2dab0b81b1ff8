"""Server and client against real server processes on ephemeral loopback ports (PubMed, 2 parts)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncgraph.client import AsyncClient, Client
from asyncgraph.errors import (
    AuthenticationError,
    BarrierTimeoutError,
    DTypeMismatchError,
    FrameTooLargeError,
    OutOfRangeError,
    ServerUnavailableError,
    ShapeMismatchError,
    TensorExistsError,
    UnknownOpError,
    UnknownTensorError,
)
from asyncgraph.net.connection import Connection
from asyncgraph.testing import ServerGroup, shm_entries, start_servers

ROOT = Path(__file__).resolve().parent.parent

SECRET = b"test-secret-please-ignore"


@pytest.fixture(scope="module")
def servers(pubmed2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(
        pubmed2.part_config,
        tmp_path_factory.mktemp("servers"),
        num_parts=2,
        num_clients=2,
        secret=SECRET,
        # pushes into node:feat below (the partition's own data is read-only by default)
        extra_args=["--max-frame-size", str(8 << 20), "--writable-partition-data"],
    )
    yield group
    group.stop()
    assert all(p.returncode == 0 for p in group.procs), [group.log_text(i) for i in range(2)]


async def connect(group: ServerGroup, **kwargs: object) -> AsyncClient:
    return await AsyncClient.connect(group.addresses, secret=SECRET, max_frame_size=8 << 20, **kwargs)  # type: ignore[arg-type]


# --- pulls and pushes ------------------------------------------------------------------------
@pytest.mark.parametrize("shared_memory", [True, False])
async def test_pull_matches_original_features(servers: ServerGroup, pubmed2, shared_memory: bool) -> None:
    client = await connect(servers, use_shared_memory=shared_memory)
    try:
        assert client.local_partitions() == ([0, 1] if shared_memory else [])
        n = client.book.num_nodes
        rng = np.random.default_rng(0)
        ids = rng.integers(0, n, 5000)
        cases = [
            ids,
            np.concatenate([ids[:10], ids[:10], ids[:3]]),  # duplicates
            np.empty(0, dtype=np.int64),  # empty
            ids.astype(np.int32),  # int32
            torch.from_numpy(ids[:100]),  # torch
            np.array([0, n - 1, 0]),  # edges of the range, both partitions
        ]
        for case in cases:
            got = await client.pull("node:feat", case)
            assert isinstance(got, torch.Tensor)
            expected = pubmed2.original_rows("feat", np.asarray(case))
            assert got.shape == (len(case), 500)
            np.testing.assert_array_equal(got.numpy(), expected)
        labels = await client.pull("node:label", ids)
        np.testing.assert_array_equal(labels.numpy(), pubmed2.original_rows("label", ids))
    finally:
        await client.close()


async def test_push_assign_then_pull(servers: ServerGroup) -> None:
    client = await connect(servers)
    try:
        n = client.book.num_nodes
        await client.create_tensor("node:scratch_assign", "node", [n, 3], "float32")
        ids = np.array([5, n - 2, 100, 5])  # duplicate: last wins
        values = np.arange(12, dtype=np.float32).reshape(4, 3)
        await client.push("node:scratch_assign", ids, values)
        got = (await client.pull("node:scratch_assign", [5, n - 2, 100, 6])).numpy()
        np.testing.assert_array_equal(got[0], values[3])
        np.testing.assert_array_equal(got[1], values[1])
        np.testing.assert_array_equal(got[2], values[2])
        np.testing.assert_array_equal(got[3], np.zeros(3, np.float32))
    finally:
        await client.close()


def test_concurrent_add_from_two_processes_gives_exact_sum(servers: ServerGroup, tmp_path: Path) -> None:
    """Two trainer processes push ``add`` to overlapping rows (shared memory + socket)."""
    client = Client.connect(servers.addresses, secret=SECRET)
    try:
        n = client.book.num_nodes
        client.create_tensor("node:counter", "node", [n, 2], "float64")
        script = ROOT / "tests" / "workers" / "push_add.py"
        rounds = 100
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    str(servers.ip_config()),
                    SECRET.decode(),
                    str(rounds),
                    str(seed),
                    shm,
                ],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for seed, shm in ((1, "1"), (2, "0"))
        ]
        expected = np.zeros((n, 2))
        for proc, seed in zip(procs, (1, 2), strict=True):
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            rng = np.random.default_rng(seed)
            for _ in range(rounds):
                ids = rng.integers(0, 64, 50)  # heavy overlap, both partitions, duplicates
                ids[::2] += n - 64
                np.add.at(expected, ids, 1.0)
        got = client.pull("node:counter", np.arange(n)).numpy()
        np.testing.assert_array_equal(got, expected)
    finally:
        client.close()


# --- barrier ---------------------------------------------------------------------------------
async def test_barrier_releases_all_and_times_out_naming_arrivals(servers: ServerGroup) -> None:
    a, b = await connect(servers), await connect(servers)
    try:
        for _ in range(3):  # reusable across generations
            await asyncio.gather(a.barrier("b1", 10), b.barrier("b1", 10))
        with pytest.raises(BarrierTimeoutError, match=r"1 of 2 clients arrived"):
            await a.barrier("b2", timeout=0.5)
        await asyncio.gather(a.barrier("b2", 10), b.barrier("b2", 10))  # counting still right
    finally:
        await a.close()
        await b.close()


# --- tensors ---------------------------------------------------------------------------------
async def test_named_tensor_reuse_and_mismatch(servers: ServerGroup) -> None:
    client = await connect(servers)
    try:
        n = client.book.num_nodes
        init = {"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 3}
        await client.create_tensor("node:emb", "node", [n, 4], "float32", init)
        before = (await client.pull("node:emb", np.arange(0, n, 97))).numpy()
        assert before.min() >= -1 and before.max() <= 1 and before.std() > 0.1
        await client.create_tensor("node:emb", "node", [n, 4], "float32", init)  # same: reuse
        np.testing.assert_array_equal((await client.pull("node:emb", np.arange(0, n, 97))).numpy(), before)
        with pytest.raises(TensorExistsError, match="emb"):
            await client.create_tensor("node:emb", "node", [n, 5], "float32")
        with pytest.raises(TensorExistsError):
            await client.create_tensor("node:emb", "node", [n, 4], "float64")
        await client.delete_tensor("node:emb")
        with pytest.raises(UnknownTensorError):
            await client.pull("node:emb", [0])
    finally:
        await client.close()


# --- standalone equals served ------------------------------------------------------------------
async def test_standalone_results_identical_to_server_results(servers: ServerGroup, pubmed2) -> None:
    served = await connect(servers)
    alone = AsyncClient.standalone(pubmed2.part_config)
    try:
        ids = np.random.default_rng(5).integers(0, served.book.num_nodes, 3000)
        for name in ("node:feat", "node:label", "node:train_mask"):
            np.testing.assert_array_equal(
                (await served.pull(name, ids)).numpy(), (await alone.pull(name, ids)).numpy()
            )
        seeds = ids[:500]
        for replace in (False, True):
            s1 = await served.sample_neighbors(seeds, 5, replace=replace, seed=42)
            s2 = await alone.sample_neighbors(seeds, 5, replace=replace, seed=42)
            for x, y in zip(s1, s2, strict=True):
                np.testing.assert_array_equal(x, y)
    finally:
        await served.close()
        await alone.close()


# --- bad input ------------------------------------------------------------------------------
async def _raw_conn(group: ServerGroup, part: int = 0) -> Connection:
    host, port = group.addresses[part]
    return await Connection.open(host, port, graph_name="pubmed", secret=SECRET, max_frame_size=8 << 20)


async def test_bad_requests_get_typed_errors_and_change_nothing(servers: ServerGroup, pubmed2) -> None:
    conn = await _raw_conn(servers, 0)
    client = await connect(servers, use_shared_memory=False)
    try:
        start, end = client.book.node_range(0)
        ids = np.arange(start, start + 10)
        before = (await client.pull("node:feat", ids)).numpy().copy()
        bad_calls = [
            (OutOfRangeError, "pull", {"name": "node:feat", "ids": np.array([end + 5])}),
            (OutOfRangeError, "pull", {"name": "node:feat", "ids": np.array([-1])}),
            (
                OutOfRangeError,
                "push",
                {
                    "name": "node:feat",
                    "ids": np.array([start, end]),
                    "values": np.zeros((2, 500), np.float32),
                },
            ),
            (
                ShapeMismatchError,
                "push",
                {"name": "node:feat", "ids": ids, "values": np.zeros((10, 499), np.float32)},
            ),
            (
                ShapeMismatchError,
                "push",
                {"name": "node:feat", "ids": ids, "values": np.zeros((9, 500), np.float32)},
            ),
            (
                DTypeMismatchError,
                "push",
                {"name": "node:feat", "ids": ids, "values": np.zeros((10, 500), np.float64)},
            ),
            (DTypeMismatchError, "pull", {"name": "node:feat", "ids": np.array([0.5])}),
            (UnknownTensorError, "pull", {"name": "node:nope", "ids": ids}),
            (UnknownOpError, "frobnicate", {}),
        ]
        for exc_type, op, args in bad_calls:
            with pytest.raises(exc_type) as info:
                await conn.call(op, args, 10)
            assert str(info.value), f"{op} error has no message"
        # the client validates before sending anything: no partial writes across partitions
        n = client.book.num_nodes
        with pytest.raises(OutOfRangeError):
            await client.push("node:feat", [start, n], np.ones((2, 500), np.float32))
        with pytest.raises(DTypeMismatchError):
            await client.push("node:feat", ids, np.ones((10, 500), np.int64))
        after = (await client.pull("node:feat", ids)).numpy()
        np.testing.assert_array_equal(before, after)
        np.testing.assert_array_equal(after, pubmed2.original_rows("feat", ids))
    finally:
        conn.close()
        await client.close()


async def test_garbage_bytes_close_only_that_connection(servers: ServerGroup, pubmed2) -> None:
    client = await connect(servers, use_shared_memory=False)
    try:
        host, port = servers.addresses[0]
        for payload in (b"\x00\x00\x00\x10" + os.urandom(16), os.urandom(64), b"GET / HTTP/1.1\r\n\r\n"):
            reader, writer = await asyncio.open_connection(host, port)
            await reader.readexactly(struct.unpack(">I", await reader.readexactly(4))[0])  # server hello
            writer.write(payload)
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 5)  # the server closes: EOF
            assert len(data) < 10_000
            writer.close()
        ids = np.arange(0, client.book.num_nodes, 1000)
        got = await client.pull("node:feat", ids)
        np.testing.assert_array_equal(got.numpy(), pubmed2.original_rows("feat", ids))
    finally:
        await client.close()


async def test_oversized_frames_are_refused(servers: ServerGroup) -> None:
    client = await connect(servers, use_shared_memory=False)
    try:
        n = client.book.num_nodes
        ids = np.arange(5000) % n
        # 10 MB > the 8 MiB limit: the client splits the pull and the push into calls that fit
        rows = await client.pull_numpy("node:feat", ids)
        assert rows.shape == (5000, 500)
        await client.push("node:feat", ids, rows)  # the same values: the stored data is unchanged
        big = np.zeros((5000, 500), np.float32)
        host, port = servers.addresses[1]
        conn = await Connection.open(host, port, graph_name="pubmed", secret=SECRET, max_frame_size=1 << 30)
        with pytest.raises(FrameTooLargeError, match="over the limit"):  # refused, then hung up
            await conn.call("push", {"name": "node:feat", "ids": np.arange(5000), "values": big}, 10)
        assert conn.closed
        conn.close()
        with socket.create_connection((host, port)) as raw:  # a declared 1 GiB body: refused before reading
            raw.recv(4096)
            raw.sendall(struct.pack(">I", 1 << 30))
            raw.settimeout(5)
            assert b"frame" in raw.recv(4096) + raw.recv(4096)
        assert (await client.pull("node:feat", [0])).shape == (1, 500)
    finally:
        await client.close()


async def test_wrong_secret_and_wrong_graph_are_refused(servers: ServerGroup) -> None:
    host, port = servers.addresses[0]
    with pytest.raises(AuthenticationError, match="secret"):
        await Connection.open(host, port, graph_name="pubmed", secret=b"wrong")
    with pytest.raises(AuthenticationError, match="secret"):
        await Connection.open(host, port, graph_name="pubmed", secret=None)
    with pytest.raises(AuthenticationError, match="graph"):
        await Connection.open(host, port, graph_name="cora", secret=SECRET)
    conn = await _raw_conn(servers)
    assert (await conn.call("info", {}, 5))["graph_name"] == "pubmed"
    conn.close()


# --- failures --------------------------------------------------------------------------------
async def test_killed_server_fails_calls_fast_and_leaks_no_shared_memory(pubmed2, tmp_path: Path) -> None:
    group = start_servers(pubmed2.part_config, tmp_path / "victims", num_parts=2)
    try:
        client = await AsyncClient.connect(group.addresses)
        remote = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        assert (await client.pull("node:feat", [0, client.book.num_nodes - 1])).shape == (2, 500)
        group.kill(1)
        ids = np.array([client.book.num_nodes - 1])
        for c in (remote, client):
            t0 = time.monotonic()
            with pytest.raises(ServerUnavailableError, match=f"{group.addresses[1][1]}"):
                while time.monotonic() - t0 < 10:  # later calls fail once the loss is noticed
                    await c.pull("node:feat", ids)
                    await asyncio.sleep(0.02)
            assert time.monotonic() - t0 < 5
            with pytest.raises(ServerUnavailableError):
                await c.sample_neighbors(ids, 3)
        await client.close()
        await remote.close()
    finally:
        group.stop()
    assert shm_entries() == set()
