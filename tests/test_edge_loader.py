"""Edge endpoints (find_edges) and edge-wise mini-batches for link prediction, served and standalone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from asyncgraph.client import Client
from asyncgraph.dataloading import DistEdgeDataLoader, EdgeMiniBatch, NeighborSampler, negative
from asyncgraph.distributed import DistGraph
from asyncgraph.errors import InvalidRequestError, OutOfRangeError
from asyncgraph.testing import ServerGroup


@pytest.fixture(params=["standalone", "served", "socket", "mixed"])
def graph(request: pytest.FixtureRequest, pubmed2) -> Iterator[DistGraph]:
    if request.param == "standalone":
        client = Client.standalone(pubmed2.part_config)
    else:  # shared memory for both partitions, for none, or for partition 0 only
        addresses = request.getfixturevalue("served").addresses
        local = {"served": None, "socket": [], "mixed": [0]}[request.param]
        client = Client.connect(addresses, local_partitions=local)
        assert client.aio.local_partitions() == ([0, 1] if local is None else local)
    yield DistGraph("pubmed", client=client)
    client.close()


def _original(pubmed2, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The new-ID endpoints of new edge IDs ``eids``, from the original arrays."""
    new_of_old = np.empty_like(pubmed2.orig_nids)
    new_of_old[pubmed2.orig_nids] = np.arange(pubmed2.orig_nids.size)
    old = pubmed2.orig_eids[np.asarray(eids, dtype=np.int64)]
    return new_of_old[pubmed2.raw["src"][old]], new_of_old[pubmed2.raw["dst"][old]]


def test_find_edges_matches_the_original_edges(graph: DistGraph, pubmed2) -> None:
    n = graph.num_edges()
    rng = np.random.default_rng(0)
    eids = rng.integers(0, n, 3000)
    eids[:50] = eids[50:100]  # duplicates
    src, dst = graph.find_edges(eids)
    assert src.dtype == torch.int64 and dst.dtype == torch.int64
    want_src, want_dst = _original(pubmed2, eids)
    np.testing.assert_array_equal(src.numpy(), want_src)
    np.testing.assert_array_equal(dst.numpy(), want_dst)
    for ids in (eids.astype(np.int32), torch.from_numpy(eids), torch.from_numpy(eids.astype(np.int32))):
        s, d = graph.find_edges(ids)
        np.testing.assert_array_equal(s.numpy(), want_src)
        np.testing.assert_array_equal(d.numpy(), want_dst)
    every = np.arange(n)
    s, d = graph.client.find_edges(every)  # the whole graph, both partitions, every edge once
    np.testing.assert_array_equal(s, _original(pubmed2, every)[0])
    np.testing.assert_array_equal(d, _original(pubmed2, every)[1])
    s, d = graph.find_edges(np.empty(0, dtype=np.int64))
    assert s.shape == (0,) and d.shape == (0,)
    s, d = graph.find_edges([n - 1])  # last edge of the last partition
    np.testing.assert_array_equal(s.numpy(), _original(pubmed2, [n - 1])[0])
    for bad in ([0, n], [-1], [n + 100, 3]):
        with pytest.raises(OutOfRangeError):
            graph.find_edges(bad)


def test_find_edges_op_rejects_edges_another_partition_owns(served: ServerGroup, pubmed2) -> None:
    client = Client.connect(served.addresses, use_shared_memory=False)
    try:
        conn = client.aio.connections[0] if client.aio.connections else None
        assert conn is not None
        start, end = client.book.edge_range(0)
        ok = client.loop.run(conn.call("find_edges", {"eids": np.array([start, end - 1])}, 10.0))
        np.testing.assert_array_equal(ok["src"], _original(pubmed2, [start, end - 1])[0])
        with pytest.raises(OutOfRangeError):
            client.loop.run(conn.call("find_edges", {"eids": np.array([end])}, 10.0))
    finally:
        client.close()


def _epoch(loader: DistEdgeDataLoader) -> list[EdgeMiniBatch]:
    return list(loader)


