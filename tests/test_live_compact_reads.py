"""Out-degrees and ``sample_edges`` of a compacted live partition (issue 35): they read the CSC a
compaction made (and the overlay on it), before and after more updates and a second
compaction. Real servers (socket and shared-memory readers) equal a standalone graph fed the
same updates and an expectation computed afresh from the list of every live edge. Cora in two
partitions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_live_reads import Edges, check_sample_edges

from asyncgraph.client import AsyncClient
from asyncgraph.testing import start_servers


async def update(client: AsyncClient, model: Edges, rng: np.random.Generator, first: bool) -> None:
    """Add nodes (the first time) and edges from and into them, remove base, folded and new
    edges; ``model`` follows. No rows of new IDs (a partition with them does not compact yet):
    new edges weigh 0 under ``prob``."""
    n, e = client.book.num_nodes, client.book.num_edges
    if first:
        await client.create_tensor("edge:p", "edge", [e], "float32")
        base_p = np.where(np.arange(e) % 5 == 0, 0.0, 1.0 + np.arange(e) % 3).astype(np.float32)
        await client.push("edge:p", np.arange(e), base_p)  # every fifth base edge weighs 0
        model.zero.update(np.flatnonzero(base_p == 0).tolist())
        new = np.concatenate([await client.add_nodes(2, part=0), await client.add_nodes(3, part=1)])
        model.added.extend(new.tolist())
    new = np.array(model.added, dtype=np.int64)
    src = np.concatenate([rng.integers(0, n, 150), new, new[:2], rng.integers(0, n, 2)])
    dst = np.concatenate([rng.integers(0, n, 150), rng.integers(0, n, new.size), new[3:], new[:2]])
    added = await client.add_edges(src, dst)
    model.zero.update(added.tolist())  # no row of "edge:p": weight 0
    for eid, s, d in zip(added.tolist(), src.tolist(), dst.tolist(), strict=True):
        model.edges[eid] = (s, d)
    live = np.array(sorted(model.edges), dtype=np.int64)
    gone = np.concatenate([live[live < e][::43], live[live >= e][::6]])
    await client.remove_edges(gone)
    for x in gone.tolist():
        del model.edges[x]


async def check(clients: tuple[AsyncClient, ...], standalone: AsyncClient, model: Edges) -> None:
    """Out-degrees and sample_edges: every client = the model, whose edge set is the one the
    servers list afresh (``live_edges``: in-neighbourhoods, not the out-edge reads checked)."""
    listed = await clients[-1].live_edges()
    assert listed is not None
    for a, b in zip(listed, model.listed(), strict=True):
        np.testing.assert_array_equal(a, b)
    n = standalone.book.num_nodes
    nodes = np.concatenate([np.arange(0, n, 13), model.added])
    want = model.out_degrees(nodes)
    assert want.sum() > 0 and want[-5:].sum() > 0  # added nodes have out-edges
    for client in (*clients, standalone):
        np.testing.assert_array_equal(await client.degrees(nodes, "out"), want)
    every = model.out_degrees(np.arange(n))
    for client in (clients[-1], standalone):
        np.testing.assert_array_equal(await client.degrees(None, "out"), every)
    await check_sample_edges(clients, standalone, model, nodes)


@pytest.mark.timeout(240)
async def test_out_degrees_and_sample_edges_of_a_compacted_partition(cora2: Any, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    standalone = AsyncClient.standalone(cora2.part_config)
    try:
        shm = await AsyncClient.connect(group.addresses, use_shared_memory=True)
        sock = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        src, dst = await standalone.find_edges(np.arange(standalone.book.num_edges))
        served, alone = Edges(src, dst), Edges(src, dst)
        await shm.degrees(np.arange(5), "out")  # mapped before the updates
        for rng_seed, first in ((3, True), (4, False)):
            await update(sock, served, np.random.default_rng(rng_seed), first)
            await update(standalone, alone, np.random.default_rng(rng_seed), first)
            assert served.edges == alone.edges and served.added == alone.added
            await sock.compact()
            await standalone.compact()
            assert all(s.get("compactions", 0) >= 1 for s in await sock.server_stats())
            await check((shm, sock), standalone, served)  # a compaction's CSC, empty overlay
            await update(sock, served, np.random.default_rng(rng_seed + 10), False)
            await update(standalone, alone, np.random.default_rng(rng_seed + 10), False)
            await check((shm, sock), standalone, served)  # its CSC + updates since
        for c in (shm, sock):
            await c.close()
    finally:
        await standalone.close()
        group.stop()


def test_the_out_index_of_a_compacted_partition_is_held_within_the_memory_budget(cora2: Any) -> None:
    """The out-index over a compaction's CSC (16 B per folded edge) is refused with
    ``MemoryBudgetError`` when it would pass the budget, and nothing is built: in-edge reads go
    on, and with room the out-degrees equal those of the same updates left uncompacted. A
    partition's real store and service, in this process."""
    from asyncgraph.errors import MemoryBudgetError
    from asyncgraph.partition import load_partition
    from asyncgraph.protocol.args import SampleEdgesArgs
    from asyncgraph.service import PartitionService
    from asyncgraph.storage.compaction import CompactedOverlay
    from asyncgraph.storage.store import PartitionStore

    services = [
        PartitionService(PartitionStore.from_partition(load_partition(cora2.part_config, 0), shared=False))
        for _ in range(2)
    ]
    try:
        compacted, plain = services
        lo, hi = compacted.store.node_range
        rng = np.random.default_rng(5)
        src, dst = rng.integers(0, compacted.store.book.num_nodes, 80), rng.integers(lo, hi, 80)
        for service in services:
            service.add_edges(src, dst)
        compacted.compact()
        overlay = compacted.store.overlay
        assert isinstance(overlay, CompactedOverlay)
        store = compacted.store
        tensors = sum(size for _, size in store.local_sizes().values())
        ids = np.concatenate([np.arange(0, store.book.num_nodes, 7), src[:5]])
        store.rules.memory_budget = tensors + 16 * overlay.folded_edges - 1
        with pytest.raises(MemoryBudgetError, match="out-index"):
            compacted.degrees(ids, "out")
        with pytest.raises(MemoryBudgetError, match="out-index"):
            compacted.sample_edges(SampleEdgesArgs(ids, 2, edge_dir="out", seed=1))
        assert compacted.live.held_bytes() == overlay.stats()["overlay_bytes"]  # nothing built
        np.testing.assert_array_equal(compacted.degrees(dst, "in"), plain.degrees(dst, "in"))
        store.rules.memory_budget = tensors + 16 * overlay.folded_edges
        np.testing.assert_array_equal(compacted.degrees(ids, "out"), plain.degrees(ids, "out"))
        assert compacted.live.held_bytes() == overlay.stats()["overlay_bytes"] + 16 * overlay.folded_edges
    finally:
        for service in services:
            service.store.close()
