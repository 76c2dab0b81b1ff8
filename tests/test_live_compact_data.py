"""Compaction beside rows of new IDs (issue 35): what is not carried over yet is refused, typed,
and changes nothing; nothing acknowledged is lost. Cora in two partitions on real server
processes. (Out-edge reads of a compacted partition: ``test_live_compact_reads.py``.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import LiveGraphError
from asyncgraph.testing import start_servers

T = 20.0
FEAT = "node:feat"
W = "edge:w"


@pytest.fixture
def servers(cora2: Any, tmp_path: Path) -> Any:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    yield group
    group.stop()


@pytest.mark.timeout(180)
async def test_rows_of_new_ids_and_compaction_refuse_each_other(servers: Any) -> None:
    client = await asyncio.wait_for(AsyncClient.connect(servers.addresses), T)
    try:
        rng = np.random.default_rng(3)
        feats = rng.random((2, 1433), dtype=np.float32)
        nodes = await client.add_nodes(2, part=0, data={FEAT: feats})
        with pytest.raises(LiveGraphError, match="carry tensor rows"):
            await client.compact()  # partition 0 holds rows of new nodes: refused
        np.testing.assert_array_equal(await client.pull_numpy(FEAT, nodes), feats)  # kept
    finally:
        await client.close()


@pytest.mark.timeout(180)
async def test_after_a_compaction_rows_of_new_edges_are_refused_typed(servers: Any) -> None:
    client = await asyncio.wait_for(AsyncClient.connect(servers.addresses), T)
    try:
        n = client.book.num_nodes
        rng = np.random.default_rng(4)
        await client.create_tensor(W, "edge", [client.book.num_edges, 2], "float32")
        src, dst = rng.integers(0, n, 60), rng.integers(0, n, 60)
        before = await client.add_edges(src, dst)
        await client.compact()
        assert all(s.get("compactions", 0) >= 1 for s in await client.server_stats())
        # a folded new edge still resolves: its row of a tensor reads zeros, not an error
        np.testing.assert_array_equal(await client.pull_numpy(W, before[:5]), np.zeros((5, 2), np.float32))
        np.testing.assert_array_equal(np.stack(await client.find_edges(before)), np.stack([src, dst]))
        with pytest.raises(LiveGraphError, match="compacted"):
            await client.add_edges(src[:3], dst[:3], data={W: np.ones((3, 2), np.float32)})
        with pytest.raises(LiveGraphError, match="compacted"):
            await client.push(W, before[:2], np.ones((2, 2), np.float32))
        after = await client.add_edges(src[:3], dst[:3])  # structure goes on
        np.testing.assert_array_equal(np.stack(await client.find_edges(after)), np.stack([src[:3], dst[:3]]))
        np.testing.assert_array_equal(await client.pull_numpy(W, after), np.zeros((3, 2), np.float32))
    finally:
        await client.close()
