"""Loader worker processes (``num_workers``): the same batches as the loop thread builds, rows
copied once, errors and dead workers reach the training loop, nothing outlives the loader."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from asyncgraph.client import Client
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.dataloading.workers import LoaderWorkerError
from asyncgraph.distributed import DistGraph
from asyncgraph.errors import UnknownTensorError


@pytest.fixture(params=["standalone", "served-shm", "served-socket"])
def graph(request: pytest.FixtureRequest, pubmed2: Any) -> Iterator[DistGraph]:
    if request.param == "standalone":
        client = Client.standalone(pubmed2.part_config)
    else:
        shm = request.param == "served-shm"
        client = Client.connect(request.getfixturevalue("served").addresses, use_shared_memory=shm)
    yield DistGraph("pubmed", client=client)
    client.close()


@pytest.fixture
def standalone(pubmed2: Any) -> Iterator[DistGraph]:
    client = Client.standalone(pubmed2.part_config)
    yield DistGraph("pubmed", client=client)
    client.close()


def _flat(batch: Any) -> list[torch.Tensor]:
    out = [batch.input_nodes, batch.seeds]
    for block in batch.blocks:
        out += [block.srcnodes, block.dstnodes, block.edge_index, block.eids, *block.csr()]
        out += [block.srcdata[k] for k in sorted(block.srcdata.keys())]
        out += [block.dstdata[k] for k in sorted(block.dstdata.keys())]
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie is not alive
    except FileNotFoundError:
        return False


def test_workers_build_the_batches_the_loop_thread_builds(graph: DistGraph, pubmed2: Any) -> None:
    nids = np.arange(0, graph.num_nodes(), 29)
    sampler = NeighborSampler([5, 3])
    ref = DistNodeDataLoader(graph, nids, sampler, 128, seed=7)
    loader = DistNodeDataLoader(graph, nids, sampler, 128, seed=7, num_workers=2, prefetch=3)
    assert loader._pool is not None
    pids = loader._pool.pids
    try:
        for epoch in range(2):  # the second epoch reuses the workers and their slots
            expected = [_flat(b) for b in ref]
            batches = list(loader)
            got = [_flat(b) for b in batches]
            assert len(got) == len(expected) == -(-nids.size // 128)
            for e, g in zip(expected, got, strict=True):
                assert len(e) == len(g)
                for a, b in zip(e, g, strict=True):
                    assert a.dtype == b.dtype and torch.equal(a, b)
            first = batches[0]
            expected_rows = pubmed2.original_rows("feat", first.input_nodes.numpy())
            np.testing.assert_array_equal(first.blocks[0].srcdata["feat"].numpy(), expected_rows)
            stats = loader.stats
            assert stats.epoch == epoch and stats.batches == len(got)
            # every feature and label row was written on the host once, straight into the slot
            assert stats.feature_bytes > 0 and stats.host_copy_bytes == stats.feature_bytes
            assert stats.structure_bytes > 0
            assert stats.input_nodes == ref.stats.input_nodes
            # the loop thread's path copies the rows once too (it has no staging copy on CPU)
            assert ref.stats.host_copy_bytes == ref.stats.feature_bytes == stats.feature_bytes
    finally:
        loader.close()
    assert not any(_alive(p) for p in pids)


def test_batches_kept_by_the_caller_are_never_overwritten(standalone: DistGraph) -> None:
    g = standalone
    nids = np.arange(0, 4000)
    loader = DistNodeDataLoader(g, nids, NeighborSampler([3]), 100, seed=3, num_workers=2, prefetch=1)
    kept = list(loader)  # all 40 batches held at once: each needs a slot of its own
    copies = [b.blocks[0].srcdata["feat"].clone() for b in kept]
    again = list(loader)  # a second epoch while the first one's batches are still held
    for b, c in zip(kept, copies, strict=True):
        assert torch.equal(b.blocks[0].srcdata["feat"], c)
    del kept, again
    loader.close()


def test_break_mid_epoch_then_a_full_epoch(standalone: DistGraph) -> None:
    g = standalone
    nids = np.arange(0, 3000)
    loader = DistNodeDataLoader(g, nids, NeighborSampler([4, 2]), 100, seed=5, num_workers=2, prefetch=4)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert sum(1 for _ in loader) == 30
    assert loader.stats.batches == 30
    loader.close()


def test_a_worker_error_is_raised_typed_in_the_training_loop(standalone: DistGraph) -> None:
    g = standalone
    sampler = NeighborSampler([3], prob="no_such_weight")  # the owners refuse it: a typed error
    loader = DistNodeDataLoader(g, np.arange(500), sampler, 100, seed=1, num_workers=1)
    with pytest.raises(UnknownTensorError, match="no_such_weight"):
        next(iter(loader))
    loader.close()


def test_a_killed_worker_fails_its_batches_and_does_not_hang(standalone: DistGraph) -> None:
    g = standalone
    loader = DistNodeDataLoader(g, np.arange(8000), NeighborSampler([5, 5]), 50, seed=1, num_workers=2)
    assert loader._pool is not None
    victim = loader._pool.pids[1]
    it = iter(loader)
    next(it)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(LoaderWorkerError, match=f"pid {victim}"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 30
    survivor = loader._pool.pids[0]
    loader.close()
    assert not _alive(survivor)


def test_bad_arguments_are_refused(standalone: DistGraph) -> None:
    g = standalone
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_workers"):
            DistNodeDataLoader(g, np.arange(10), NeighborSampler([2]), 5, num_workers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gather_threads"):
        DistNodeDataLoader(g, np.arange(10), NeighborSampler([2]), 5, num_workers=1, gather_threads=0)


def _flat_edges(batch: Any) -> list[torch.Tensor]:
    input_nodes, pair, neg, blocks = batch
    out = [input_nodes, pair.src, pair.dst, pair.nodes, pair.eids, neg.src, neg.dst, neg.nodes]
    for block in blocks:
        out += [block.srcnodes, block.dstnodes, block.edge_index, block.eids]
        out += [block.srcdata[k] for k in sorted(block.srcdata.keys())]
    return out


def test_edge_loader_workers_build_the_batches_the_loop_thread_builds(graph: DistGraph) -> None:
    from asyncgraph.dataloading import DistEdgeDataLoader
    from asyncgraph.dataloading.negative import Uniform

    eids = np.arange(0, graph.num_edges(), 37)
    sampler = NeighborSampler([4, 3])
    kwargs: dict[str, Any] = {"negative_sampler": Uniform(2), "exclude": "self", "seed": 11}
    ref = DistEdgeDataLoader(graph, eids, sampler, 256, **kwargs)
    loader = DistEdgeDataLoader(graph, eids, sampler, 256, num_workers=2, **kwargs)
    assert loader._pool is not None
    pids = loader._pool.pids
    try:
        for _ in range(2):
            expected = [_flat_edges(b) for b in ref]
            got = [_flat_edges(b) for b in loader]
            assert len(got) == len(expected) == -(-eids.size // 256)
            for e, g in zip(expected, got, strict=True):
                for a, b in zip(e, g, strict=True):
                    assert a.dtype == b.dtype and torch.equal(a, b)
            stats = loader.stats
            assert stats.feature_bytes > 0 and stats.host_copy_bytes == stats.feature_bytes
            assert stats.feature_bytes == ref.stats.feature_bytes
    finally:
        loader.close()
    assert not any(_alive(p) for p in pids)
