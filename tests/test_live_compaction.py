"""Compaction of a live graph (issue 35): the overlay folded into a new CSC, on real servers.

Cora in two partitions, served by real server processes and standalone. Every check compares
against the model of ``test_live_graph`` (the base edges and the acknowledged updates): before
and after a compaction the live edge sets, in-degrees and endpoints of base and new IDs agree,
reads running during one never fail, a co-located reader follows the swap, a replica follows
its primary, and ``kill -9`` + ``--wal`` restores the compacted layout exactly.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_live_graph import Model, _copy, base_model, check_equals_model, update_sequence

from asyncgraph.client import AsyncClient
from asyncgraph.errors import MemoryBudgetError, UnknownEdgeError
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.ops import Op
from asyncgraph.testing import ServerGroup, start_servers

__all__ = ["base_model"]  # the fixture, shared with test_live_graph

T = 20.0


@pytest.fixture
def servers(cora2: Any, tmp_path: Path) -> Any:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    yield group
    group.stop()


async def more_updates(client: AsyncClient, model: Model, rng: np.random.Generator) -> None:
    """After a compaction: remove folded base and new edges, add edges (new slots), remove some."""
    live = np.array(sorted(model.edges), dtype=np.int64)
    gone = np.concatenate([live[live < model.num_base_edges][5::41], live[live >= model.num_base_edges][::7]])
    await client.remove_edges(gone)
    model.remove(gone)
    src, dst = rng.integers(0, model.num_nodes, 120), rng.integers(0, model.num_nodes, 120)
    added = await client.add_edges(src, dst)
    model.add(added, src, dst)
    await client.remove_edges(added[::9])
    model.remove(added[::9])


async def stats(client: AsyncClient) -> list[dict[str, Any]]:
    return await client.server_stats()


@pytest.mark.timeout(240)
async def test_compaction_keeps_every_live_edge_and_id(
    cora2: Any, servers: ServerGroup, base_model: Model
) -> None:
    """Served (co-located and socket readers) and standalone: the same updates, a compaction,
    more updates, a second compaction: the graph equals the model after each step, new edge IDs
    keep resolving, the overlay's counts drop, and a fixed seed samples alike on both."""
    standalone = AsyncClient.standalone(cora2.part_config)
    shm = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    sock = await AsyncClient.connect(servers.addresses, use_shared_memory=False)
    try:
        served, alone = _copy(base_model), _copy(base_model)
        await shm.sample_neighbors(np.arange(50), 3, seed=1)  # mapped before the updates
        for client, model in ((shm, served), (standalone, alone)):
            await update_sequence(client, model, np.random.default_rng(5))
        await check_equals_model(shm, served)  # the co-located reader maps the overlay now
        before = [i["overlay_edges"] for i in await stats(sock)]
        assert sum(before) > 300
        done = await sock.compact()
        assert [d["compactions"] for d in done] == [1, 1]
        assert sum(d["folded_edges"] for d in done) == len(served.edges)
        await standalone.compact()
        info = await stats(sock)
        assert [i["overlay_edges"] for i in info] == [0, 0] and [i["compactions"] for i in info] == [1, 1]
        assert [i["overlay_dead"] for i in info] == [0, 0]
        for client, model in ((shm, served), (sock, served), (standalone, alone)):
            await check_equals_model(client, model)  # base and new IDs, degrees, fanout -1 sets
        seeds = np.arange(0, base_model.num_nodes, 3)  # nothing since the fold: the static kernels
        want = await standalone.sample_neighbors(seeds, 2, seed=11)
        for client in (shm, sock):
            for a, b in zip(await client.sample_neighbors(seeds, 2, seed=11), want, strict=True):
                np.testing.assert_array_equal(a, b)
        rng_s, rng_a = np.random.default_rng(9), np.random.default_rng(9)
        await more_updates(shm, served, rng_s)
        await more_updates(standalone, alone, rng_a)
        assert served.edges == alone.edges  # the slots after the compaction continue
        for client, model in ((shm, served), (sock, served), (standalone, alone)):
            await check_equals_model(client, model)
        await shm.compact()
        await standalone.compact()
        for client, model in ((shm, served), (sock, served), (standalone, alone)):
            await check_equals_model(client, model)
        seeds = np.arange(0, base_model.num_nodes, 3)
        for fanout, replace in ((2, False), (5, True), (-1, False)):
            want = await standalone.sample_neighbors(seeds, fanout, replace=replace, seed=11)
            for client in (shm, sock):
                got = await client.sample_neighbors(seeds, fanout, replace=replace, seed=11)
                for a, b in zip(got, want, strict=True):
                    np.testing.assert_array_equal(a, b)
        with pytest.raises(UnknownEdgeError):  # a folded edge removed after the compaction
            await sock.remove_edges([served.removed[-1]])
    finally:
        for c in (shm, sock, standalone):
            await c.close()


