"""Bounded work and memory before and after the handshake, against real servers (Cora, 2 parts)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import InvalidRequestError
from asyncgraph.testing import ServerGroup, start_servers

SECRET = b"limits-secret"
MAX_PENDING = 4


@pytest.fixture(scope="module")
def servers(cora2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path_factory.mktemp("limits"),
        num_parts=2,
        secret=SECRET,
        extra_args=[
            "--log-level",
            "WARNING",
            "--handshake-timeout",
            "1",
            "--max-pending-connections",
            str(MAX_PENDING),
        ],
    )
    yield group
    group.stop()


def _raw(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    sock.settimeout(5)
    return sock


def _read_until_eof(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closed ``sock`` (reads and drops its hello)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            if not sock.recv(65536):
                return time.monotonic() - t0
        except ConnectionResetError:
            return time.monotonic() - t0
    raise AssertionError(f"socket still open after {limit} s")


def test_idle_socket_closed_after_handshake_timeout(servers: ServerGroup) -> None:
    with _raw(servers.addresses[0]) as sock:
        waited = _read_until_eof(sock, 4.0)
    assert 0.5 < waited < 4.0


def test_huge_frame_before_hello_refused_from_its_prefix(servers: ServerGroup) -> None:
    with _raw(servers.addresses[0]) as sock:
        sock.sendall(struct.pack(">I", 1 << 30))  # declares 1 GiB, sends nothing more
        waited = _read_until_eof(sock, 4.0)
    assert waited < 0.5  # refused at once, not at the handshake timeout
    assert "over the limit of 16384 bytes" in servers.log_text(0)


@pytest.mark.timeout(60)
async def test_pending_cap_while_authenticated_client_served(servers: ServerGroup) -> None:
    client = await AsyncClient.connect(servers.addresses, secret=SECRET, use_shared_memory=False)
    idle = [_raw(servers.addresses[0]) for _ in range(MAX_PENDING)]
    try:
        for sock in idle:  # each got its server hello: the server counts it as pending
            assert sock.recv(65536)
        with _raw(servers.addresses[0]) as extra:
            assert _read_until_eof(extra, 0.9) < 0.9  # over the cap: closed at once
        ids = np.arange(5, dtype=np.int64) + client.book.node_range(0)[0]
        rows = await client.pull_numpy("node:feat", ids)
        assert rows.shape[0] == 5
    finally:
        for sock in idle:
            sock.close()
        await client.close()
    await asyncio.sleep(0.1)  # the closed sockets leave the pending count; new clients get in
    again = await AsyncClient.connect(servers.addresses, secret=SECRET, use_shared_memory=False)
    await again.close()


# --- after the handshake: work limits and split replies ------------------------------------------
FRAME = 1 << 20  # 1 MiB frames: a pull of every Cora feature row (15.5 MB) needs ~16 of them
MAX_EDGES = 5000


@pytest.fixture(scope="module")
def small_frames(cora2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path_factory.mktemp("frames"),
        num_parts=2,
        extra_args=[
            "--log-level",
            "WARNING",
            "--max-frame-size",
            str(FRAME),
            "--max-sampled-edges",
            str(MAX_EDGES),
            "--max-tensor-bytes",
            str(50_000_000),
        ],
    )
    yield group
    group.stop()


@pytest.mark.timeout(120)
async def test_pull_and_push_larger_than_a_frame_are_split(small_frames: ServerGroup, cora2) -> None:
    client = await AsyncClient.connect(small_frames.addresses, use_shared_memory=False, max_frame_size=FRAME)
    try:
        n = client.book.num_nodes
        ids = np.random.default_rng(0).permutation(n)
        rows = await client.pull_numpy("node:feat", ids)
        assert rows.nbytes > 10 * FRAME
        np.testing.assert_array_equal(rows, cora2.original_rows("feat", ids))
        await client.create_tensor("node:wide", "node", [n, 1433], "float32")
        values = np.random.default_rng(1).standard_normal((n, 1433)).astype(np.float32)
        await client.push("node:wide", ids, values)
        back = await client.pull_numpy("node:wide", ids)
        np.testing.assert_array_equal(back, values)
        small = await client.pull_numpy("node:feat", ids[:3])  # the connection is still in sync
        np.testing.assert_array_equal(small, cora2.original_rows("feat", ids[:3]))
    finally:
        await client.close()


@pytest.mark.timeout(120)
async def test_oversized_requests_refused_before_allocation(small_frames: ServerGroup) -> None:
    from asyncgraph.net.connection import Connection
    from asyncgraph.protocol.ops import CreateTensorArgs, Op, PullArgs, SampleArgs

    host, port = small_frames.addresses[0]
    conn = await Connection.open(host, port, graph_name=None, max_frame_size=FRAME)
    client = await AsyncClient.connect(small_frames.addresses, use_shared_memory=False, max_frame_size=FRAME)
    try:
        lo, hi = client.book.node_range(0)
        owned = np.arange(lo, hi, dtype=np.int64)
        # a raw pull over the reply limit: a typed error for that request, the connection lives on
        with pytest.raises(
            InvalidRequestError, match=r"per-request limit of \d+ bytes \(set by --max-frame-size\)"
        ):
            await conn.call(Op.PULL, PullArgs("node:feat", owned).encode(), 30)
        rows = await conn.call(Op.PULL, PullArgs("node:feat", owned[:2]).encode(), 30)
        assert np.asarray(rows).shape == (2, 1433)
        # a sample that could return fanout x seeds edges
        args = SampleArgs(owned[:50], 400000, True, 0).encode()
        with pytest.raises(InvalidRequestError, match=r"can return 20000000 edges.*--max-sampled-edges"):
            await conn.call(Op.SAMPLE, args, 30)
        with pytest.raises(InvalidRequestError, match="--max-sampled-edges"):
            await client.sample_neighbors(owned, -1)  # every in-edge of many seeds: over 5000
        src, _, _ = await client.sample_neighbors(owned[:10], 5)  # small samples still work
        assert 0 < src.size <= 50
        # a (N, 10**9) tensor: one row is 4 GB
        n = client.book.num_nodes
        with pytest.raises(InvalidRequestError, match="one row of shape"):
            await client.create_tensor("node:huge", "node", [n, 10**9], "float32")
        big = CreateTensorArgs("node:huge2", "node", [n, 100_000], "float32", None).encode()
        with pytest.raises(
            InvalidRequestError, match=r"limit of 50000000 bytes per tensor \(--max-tensor-bytes\)"
        ):
            await conn.call(Op.CREATE_TENSOR, big, 30)  # 400 KB rows fit a frame; 500 MB here do not
        names = {m["name"] for m in await conn.call(Op.LIST_TENSORS, {}, 30)}
        assert not {"node:huge", "node:huge2"} & names
        assert await conn.call(Op.PING, {}, 30) > 0
    finally:
        conn.close()
        await client.close()


# --- long operations run off the event loop ---------------------------------------------------------
@pytest.fixture(scope="module")
def one_server(pubmed1, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(pubmed1.part_config, tmp_path_factory.mktemp("offload"), num_parts=1)
    yield group
    group.stop()


@pytest.mark.timeout(120)
async def test_small_pulls_are_answered_while_a_big_init_runs(one_server: ServerGroup, pubmed1) -> None:
    creator = await AsyncClient.connect(one_server.addresses, use_shared_memory=False)
    reader = await AsyncClient.connect(one_server.addresses, use_shared_memory=False)
    try:
        n = creator.book.num_nodes
        init = {"kind": "uniform", "low": -1.0, "high": 1.0, "seed": 3}
        create = asyncio.ensure_future(creator.create_tensor("node:big", "node", [n, 3000], "float32", init))
        answered = 0
        ids = np.arange(4, dtype=np.int64)
        while not create.done() and answered < 10_000:  # pulls that finish before the 236 MB init does
            rows = await reader.pull_numpy("node:feat", ids)
            np.testing.assert_array_equal(rows, pubmed1.original_rows("feat", ids))
            answered += 1
        meta = await create
        assert answered >= 20, answered  # served inline, at most 2 pulls got through (measured: 2 vs 830)
        assert meta.shape == (n, 3000)
        # the tensor is published only once filled: every row holds its initial values
        sample_rows = await reader.pull_numpy("node:big", np.array([0, n - 1]))
        assert np.all(sample_rows != 0) and np.all(np.abs(sample_rows) <= 1)
        # a second create of the same tensor is a get (while or after the first runs)
        again = await asyncio.gather(
            creator.create_tensor("node:big2", "node", [n, 3000], "float32", init),
            reader.create_tensor("node:big2", "node", [n, 3000], "float32", init),
        )
        assert again[0] == again[1]
        np.testing.assert_array_equal(
            await reader.pull_numpy("node:big2", np.array([5, 7])),
            await reader.pull_numpy("node:big", np.array([5, 7])),
        )
    finally:
        await creator.close()
        await reader.close()


@pytest.mark.timeout(120)
async def test_big_sample_off_the_loop_equals_standalone(one_server: ServerGroup, pubmed1) -> None:
    from asyncgraph.server.handlers import OFFLOAD_SAMPLE_EDGES

    served = await AsyncClient.connect(one_server.addresses, use_shared_memory=False)
    alone = AsyncClient.standalone(pubmed1.part_config)
    try:
        seeds = np.arange(served.book.num_nodes, dtype=np.int64)
        assert seeds.size * 30 > OFFLOAD_SAMPLE_EDGES  # runs in a worker thread on the server
        big, small = await asyncio.gather(
            served.sample_neighbors(seeds, 30, replace=True, seed=11),
            served.sample_neighbors(seeds[:8], 2, seed=5),  # answered meanwhile, inline
        )
        ref = await alone.sample_neighbors(seeds, 30, replace=True, seed=11)
        for got, want in zip(big, ref, strict=True):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(small[2], (await alone.sample_neighbors(seeds[:8], 2, seed=5))[2])
    finally:
        await served.close()
        await alone.close()


@pytest.mark.timeout(120)
async def test_big_sample_with_carried_features_off_the_loop(one_server: ServerGroup, pubmed1) -> None:
    """A sample big enough to run in a worker thread still carries its rows (read on the loop),
    equal to the standalone sample and to the stored rows."""
    from asyncgraph.server.handlers import OFFLOAD_SAMPLE_EDGES

    served = await AsyncClient.connect(one_server.addresses, use_shared_memory=False)
    alone = AsyncClient.standalone(pubmed1.part_config)
    try:
        seeds = np.arange(served.book.num_nodes, dtype=np.int64)
        assert seeds.size * 30 > OFFLOAD_SAMPLE_EDGES
        got = await served.sample_with_features(seeds, 30, ["node:feat", "node:label"], replace=True, seed=4)
        want = await alone.sample_with_features(seeds, 30, ["node:feat", "node:label"], replace=True, seed=4)
        for k in range(4):
            np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_array_equal(got.ids, np.unique(np.concatenate([seeds, got.src])))
        np.testing.assert_array_equal(got.rows[0], pubmed1.original_rows("feat", got.ids))
        np.testing.assert_array_equal(got.rows[1], pubmed1.original_rows("label", got.ids))
    finally:
        await served.close()
        await alone.close()


@pytest.mark.timeout(120)
def test_carried_rows_over_the_reply_limit_are_pulled_split(small_frames: ServerGroup, cora2) -> None:
    """Rows a sample answer cannot carry within the reply limit are not carried (the server stays
    within its frames); the loader pulls them instead, split to fit: batches are unchanged."""
    from asyncgraph.client import Client
    from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
    from asyncgraph.distributed import DistGraph

    client = Client.connect(small_frames.addresses, use_shared_memory=False, max_frame_size=FRAME)
    try:
        aio = client.aio
        lo, hi = client.book.node_range(0)
        few = client.loop.run(aio.sample_with_features(np.arange(lo, lo + 20), 2, ["node:feat"], seed=1))
        assert few.ids.size >= 20  # 20 seeds and their sources: well within one reply
        np.testing.assert_array_equal(few.rows[0], cora2.original_rows("feat", few.ids))
        seeds = np.arange(lo, lo + 400)  # 400+ rows x 5,732 bytes: over a 1 MiB frame
        many = client.loop.run(aio.sample_with_features(seeds, 2, ["node:feat"], seed=1))
        assert many.ids.size == 0 and many.rows[0].shape == (0, 1433) and many.src.size > 0
        plain = client.loop.run(aio.sample_neighbors(seeds, 2, seed=1))
        for got, want in zip(many[:3], plain, strict=True):
            np.testing.assert_array_equal(got, want)
        g = DistGraph("cora", client=client)
        loader = DistNodeDataLoader(g, np.arange(lo, hi), NeighborSampler([3, 2]), 400, shuffle=False)
        batches = 0
        for input_nodes, _, blocks in loader:
            feats = blocks[0].srcdata["feat"].numpy()
            np.testing.assert_array_equal(feats, cora2.original_rows("feat", input_nodes.numpy()))
            batches += 1
        assert batches == len(loader) > 0
    finally:
        client.close()