def test_every_edge_once_and_pairs_map_back(graph: DistGraph, pubmed2) -> None:
    eids = np.arange(0, graph.num_edges(), 41)
    loader = DistEdgeDataLoader(graph, eids, NeighborSampler([3, 2]), 256, prefetch=2, seed=5)
    batches = _epoch(loader)
    assert len(batches) == len(loader) == -(-eids.size // 256)
    seen = np.concatenate([b.pair_graph.eids.numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(seen), eids)
    for batch in batches[:3]:
        input_nodes, pair, blocks = batch  # no negative sampler: DGL's three-tuple
        nodes = blocks[-1].dstnodes
        assert torch.equal(nodes, pair.nodes)
        src, dst = pair.edges()
        want_src, want_dst = _original(pubmed2, pair.eids.numpy())
        np.testing.assert_array_equal(nodes[src].numpy(), want_src)
        np.testing.assert_array_equal(nodes[dst].numpy(), want_dst)
        endpoints = np.unique(np.concatenate([want_src, want_dst]))
        np.testing.assert_array_equal(nodes.numpy(), endpoints)  # exactly the unique seeds
        assert torch.equal(blocks[0].dstnodes, blocks[1].srcnodes)
        assert torch.equal(input_nodes, blocks[0].srcnodes)
        feats = blocks[0].srcdata["feat"].numpy()
        np.testing.assert_array_equal(feats, pubmed2.original_rows("feat", input_nodes.numpy()))


def test_negatives_have_the_batch_sources_and_k_per_positive(graph: DistGraph) -> None:
    k = 3
    loader = DistEdgeDataLoader(
        graph, np.arange(2000), NeighborSampler([2]), 300, negative_sampler=negative.Uniform(k), seed=2
    )
    batches = _epoch(loader)
    for batch in batches:
        _input_nodes, pair, neg, blocks = batch
        nodes = blocks[-1].dstnodes
        assert neg.num_edges() == k * pair.num_edges() and neg.eids.numel() == 0
        neg_src, neg_dst = neg.global_edges()
        pos_src, pos_dst = pair.global_edges()
        assert torch.equal(neg_src, pos_src.repeat_interleave(k))
        assert int(neg_dst.min()) >= 0 and int(neg_dst.max()) < graph.num_nodes()
        want = np.unique(np.concatenate([t.numpy() for t in (pos_src, pos_dst, neg_src, neg_dst)]))
        np.testing.assert_array_equal(nodes.numpy(), want)
    dsts = np.concatenate([b.neg_pair_graph.global_edges()[1].numpy() for b in batches])  # type: ignore[union-attr]
    n = graph.num_nodes()
    expected = n * (1 - np.exp(-dsts.size / n))  # distinct values among uniform draws
    assert abs(np.unique(dsts).size - expected) < 0.05 * expected
    assert abs(dsts.mean() - (n - 1) / 2) < 0.05 * n
    with pytest.raises(InvalidRequestError):
        negative.Uniform(0)
    direct_src, direct_dst = negative.Uniform(2)(graph, [5, 6], seed=0)
    assert direct_dst.shape == (4,)
    assert torch.equal(direct_src, graph.find_edges([5, 5, 6, 6])[0])


def test_exclude_self_drops_the_batch_edges_from_every_block(graph: DistGraph) -> None:
    eids = np.arange(0, graph.num_edges(), 29)

    def leaks(exclude: str | None) -> int:
        loader = DistEdgeDataLoader(
            graph, eids, NeighborSampler([-1, -1]), 200, exclude=exclude, shuffle=False, seed=3
        )
        count = 0
        for batch in loader:
            pos = batch.pair_graph.eids.numpy()
            for block in batch.blocks:
                count += int(np.isin(block.eids.numpy(), pos).sum())
        return count

    assert leaks("self") == 0
    assert leaks(None) > 0  # full neighbourhoods of both endpoints include the edge itself
    with pytest.raises(InvalidRequestError):
        DistEdgeDataLoader(graph, eids, NeighborSampler([2]), 10, exclude="reverse")
    with pytest.raises(OutOfRangeError):
        DistEdgeDataLoader(graph, [0, graph.num_edges()], NeighborSampler([2]), 10)


def _signature(batch: EdgeMiniBatch) -> list[np.ndarray]:
    neg = batch.neg_pair_graph
    assert neg is not None
    return [
        batch.input_nodes.numpy(),
        batch.pair_graph.eids.numpy(),
        batch.pair_graph.src.numpy(),
        neg.src.numpy(),
        neg.dst.numpy(),
        *(b.eids.numpy() for b in batch.blocks),
        batch.blocks[0].srcdata["feat"].numpy(),
    ]


def test_prefetch_and_async_for_give_identical_batches(graph: DistGraph) -> None:
    eids = np.arange(0, graph.num_edges(), 53)

    def make(prefetch: int) -> DistEdgeDataLoader:
        return DistEdgeDataLoader(
            graph,
            eids,
            NeighborSampler([4, 3]),
            128,
            prefetch=prefetch,
            negative_sampler=negative.Uniform(2),
            exclude="self",
            seed=11,
        )

    runs = [[_signature(b) for b in make(p)] for p in (0, 2)]
    loader = make(2)

    async def consume() -> list[list[np.ndarray]]:
        return [_signature(b) async for b in loader]

    runs.append(asyncio.run(consume()))
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)
    second = [_signature(b) for b in loader]  # epoch 1: a different order and different samples
    assert not np.array_equal(second[0][1], runs[0][0][1])


class ExplodingSampler(NeighborSampler):
    async def sample_blocks(self, sample_fn, seeds):  # type: ignore[no-untyped-def]
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls >= 3:
            raise RuntimeError("sampler exploded on purpose")
        return await super().sample_blocks(sample_fn, seeds)


def _loop_tasks(loader: DistEdgeDataLoader) -> int:
    async def count() -> int:
        return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])

    return asyncio.run_coroutine_threadsafe(count(), loader.client.loop.loop).result(5)


def test_break_and_errors_leave_nothing_behind(graph: DistGraph) -> None:
    loader = DistEdgeDataLoader(graph, np.arange(5000), NeighborSampler([5, 5]), 50, prefetch=4, seed=0)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert _loop_tasks(loader) == 0
    assert len(list(loader)) == 100  # reusable after a break
    failing = DistEdgeDataLoader(graph, np.arange(600), ExplodingSampler([3]), 100, shuffle=False, prefetch=0)
    seen = 0
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        for _ in failing:
            seen += 1
    assert seen == 2
    assert _loop_tasks(failing) == 0
