"""10 writers and 4 samplers on a live graph for a bounded time (issue 35's test), on real servers.

Cora in two partitions, two real server processes that also compact on their own past 2% of
their edges, and one explicit compaction midway. Writers (half co-located, half over the socket)
add edges and remove some of their own and some base edges (each writer its own residue of
base IDs, so no two remove the same edge); samplers (three co-located, one over the socket)
sample all along. No call may fail, no sample may hold an edge whose removal was acknowledged
before it started, and at the end every node's in-edge set is the base plus every acknowledged
update.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_live_graph import Model, _copy, base_model, check_equals_model

from asyncgraph.client import AsyncClient
from asyncgraph.testing import start_servers

__all__ = ["base_model"]  # the fixture, shared with test_live_graph

WRITERS, SAMPLERS, SECONDS = 10, 4, 4.0


@pytest.mark.timeout(240)
async def test_ten_writers_and_four_samplers_for_a_bounded_time(
    cora2: Any, tmp_path: Path, base_model: Model
) -> None:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--compact-when-overlay-fraction", "0.02"],
    )
    n = base_model.num_nodes
    model = _copy(base_model)
    removed_acked: set[int] = set()
    deadline = 0.0  # set once every client is connected and warm
    counts = {"adds": 0, "removes": 0, "samples": 0}

    async def writer(index: int, client: AsyncClient) -> None:
        rng = np.random.default_rng(100 + index)
        mine: list[int] = []
        base = [e for e in range(index, model.num_base_edges, WRITERS)]  # this writer's base edges
        try:
            round_ = 0
            while (time.monotonic() < deadline or round_ < 6) and round_ < 2000:
                size = int(rng.integers(1, 80))
                src, dst = rng.integers(0, n, size), rng.integers(0, n, size)
                eids = await client.add_edges(src, dst)
                model.add(eids, src, dst)
                mine.extend(eids.tolist())
                counts["adds"] += 1
                if round_ % 3 == 2:
                    gone = np.array([*mine[::5], base.pop(int(rng.integers(0, len(base))))], dtype=np.int64)
                    await client.remove_edges(gone)
                    model.remove(gone)
                    removed_acked.update(gone.tolist())
                    mine = [e for e in mine if e not in removed_acked]
                    counts["removes"] += 1
                round_ += 1
        finally:
            await client.close()

    async def sampler(index: int, client: AsyncClient) -> None:
        rng = np.random.default_rng(200 + index)
        samples = 0
        try:
            while (time.monotonic() < deadline or samples < 5) and samples < 20_000:
                await asyncio.sleep(0.002)  # a co-located sample never waits on I/O: let others run
                before = set(removed_acked)
                seeds = rng.integers(0, n, 200)
                _, dst, eids = await client.sample_neighbors(
                    seeds, int(rng.choice([-1, 3])), seed=counts["samples"]
                )
                assert not before.intersection(eids.tolist())
                assert np.isin(dst, seeds).all()
                counts["samples"] += 1
                samples += 1
        finally:
            await client.close()

    async def compactor() -> list[dict[str, float]]:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        try:
            await asyncio.sleep(SECONDS / 2)
            return await client.compact()
        finally:
            await client.close()

    try:
        writers = [
            await AsyncClient.connect(group.addresses, use_shared_memory=i % 2 == 0) for i in range(WRITERS)
        ]
        samplers = [
            await AsyncClient.connect(group.addresses, use_shared_memory=i < 3) for i in range(SAMPLERS)
        ]
        model.add(await writers[0].add_edges([0], [1]), np.array([0]), np.array([1]))  # the graph is live
        for client in samplers:  # warm: the overlay mapped, its kernels loaded
            await client.sample_neighbors(np.arange(10), 3, seed=0)
        deadline = time.monotonic() + SECONDS
        tasks = [writer(i, c) for i, c in enumerate(writers)] + [
            sampler(i, c) for i, c in enumerate(samplers)
        ]
        *_, compacted = await asyncio.wait_for(asyncio.gather(*tasks, compactor()), SECONDS + 120)
        assert counts["adds"] >= WRITERS and counts["removes"] >= 1 and counts["samples"] >= SAMPLERS
        check = await AsyncClient.connect(group.addresses, use_shared_memory=True)
        try:
            info = await check.server_stats()
            assert all(i["compactions"] >= 1 for i in info), (info, compacted)
            await check_equals_model(check, model)
            src, dst, eids = await check.sample_neighbors(model.nodes(), -1)  # in-edge sets per node
            got: dict[int, set[tuple[int, int]]] = defaultdict(set)
            for s, d, e in zip(src.tolist(), dst.tolist(), eids.tolist(), strict=True):
                got[d].add((e, s))
            want: dict[int, set[tuple[int, int]]] = defaultdict(set)
            for e, (s, d) in model.edges.items():
                want[d].add((e, s))
            assert got == want
        finally:
            await check.close()
    finally:
        group.stop()
