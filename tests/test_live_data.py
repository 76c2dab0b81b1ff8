"""Rows of a live graph's new nodes and edges (issue 35): ``add_nodes``/``add_edges`` with
``data``, then pulls and pushes of the new IDs, on real servers (over the socket, co-located
through shared memory, replicas), standalone, and after ``kill -9`` with a WAL and a snapshot.

Cora in two partitions; every check compares with the rows the test wrote (new IDs that were
given no row read zeros, DGL's default)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownTensorError,
)
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.ops import AddNodesArgs, Op
from asyncgraph.testing import ServerGroup, start_servers

T = 20.0
FEAT = "node:feat"  # the partition's own data: read-only, rows of new nodes given at add time
EMB = "node:emb"  # made at run time: writable
W = "edge:w"


class Rows:
    """What each tensor should hold for the IDs the test touched: ``name -> {id: row}``."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[int, np.ndarray]] = {FEAT: {}, EMB: {}, W: {}}

    def set(self, name: str, ids: np.ndarray, values: np.ndarray) -> None:
        for i, v in zip(ids.tolist(), values, strict=True):
            self.rows[name][i] = np.array(v)

    async def check(self, client: AsyncClient, name: str, ids: np.ndarray) -> None:
        got = await client.pull_numpy(name, ids)
        want = np.stack([self.rows[name][i] for i in ids.tolist()])
        np.testing.assert_array_equal(got, want)
        out = np.empty_like(want)  # the loaders' path: each owner writes its rows in place
        await client.pull_numpy(name, ids, out=out)
        np.testing.assert_array_equal(out, want)