@pytest.mark.timeout(240)
async def test_reads_and_writes_go_on_during_a_compaction(servers: ServerGroup, base_model: Model) -> None:
    """A big overlay folds on a worker thread while co-located and socket readers sample and a
    writer adds and removes edges: no read fails, no acknowledged write is lost."""
    model = _copy(base_model)
    writer = await AsyncClient.connect(servers.addresses, use_shared_memory=False)
    readers = [await AsyncClient.connect(servers.addresses, use_shared_memory=shm) for shm in (True, False)]
    rng = np.random.default_rng(4)
    n = model.num_nodes
    try:
        for _ in range(8):  # 800k added edges: a fold that takes a while (~0.4 s a partition)
            src, dst = rng.integers(0, n, 100_000), rng.integers(0, n, 100_000)
            model.add(await writer.add_edges(src, dst), src, dst)
        for reader in readers:
            await reader.sample_neighbors(np.arange(10), 2, seed=0)  # mapped before
        compacting = asyncio.ensure_future(writer.compact())
        reads = writes = during = 0
        while not compacting.done() or writes < 3:
            for reader in readers:
                seeds = rng.integers(0, n, 100)
                _, _, eids = await reader.sample_neighbors(seeds, int(rng.choice([-1, 4])), seed=reads)
                assert not np.isin(eids, model.removed).any()  # removed before this read began
                reads += 1
            src, dst = rng.integers(0, n, 50), rng.integers(0, n, 50)
            added = await writer.add_edges(src, dst)
            model.add(added, src, dst)
            gone = np.array([*added[:3], int(rng.integers(0, model.num_base_edges))], dtype=np.int64)
            gone = np.array([e for e in gone.tolist() if e in model.edges], dtype=np.int64)
            await writer.remove_edges(gone)
            model.remove(gone)
            writes += 1
            during += not compacting.done()
            assert writes < 5000
        done = await compacting
        assert all(d["compactions"] == 1 for d in done)
        assert during >= 1  # updates were acknowledged while it folded
        for client in (writer, *readers):
            await check_equals_model(client, model)
    finally:
        for c in (writer, *readers):
            await c.close()


