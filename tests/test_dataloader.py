"""Prefetching loaders: same batches at any prefetch, errors reach the loop, clean stops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from asyncgraph.client import Client
from asyncgraph.dataloading import DistDataLoader, DistNodeDataLoader, NeighborSampler
from asyncgraph.dataloading.block import Block
from asyncgraph.distributed import DistGraph


@pytest.fixture(params=["standalone", "served"])
def graph(request: pytest.FixtureRequest, pubmed2) -> Iterator[DistGraph]:
    if request.param == "standalone":
        client = Client.standalone(pubmed2.part_config)
    else:
        client = Client.connect(request.getfixturevalue("served").addresses)
    yield DistGraph("pubmed", client=client)
    client.close()


def _batches(loader: DistNodeDataLoader) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    out = []
    for input_nodes, seeds, blocks in loader:
        out.append((input_nodes.numpy(), seeds.numpy(), blocks[0].srcdata["feat"].numpy()))
    return out


def test_prefetch_gives_the_same_batches_as_no_prefetch(graph: DistGraph, pubmed2) -> None:
    nids = np.arange(0, graph.num_nodes(), 37)
    sampler = NeighborSampler([5, 3])
    runs = [
        _batches(DistNodeDataLoader(graph, nids, sampler, 64, shuffle=True, prefetch=p, seed=123))
        for p in (0, 2, 5)
    ]
    assert len(runs[0]) == -(-len(nids) // 64)
    for other in runs[1:]:
        for (i0, s0, f0), (i1, s1, f1) in zip(runs[0], other, strict=True):
            np.testing.assert_array_equal(i0, i1)
            np.testing.assert_array_equal(s0, s1)
            np.testing.assert_array_equal(f0, f1)
    seeds = np.concatenate([s for _, s, _ in runs[0]])
    np.testing.assert_array_equal(np.sort(seeds), nids)  # each seed once per epoch
    i0, s0, f0 = runs[0][0]
    np.testing.assert_array_equal(f0, pubmed2.original_rows("feat", i0))


def test_blocks_and_labels_are_consistent(graph: DistGraph, pubmed2) -> None:
    loader = DistNodeDataLoader(graph, np.arange(500), NeighborSampler([4, 2]), 100, prefetch=2, seed=1)
    for batch in loader:
        blocks: list[Block] = batch.blocks
        assert torch.equal(blocks[0].dstnodes, blocks[1].srcnodes)
        assert torch.equal(blocks[-1].dstnodes, batch.seeds)
        labels = blocks[-1].dstdata["label"].numpy()
        np.testing.assert_array_equal(labels, pubmed2.original_rows("label", batch.seeds.numpy()))
        assert blocks[1].edge_index.shape[1] <= 2 * len(batch.seeds)


class ExplodingSampler(NeighborSampler):
    async def sample_blocks(self, sample_fn, seeds):  # type: ignore[no-untyped-def]
        if int(seeds.min()) >= 300:
            raise RuntimeError("sampler exploded on purpose")
        return await super().sample_blocks(sample_fn, seeds)


def _loop_tasks(loader: DistNodeDataLoader) -> int:
    loop = loader.client.loop.loop

    async def count() -> int:
        return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])

    return asyncio.run_coroutine_threadsafe(count(), loop).result(5)


def test_an_error_in_sampling_reaches_the_training_loop(graph: DistGraph) -> None:
    loader = DistNodeDataLoader(graph, np.arange(600), ExplodingSampler([3]), 100, shuffle=False, prefetch=2)
    seen = 0
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        for _ in loader:
            seen += 1
    assert seen == 3
    assert _loop_tasks(loader) == 0


def test_break_stops_background_work(graph: DistGraph) -> None:
    threads_before = threading.active_count()
    loader = DistNodeDataLoader(graph, np.arange(5000), NeighborSampler([5, 5]), 50, prefetch=4, seed=0)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert _loop_tasks(loader) == 0
    assert threading.active_count() == threads_before
    assert len(list(loader)) == 100  # the loader is reusable after a break


def test_async_for_matches_sync_iteration(graph: DistGraph) -> None:
    nids = np.arange(0, 3000, 7)
    loader = DistNodeDataLoader(graph, nids, NeighborSampler([3, 3]), 128, prefetch=2, seed=9)
    sync = [s.numpy() for _, s, _ in loader]

    async def consume() -> list[np.ndarray]:
        loader.set_epoch(0)
        return [batch.seeds.numpy() for batch in [b async for b in loader]]

    for a, b in zip(sync, asyncio.run(consume()), strict=True):
        np.testing.assert_array_equal(a, b)


def test_dist_data_loader_with_sync_and_async_collate(graph: DistGraph) -> None:
    feat = graph.ndata["feat"]
    dataset = np.arange(1000)

    def collate(ids: np.ndarray) -> torch.Tensor:
        return feat[ids]  # blocking client call from a worker thread

    async def acollate(ids: np.ndarray) -> torch.Tensor:
        return await graph.client.aio.pull("node:feat", ids)

    for fn in (collate, acollate):
        loader = DistDataLoader(dataset, 128, fn, shuffle=True, prefetch=2, seed=4, loop=graph.client.loop)
        rows = list(loader)
        assert len(rows) == 8 and rows[-1].shape == (1000 - 7 * 128, 500)
        order = np.random.default_rng([4, 0]).permutation(1000)
        torch.testing.assert_close(rows[1], feat[order[128:256]])
        loader.close()
