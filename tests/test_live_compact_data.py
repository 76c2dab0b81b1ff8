"""Compaction carries rows of new IDs (issue 35): rows of added nodes and appended edges
written before, while and after a compaction folds read back exactly, served (socket and
co-located) and standalone, and after ``kill -9`` + ``--wal`` (a snapshot of a compacted overlay
holds them). Cora in two partitions on real server processes; the rows the test wrote are the
model (``test_live_data.Rows``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_live_data import EMB, FEAT, Rows, W, _base_rows_of_w, updates

from asyncgraph import failpoints
from asyncgraph.client import AsyncClient
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.ops import Op
from asyncgraph.testing import ServerGroup, start_servers

T = 20.0
LATE = "node:late"  # made while a compaction folds


@pytest.fixture
def servers(cora2: Any, tmp_path: Path) -> Any:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    yield group
    group.stop()


async def check_all(rows: Rows, clients: list[AsyncClient], nodes: np.ndarray, eids: np.ndarray) -> None:
    for client in clients:
        for name, ids in ((FEAT, nodes), (EMB, nodes), (W, eids)):
            await rows.check(client, name, ids)


async def after_compaction(client: AsyncClient, rows: Rows, eids: np.ndarray) -> None:
    """Rows written to a compacted partition: pushes to folded new edges and new nodes."""
    folded = eids[eids >= client.book.num_edges][:4]
    values = np.full((folded.size, 2), 7.5, np.float32)
    await client.push(W, folded, values)
    rows.set(W, folded, values)


@pytest.mark.timeout(240)
async def test_rows_of_new_ids_read_the_same_across_compactions(cora2: Any, servers: ServerGroup) -> None:
    standalone = AsyncClient.standalone(cora2.part_config)
    shm = await asyncio.wait_for(AsyncClient.connect(servers.addresses, use_shared_memory=True), T)
    sock = await asyncio.wait_for(AsyncClient.connect(servers.addresses, use_shared_memory=False), T)
    try:
        await shm.pull_numpy(FEAT, np.arange(4))  # mapped before any update
        served, alone = Rows(), Rows()
        got = [await updates(shm, served, np.random.default_rng(1))]
        got2 = [await updates(standalone, alone, np.random.default_rng(1))]
        for model in (served, alone):
            await _base_rows_of_w(shm, model)
        for _ in range(2):  # a compaction, rows written to the compacted partitions, another
            await shm.compact()
            await standalone.compact()
            nodes, eids = (np.concatenate(parts) for parts in zip(*got, strict=True))
            await check_all(served, [shm, sock], nodes, eids)
            await check_all(alone, [standalone], nodes, eids)
            await after_compaction(sock, served, eids)
            await after_compaction(standalone, alone, eids)
            got.append(await updates(sock, served, np.random.default_rng(2)))  # add_edges(data=) too
            got2.append(await updates(standalone, alone, np.random.default_rng(2)))
            nodes, eids = (np.concatenate(parts) for parts in zip(*got, strict=True))
            await check_all(served, [shm, sock], nodes, eids)
            await check_all(alone, [standalone], nodes, eids)
        assert [s["compactions"] for s in await sock.server_stats()] == [2, 2]
        for name, ids in ((FEAT, nodes), (EMB, nodes), (W, eids)):  # served = standalone
            want = await standalone.pull_numpy(name, ids)
            np.testing.assert_array_equal(await sock.pull_numpy(name, ids), want)
        ids = np.arange(10, dtype=np.int64)  # out-edge reads of compacted partitions: answered
        np.testing.assert_array_equal(await sock.degrees(ids, "out"), await standalone.degrees(ids, "out"))
    finally:
        for c in (shm, sock, standalone):
            await c.close()


async def write_while_folding(client: AsyncClient, rows: Rows, rng: np.random.Generator) -> int:
    """Compact (each fold sleeps a second: the failpoint) while rows of new nodes and edges are
    added, pushed and made for a new tensor; how many writes were acknowledged meanwhile."""
    n = client.book.num_nodes
    await client.create_tensor(W, "edge", [client.book.num_edges, 2], "float32")
    await client.create_tensor(EMB, "node", [n, 4], "float32")
    known = await client.add_nodes(2, part=0)
    rows.set(EMB, known, np.zeros((2, 4), np.float32))
    compacting = asyncio.ensure_future(client.compact())
    during = 0
    await asyncio.sleep(0.2)  # the capture is done: the fold is sleeping
    while not compacting.done():
        feats = rng.random((2, 1433), dtype=np.float32)
        nodes = await client.add_nodes(2, part=int(rng.integers(2)), data={FEAT: feats})
        rows.set(FEAT, nodes, feats)
        src, dst = rng.integers(0, n, 3), np.concatenate([nodes, rng.integers(0, n, 1)])
        w = rng.random((3, 2), dtype=np.float32)
        rows.set(W, await client.add_edges(src, dst, data={W: w}), w)
        emb = rng.random((3, 4), dtype=np.float32)
        ids = np.concatenate([known, nodes[:1]])
        await client.push(EMB, ids, emb)  # rows that were folded, and rows added meanwhile
        rows.set(EMB, ids, emb)
        if during == 0:  # a tensor made meanwhile: its area is new after the capture
            await client.create_tensor(LATE, "node", [n, 3], "float32")
            rows.rows[LATE] = {}
        late = rng.random((nodes.size, 3), dtype=np.float32)
        await client.push(LATE, nodes, late)
        rows.set(LATE, nodes, late)
        during += not compacting.done()
        assert during < 100
        await asyncio.sleep(0.015)  # paced: the bound holds however fast a write is
    await compacting
    return during


@pytest.mark.timeout(240)
async def test_rows_written_during_a_compaction_are_kept_and_survive_kill9(
    cora2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(failpoints.ENV, "compaction.fold=sleep")
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=30.0)
        rows = Rows()
        rng = np.random.default_rng(5)
        got = [await updates(client, rows, rng)]
        await client.snapshot()  # rows before the compaction in a snapshot; it is in the log
        assert await write_while_folding(client, rows, rng) >= 1
        await _base_rows_of_w(client, rows)

        async def check() -> None:
            for name, table in rows.rows.items():
                ids = np.array(sorted(table), dtype=np.int64)
                if ids.size:
                    await rows.check(client, name, ids)

        await check()
        got.append(await updates(client, rows, rng))  # rows of a compacted partition, logged
        await after_compaction(client, rows, np.concatenate([got[0][1], got[1][1]]))
        await check()
        for index in (0, 1):
            group.kill(index)
            group.restart(index)
        await check()  # the snapshot before the compaction + the log with it
        assert [s["compactions"] for s in await client.server_stats()] == [1, 1]
        await client.snapshot()  # a snapshot of the compacted overlay, with its rows
        got.append(await updates(client, rows, rng))
        for index in (0, 1):
            group.kill(index)
            group.restart(index)
        await check()
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(180)
async def test_replicas_serve_the_carried_rows(cora2: Any, tmp_path: Path) -> None:
    """Same-host replicas map the primary's compacted overlay with its rows of new IDs."""
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, num_servers=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, use_replicas=True)
        await client.pull_numpy(FEAT, np.arange(10))  # replicas in use before the updates
        rows = Rows()
        got = [await updates(client, rows, np.random.default_rng(6))]
        await _base_rows_of_w(client, rows)
        await client.compact()
        got.append(await updates(client, rows, np.random.default_rng(7)))
        nodes, eids = (np.concatenate(parts) for parts in zip(*got, strict=True))
        for _ in range(3):  # reads take turns over primary and replica
            await check_all(rows, [client], nodes, eids)
        for index in range(2, len(group.bound)):  # each replica, asked directly
            host, port = group.bound[index]
            conn = await Connection.open(host, port, graph_name=None, timeout=T)
            try:
                part = int((await conn.call(Op.INFO, {}, T))["part_id"])
                book = client.book
                for name, ids, base in ((FEAT, nodes, book.num_nodes), (W, eids, book.num_edges)):
                    mine = ids[(ids >= base) & ((ids - base) % 2 == part)]
                    answer = await conn.call(Op.PULL, {"name": name, "ids": mine}, T)
                    np.testing.assert_array_equal(np.asarray(answer), await client.pull_numpy(name, mine))
            finally:
                conn.close()
        await client.close()
    finally:
        group.stop()


def test_the_fold_estimate_counts_the_carried_rows(cora2: Any) -> None:
    """``fold_bytes`` (what ``--memory-budget`` checks before a compaction) counts the rows of
    new IDs the fold copies: at least what the folded overlay holds."""
    from asyncgraph.partition import load_partition
    from asyncgraph.service.live import LiveStructure
    from asyncgraph.service.live_compact import compact_now
    from asyncgraph.storage.compaction import fold_bytes
    from asyncgraph.storage.store import PartitionStore

    estimates, held = [], []
    for data in (None, {FEAT: np.ones((3000, 1433), np.float32)}):
        with PartitionStore.from_partition(load_partition(cora2.part_config, 0), shared=False) as store:
            live = LiveStructure(store)
            live.add_nodes(3000, data=data)
            live.add_edges(np.arange(50), np.arange(50))
            assert store.overlay is not None
            estimates.append(fold_bytes(store.overlay, store.indptr))
            held.append(int(compact_now(live)["bytes"]))
            assert estimates[-1] >= held[-1]
    assert estimates[1] - estimates[0] >= 3000 * 1433 * 4
    assert held[1] - held[0] >= 3000 * 1433 * 4  # carried