@pytest.mark.timeout(240)
async def test_compaction_survives_kill9_with_wal_exactly(
    cora2: Any, tmp_path: Path, base_model: Model
) -> None:
    """The compaction is logged where it captured the overlay: ``kill -9`` and a restart with
    ``--wal`` replay it at that point (the same layout: a fixed seed samples the same), and a
    snapshot taken after it holds the compacted overlay."""
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=30.0)
        model = _copy(base_model)
        rng = np.random.default_rng(3)
        await update_sequence(client, model, rng)
        await client.snapshot()
        await update_sequence(client, model, rng)
        await client.compact()  # in the log, after the snapshot
        await more_updates(client, model, rng)
        seeds = np.arange(0, model.num_nodes, 7)

        async def restarted() -> None:
            before = await client.sample_neighbors(seeds, 3, seed=4)
            for index in (0, 1):
                group.kill(index)
                group.restart(index)
            await check_equals_model(client, model)
            for a, b in zip(await client.sample_neighbors(seeds, 3, seed=4), before, strict=True):
                np.testing.assert_array_equal(a, b)
            assert [i["compactions"] for i in await client.server_stats()] == [1, 1]

        await restarted()  # the snapshot before the compaction + the log with it
        await client.snapshot()  # a snapshot of the compacted overlay
        await more_updates(client, model, rng)
        await restarted()
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(180)
async def test_replicas_follow_a_compaction(cora2: Any, tmp_path: Path, base_model: Model) -> None:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, num_servers=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, use_replicas=True)
        model = _copy(base_model)
        await update_sequence(client, model, np.random.default_rng(2))
        for _ in range(2):
            await check_equals_model(client, model)  # the replicas map the overlay
        await client.compact()
        await more_updates(client, model, np.random.default_rng(6))
        for _ in range(3):  # reads take turns over primary and replica
            await check_equals_model(client, model)
        expect = model.in_degrees()
        for index in range(2, len(group.bound)):  # each replica, asked directly
            host, port = group.bound[index]
            conn = await Connection.open(host, port, graph_name=None, timeout=T)
            try:
                info = await conn.call(Op.INFO, {}, T)
                lo, hi = client.book.node_range(int(info["part_id"]))
                got = await conn.call(Op.DEGREES, {"ids": None, "edge_dir": "in"}, T)
                np.testing.assert_array_equal(np.asarray(got), expect[lo:hi])
            finally:
                conn.close()
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(120)
async def test_a_compaction_past_the_budget_is_refused(cora2: Any, tmp_path: Path, base_model: Model) -> None:
    """The old overlay stays until the swap: a fold that would not fit beside it in
    ``--memory-budget`` is refused with ``MemoryBudgetError`` and changes nothing."""
    from asyncgraph.partition import load_partition
    from asyncgraph.storage.store import PartitionStore

    held = []
    for part in (0, 1):
        with PartitionStore.from_partition(load_partition(cora2.part_config, part), shared=False) as store:
            held.append(sum(size for _, size in store.local_sizes().values()))
    budget = max(held) + 100_000  # a first overlay (~60 kB), not a new CSC (~190 kB) beside it
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--memory-budget", str(budget)],
    )
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    try:
        model = _copy(base_model)
        model.add(await client.add_edges([1, 2], [3, 2000]), np.array([1, 2]), np.array([3, 2000]))
        with pytest.raises(MemoryBudgetError):
            await client.compact()
        assert [i["compactions"] for i in await client.server_stats()] == [0, 0]
        await check_equals_model(client, model)
    finally:
        await client.close()
        group.stop()


@pytest.mark.timeout(120)
async def test_servers_compact_on_their_own_past_the_fraction(
    cora2: Any, tmp_path: Path, base_model: Model
) -> None:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=[
            *("--log-level", "WARNING", "--compact-when-overlay-fraction", "0.05"),
            *("--metrics-port", "0", "--metrics-host", "127.0.0.1"),
        ],
    )
    client = await AsyncClient.connect(group.addresses, use_shared_memory=True)
    try:
        model = _copy(base_model)
        rng = np.random.default_rng(1)
        for _ in range(10):  # 10 x 100 edges: each partition passes 5% of its ~5k edges
            src, dst = rng.integers(0, model.num_nodes, 100), rng.integers(0, model.num_nodes, 100)
            model.add(await client.add_edges(src, dst), src, dst)
        for _ in range(100):
            if all(i["compactions"] >= 1 for i in await client.server_stats()):
                break
            await asyncio.sleep(0.05)
        info = await client.server_stats()
        assert all(i["compactions"] >= 1 for i in info)
        assert all(i["overlay_edges"] < 0.05 * 5500 for i in info)
        await check_equals_model(client, model)
        port = json.loads((tmp_path / "run" / "ready0.json").read_text())["metrics_port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        gauges = dict(line.split() for line in text.splitlines() if line.startswith("asyncgraph_"))
        assert float(gauges["asyncgraph_compactions"]) == info[0]["compactions"]
        assert float(gauges["asyncgraph_overlay_edges"]) == info[0]["overlay_edges"]
    finally:
        await client.close()
        group.stop()