async def updates(client: AsyncClient, rows: Rows, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Nodes with and without rows on both partitions, edges with rows to old and new nodes,
    pushes (assign and add) to new and old IDs together. Returns ``(node IDs, edge IDs)`` to
    check: new ones and some base ones."""
    n = client.book.num_nodes
    e = client.book.num_edges
    await client.create_tensor(W, "edge", [e, 2], "float32")  # idempotent
    await client.create_tensor(EMB, "node", [n, 4], "float32")
    base = np.array([0, 1, n - 1], dtype=np.int64)
    rows.set(FEAT, base, await client.pull_numpy(FEAT, base))
    rows.set(EMB, base, await client.pull_numpy(EMB, base))
    feats = rng.random((3, 1433), dtype=np.float32)
    a = await client.add_nodes(3, part=0, data={FEAT: feats})
    rows.set(FEAT, a, feats)
    b = await client.add_nodes(2, part=1)  # no rows given: zeros
    rows.set(FEAT, b, np.zeros((2, 1433), np.float32))
    nodes = np.concatenate([a, b])
    rows.set(EMB, nodes, np.zeros((nodes.size, 4), np.float32))
    src = np.concatenate([rng.integers(0, n, 6), nodes])
    dst = np.concatenate([nodes, rng.integers(0, n, 5), [0]])
    w = rng.random((src.size, 2), dtype=np.float32)
    eids = await client.add_edges(src, dst, data={W: w})
    rows.set(W, eids, w)
    more = await client.add_edges(nodes[:2], nodes[2:4])  # rows of ``w``: zeros
    rows.set(W, more, np.zeros((2, 2), np.float32))
    mixed = np.concatenate([b, base[:1], a[:1]])
    values = rng.random((mixed.size, 4), dtype=np.float32)
    await client.push(EMB, mixed, values)  # new and base rows in one push, both owners
    rows.set(EMB, mixed, values)
    bump = np.ones((more.size, 2), np.float32)
    await client.push(W, np.concatenate([more, more]), np.concatenate([bump, bump]), op="add")
    rows.set(W, more, 2 * bump)
    return np.concatenate([base, nodes]), np.concatenate([eids, more, [0, e - 1]])


async def _base_rows_of_w(client: AsyncClient, rows: Rows) -> None:
    e = client.book.num_edges
    rows.set(W, np.array([0, e - 1]), np.zeros((2, 2), np.float32))


@pytest.fixture
def servers(cora2: Any, tmp_path: Path) -> Any:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    yield group
    group.stop()


@pytest.mark.timeout(180)
async def test_rows_of_new_ids_served_standalone_and_colocated(cora2: Any, servers: ServerGroup) -> None:
    standalone = AsyncClient.standalone(cora2.part_config)
    shm = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    sock = await AsyncClient.connect(servers.addresses, use_shared_memory=False)
    try:
        assert shm.local_partitions() == [0, 1]
        await shm.pull_numpy(FEAT, np.arange(4))  # mapped before any update
        served, alone = Rows(), Rows()
        nodes, eids = await updates(shm, served, np.random.default_rng(1))
        nodes2, eids2 = await updates(standalone, alone, np.random.default_rng(1))
        np.testing.assert_array_equal(nodes, nodes2)  # the same new IDs
        np.testing.assert_array_equal(eids, eids2)
        for model in (served, alone):
            await _base_rows_of_w(shm, model)
        for client in (shm, sock):
            await served.check(client, FEAT, nodes)
            await served.check(client, EMB, nodes)
            await served.check(client, W, eids)
        await alone.check(standalone, FEAT, nodes)
        await alone.check(standalone, EMB, nodes)
        await alone.check(standalone, W, eids)
        # the same rows: served (socket, shared memory) = standalone
        for name, ids in ((FEAT, nodes), (EMB, nodes), (W, eids)):
            want = await standalone.pull_numpy(name, ids)
            np.testing.assert_array_equal(await sock.pull_numpy(name, ids), want)
        # a co-located reader reads them from shared memory: with both servers stopped
        for proc in servers.procs:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            for name, ids in ((FEAT, nodes), (EMB, nodes), (W, eids)):
                await asyncio.wait_for(served.check(shm, name, ids), 30.0)
        finally:
            for proc in servers.procs:
                os.kill(proc.pid, signal.SIGCONT)
        with pytest.raises(OutOfRangeError):  # a new ID not allocated yet: no row
            await sock.pull_numpy(FEAT, np.array([int(nodes.max()) + 2 * 100]))
    finally:
        for c in (shm, sock, standalone):
            await c.close()


@pytest.mark.timeout(120)
async def test_bad_data_is_typed_and_changes_nothing(servers: ServerGroup) -> None:
    client = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    try:
        n, e = client.book.num_nodes, client.book.num_edges
        await client.create_tensor(W, "edge", [e, 2], "float32")
        good = np.zeros((2, 1433), np.float32)
        bad: list[tuple[type[Exception], Any]] = [
            (UnknownTensorError, client.add_nodes(2, data={"node:nope": good})),
            (DTypeMismatchError, client.add_nodes(2, data={FEAT: good.astype(np.float64)})),
            (ShapeMismatchError, client.add_nodes(3, data={FEAT: good})),  # row count
            (ShapeMismatchError, client.add_nodes(2, data={FEAT: good[:, :5]})),  # row shape
            (InvalidRequestError, client.add_nodes(2, data={W: np.zeros((2, 2), np.float32)})),
            (InvalidRequestError, client.add_edges([0], [1], data={FEAT: good[:1]})),
            (ShapeMismatchError, client.add_edges([0, 1], [1, 2], data={W: np.zeros((3, 2), np.float32)})),
            (OutOfRangeError, client.pull_numpy(FEAT, np.array([n]))),  # never added
        ]
        for kind, call in bad:
            with pytest.raises(kind):
                await call
        stats = await client.server_stats()
        assert sum(s.get("overlay_nodes", 0) for s in stats) == 0
        assert sum(s.get("overlay_edges", 0) for s in stats) == 0
        ids = await client.add_nodes(1, part=0, data={FEAT: good[:1] + 1})
        # a hostile request straight to a server: checked there too, nothing changes
        host, port = servers.addresses[0]
        conn = await Connection.open(host, port, graph_name=None, timeout=T)
        try:
            for data, kind in (
                ({FEAT: good[:1].astype(np.float64)}, DTypeMismatchError),
                ({"node:nope": good[:1]}, UnknownTensorError),
                ({FEAT: good}, ShapeMismatchError),
            ):
                with pytest.raises(kind):
                    args = {**AddNodesArgs(1, data=data).encode(), "rid": f"bad-{kind.__name__}"}
                    await conn.call(Op.ADD_NODES, args, T)
        finally:
            conn.close()
        stats = await client.server_stats()
        assert sum(s.get("overlay_nodes", 0) for s in stats) == 1
        np.testing.assert_array_equal(await client.pull_numpy(FEAT, ids), good[:1] + 1)
    finally:
        await client.close()


@pytest.mark.timeout(180)
async def test_rows_of_new_ids_survive_kill9_exactly(cora2: Any, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=30.0)
        rows = Rows()
        rng = np.random.default_rng(4)
        nodes, eids = await updates(client, rows, rng)
        await client.snapshot()  # half the rows in a snapshot, half in the log after it
        nodes2, eids2 = await updates(client, rows, rng)
        await _base_rows_of_w(client, rows)
        nodes, eids = np.concatenate([nodes, nodes2]), np.concatenate([eids, eids2])
        for index in (0, 1):
            group.kill(index)
            group.restart(index)
        for name, ids in ((FEAT, nodes), (EMB, nodes), (W, eids)):
            await rows.check(client, name, ids)
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(180)
async def test_replicas_serve_rows_of_new_ids(cora2: Any, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, num_servers=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, use_replicas=True)
        await client.pull_numpy(FEAT, np.arange(10))  # replicas in use before the updates
        rows = Rows()
        nodes, eids = await updates(client, rows, np.random.default_rng(6))
        await _base_rows_of_w(client, rows)
        for _ in range(3):  # reads take turns over primary and replica
            for name, ids in ((FEAT, nodes), (EMB, nodes), (W, eids)):
                await rows.check(client, name, ids)
        for index in range(2, len(group.bound)):  # each replica, asked directly
            host, port = group.bound[index]
            conn = await Connection.open(host, port, graph_name=None, timeout=T)
            try:
                info = await conn.call(Op.INFO, {}, T)
                part = int(info["part_id"])
                mine = nodes[(nodes - client.book.num_nodes) % 2 == part]
                mine = mine[mine >= client.book.num_nodes]
                got = await conn.call(Op.PULL, {"name": FEAT, "ids": mine}, T)
                np.testing.assert_array_equal(np.asarray(got), await client.pull_numpy(FEAT, mine))
            finally:
                conn.close()
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(120)
def test_distgraph_data_of_new_nodes_and_edges(cora2: Any) -> None:
    """DGL's names: ``add_nodes(num, data=...)``, ``add_edges(u, v, data=...)``, then
    ``g.ndata``/``g.edata`` rows of the new IDs (standalone)."""
    import torch

    import asyncgraph

    asyncgraph.initialize()
    g = asyncgraph.DistGraph("cora", part_config=cora2.part_config)
    try:
        feats = torch.rand(2, 1433)
        new = g.add_nodes(2, data={"feat": feats}, part=1)
        assert torch.equal(g.ndata["feat"][new], feats)
        assert torch.equal(g.ndata["feat"][torch.tensor([0])], g.ndata["feat"][0:1])
        with pytest.raises(UnknownTensorError):
            g.add_edges(torch.tensor([0]), torch.tensor([1]), data={"w": torch.ones(1)})
    finally:
        asyncgraph.finalize()
