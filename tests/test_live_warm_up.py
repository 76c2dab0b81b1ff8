"""``overlay_sample.warm_up`` compiles every signature a live sample needs: after it, sampling a
served graph that became live (co-located: read-only mapped arrays; standalone: the owner's
writable overlay) compiles nothing more. Real server processes on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.kernels import overlay_sample
from asyncgraph.kernels.jit import disabled
from asyncgraph.testing import start_servers


def _signatures() -> int:
    return sum(len(getattr(k, "signatures", ())) for k in (overlay_sample._pick, overlay_sample._live_counts))


@pytest.mark.timeout(300)
async def test_after_warm_up_a_live_sample_compiles_nothing(cora2: Any, tmp_path: Path) -> None:
    if disabled():
        pytest.skip("numba kernels disabled (ASYNCGRAPH_NO_JIT)")
    overlay_sample.warm_up()
    compiled = _signatures()
    assert compiled >= 2  # the kernels are numba dispatchers and the warm-up compiled them
    group = start_servers(cora2.part_config, tmp_path / "run", num_parts=2)
    standalone = AsyncClient.standalone(cora2.part_config)
    try:
        shm = await AsyncClient.connect(group.addresses, use_shared_memory=True)
        await shm.sample_neighbors(np.arange(8), 5)  # mapped before the graph is live
        rng = np.random.default_rng(3)
        n = shm.book.num_nodes
        seeds = np.arange(0, n, 7)
        for client in (shm, standalone):
            await client.add_edges(rng.integers(0, n, 200), rng.choice(seeds, 200))
            src, dst, _ = await client.sample_neighbors(seeds, 5)
            assert src.size and set(np.unique(dst).tolist()) <= set(seeds.tolist())
        assert _signatures() == compiled
        await shm.close()
    finally:
        await standalone.close()
        group.stop()
