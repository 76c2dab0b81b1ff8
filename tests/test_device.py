"""Loaders with ``device=``: staging pool, pack/copy/unpack, identical batches on CPU, CUDA path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from asyncgraph.client import Client
from asyncgraph.dataloading import DistDataLoader, DistNodeDataLoader, NeighborSampler
from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.dataloading.device import DeviceCopier, StagingPool, map_tensors
from asyncgraph.dataloading.edge_loader import DistEdgeDataLoader
from asyncgraph.dataloading.negative import Uniform
from asyncgraph.distributed import DistGraph

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# --- the staging pool (pure) ----------------------------------------------------------------
def test_pool_reuses_buffers_and_never_hands_out_one_in_use() -> None:
    pool = StagingPool(2, pin=False)
    a = pool.acquire(100)
    b = pool.acquire(100)
    assert a is not b
    assert a.buffer.data_ptr() != b.buffer.data_ptr()  # two in-flight batches never share bytes
    c = pool.acquire(10)  # both out: the pool adds a slot rather than aliasing
    assert c is not a and c is not b and pool.created == 3
    ptr = a.buffer.data_ptr()
    pool.release(a)
    d = pool.acquire(50)  # fits: the same buffer comes back, not a fresh allocation
    assert d is a and d.buffer.data_ptr() == ptr
    assert pool.grown == 3  # a, b, c were grown from 0 bytes; nothing since


def test_pool_grows_a_buffer_for_a_larger_batch() -> None:
    pool = StagingPool(1, pin=False)
    slot = pool.acquire(64)
    assert slot.nbytes >= 64
    pool.release(slot)
    again = pool.acquire(1000)
    assert again is slot and again.nbytes >= 1000
    pool.release(again)
    assert pool.acquire(500).nbytes >= 1000  # it does not shrink back
    with pytest.raises(ValueError):
        StagingPool(0, pin=False)


def _sample_batch(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    block = to_block([5, 6, 7, 5], [0, 1, 1, 2], [0, 1, 2], eids=[10, 11, 12, 13])
    block.srcdata["feat"] = torch.randn(block.num_src_nodes(), 3, generator=g)
    block.dstdata["label"] = torch.arange(3)
    block.csr()
    return {
        "blocks": [block],
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(5, generator=g).to(torch.bfloat16),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(7),
        "name": "batch",
    }


def _flat(obj: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    map_tensors(obj, lambda t: out.append(t) or t)  # type: ignore[func-returns-value]
    return out


def test_cpu_copier_packs_and_unpacks_exactly_without_aliasing() -> None:
    copier = DeviceCopier("cpu", slots=1)
    first = _sample_batch(1)
    staged1 = copier.stage(first)
    staged2 = copier.stage(_sample_batch(2))  # reuses the only staging buffer
    out1, out2 = copier.deliver(staged1), copier.deliver(staged2)
    assert copier.pool.created == 1
    before, after = _flat(first), _flat(out1)
    assert len(before) == len(after) > 8
    for x, y in zip(before, after, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    assert out1["name"] == "batch"
    block = out1["blocks"][0]
    assert isinstance(block, Block) and "csr" in block._cache
    assert all(torch.equal(a, b) for a, b in zip(block.csr(), first["blocks"][0].csr(), strict=True))
    # batch 1 survived batch 2's staging: its tensors do not view the staging buffer
    staging = copier.pool.acquire(0).buffer
    lo, hi = staging.data_ptr(), staging.data_ptr() + staging.numel()
    for t in _flat(out1) + _flat(out2):
        if t.numel():
            assert not lo <= t.data_ptr() < hi
    assert not torch.equal(out1["blocks"][0].srcdata["feat"], out2["blocks"][0].srcdata["feat"])


def test_sync_mode_copies_in_deliver() -> None:
    copier = DeviceCopier("cpu", slots=1, overlap=False)
    batch = _sample_batch(3)
    out = copier.deliver(copier.stage(batch))
    assert all(torch.equal(x, y) for x, y in zip(_flat(batch), _flat(out), strict=True))


def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        DeviceCopier("cuda", slots=1)


# --- loaders over a real partitioned graph ----------------------------------------------------
@pytest.fixture
def graph(pubmed2) -> Iterator[DistGraph]:
    client = Client.standalone(pubmed2.part_config)
    yield DistGraph("pubmed", client=client)
    client.close()


def _node_batches(graph: DistGraph, **kw: Any) -> list[list[torch.Tensor]]:
    nids = np.arange(0, graph.num_nodes(), 41)
    loader = DistNodeDataLoader(graph, nids, NeighborSampler([4, 3]), 64, prefetch=2, seed=9, **kw)
    return [_flat([b.input_nodes, b.seeds, b.blocks]) for b in loader]


def _assert_same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]], device: str) -> None:
    assert len(a) == len(b) > 1
    for xs, ys in zip(a, b, strict=True):
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys, strict=True):
            assert y.device.type == device
            assert x.dtype == y.dtype and torch.equal(x, y.cpu())


def test_node_loader_on_cpu_device_gives_the_same_batches(graph: DistGraph) -> None:
    plain = _node_batches(graph)
    _assert_same(plain, _node_batches(graph, device="cpu"), "cpu")
    _assert_same(plain, _node_batches(graph, device=torch.device("cpu"), overlap=False), "cpu")


def test_async_iteration_and_no_prefetch_on_cpu_device(graph: DistGraph) -> None:
    import asyncio

    nids = np.arange(0, graph.num_nodes(), 97)

    async def collect(loader: DistNodeDataLoader) -> list[list[torch.Tensor]]:
        return [_flat([b.input_nodes, b.seeds, b.blocks]) async for b in loader]

    def loader(**kw: Any) -> DistNodeDataLoader:
        return DistNodeDataLoader(graph, nids, NeighborSampler([3]), 50, seed=5, **kw)

    plain = asyncio.run(collect(loader(prefetch=0)))
    _assert_same(plain, asyncio.run(collect(loader(prefetch=0, device="cpu"))), "cpu")
    _assert_same(plain, asyncio.run(collect(loader(prefetch=3, device="cpu"))), "cpu")


def test_edge_loader_on_cpu_device_gives_the_same_batches(graph: DistGraph) -> None:
    def run(**kw: Any) -> list[list[torch.Tensor]]:
        loader = DistEdgeDataLoader(
            graph, np.arange(0, 3000, 7), NeighborSampler([3]), 50, negative_sampler=Uniform(2),
            seed=4, **kw,
        )  # fmt: skip
        out = []
        for batch in loader:
            assert batch.neg_pair_graph is not None
            out.append(_flat([batch.input_nodes, batch.pair_graph, batch.neg_pair_graph, batch.blocks]))
        return out

    _assert_same(run(), run(device="cpu"), "cpu")


def test_dist_data_loader_moves_collated_tensors(graph: DistGraph) -> None:
    def collate(items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return items, items * 2

    data = torch.arange(100)
    plain = DistDataLoader(data, 16, collate_fn=collate, seed=0)
    moved = DistDataLoader(data, 16, collate_fn=collate, seed=0, device="cpu")
    try:
        a = [list(b) for b in plain]
        b = [list(x) for x in moved]
        _assert_same(a, b, "cpu")
        assert moved.stats.copy >= 0.0 and moved.stats.batches == len(b)
    finally:
        plain.close()
        moved.close()


@needs_cuda
def test_node_loader_on_cuda_gives_the_same_batches(graph: DistGraph) -> None:
    plain = _node_batches(graph)
    _assert_same(plain, _node_batches(graph, device="cuda"), "cuda")
    _assert_same(plain, _node_batches(graph, device="cuda", overlap=False), "cuda")


@needs_cuda
def test_cuda_copier_uses_pinned_staging_and_a_side_stream() -> None:
    copier = DeviceCopier("cuda", slots=2)
    assert copier.pool.pin
    batches = [_sample_batch(i) for i in range(5)]
    staged = [copier.stage(b) for b in batches]  # more batches than slots: reuse waits on events
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the consumer's stream is whatever is current
        outs = [copier.deliver(s) for s in staged]
        for b, o in zip(batches, outs, strict=True):
            for x, y in zip(_flat(b), _flat(o), strict=True):
                assert y.is_cuda and torch.equal(x, y.cpu())
    assert copier.pool.created == 2  # staged one after another: the two slots were enough
