"""PyG's loaders with ``num_workers``: asyncgraph's loader worker processes build the batches.

On real servers (PubMed, ACM) and standalone: the batches equal ``num_workers=0``'s (same seed,
same order), every attribute row is copied on the host once, ``worker_mode="loop"`` keeps the
event-loop behaviour, and closing (or dropping) the loader leaves no worker process behind.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph

pytest.importorskip("torch_geometric")

from asyncgraph.pyg import DistLinkNeighborLoader, DistNeighborLoader


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie is not alive
    except FileNotFoundError:
        return False


def _assert_same(a: Any, b: Any, where: str = "batch") -> None:
    """Equal PyG batches: the same attributes, tensors equal in dtype, shape and values."""
    if hasattr(a, "to_dict"):
        a, b = a.to_dict(), b.to_dict()
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(map(str, a)) == sorted(map(str, b)), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def _check_epochs(ref: Any, loader: Any, epochs: int = 2) -> list[Any]:
    """Every batch of ``epochs`` epochs equal; the workers copied each pulled row once."""
    batches: list[Any] = []
    for _ in range(epochs):
        expected = list(ref)
        batches = list(loader)
        assert len(batches) == len(expected) == len(ref) > 1
        for i, (e, g) in enumerate(zip(expected, batches, strict=True)):
            _assert_same(e, g, f"batch {i}")
        stats = loader.stats
        assert stats.batches == len(batches)
        assert stats.feature_bytes == ref.stats.feature_bytes > 0
        assert stats.host_copy_bytes == stats.feature_bytes  # straight into the workers' slots
        assert ref.stats.host_copy_bytes == ref.stats.feature_bytes
        assert stats.input_nodes == ref.stats.input_nodes > 0
    return batches


def test_neighbor_loader_workers_build_the_event_loops_batches(g: Any, pubmed2: Any) -> None:
    """Served and standalone: workers' batches equal the event loop's; close() stops them."""
    nodes = torch.arange(0, g.num_nodes(), 37)
    kw: dict[str, Any] = {"input_nodes": nodes, "batch_size": 128, "shuffle": True, "seed": 7}
    ref = DistNeighborLoader(g, [5, 3], **kw)
    loader = DistNeighborLoader(g, [5, 3], num_workers=2, **kw)
    assert loader._pool is not None and loader.num_workers == 2
    pids = loader._pool.pids
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    try:
        batches = _check_epochs(ref, loader)
        b = batches[0]
        assert b.batch_size == 128 and b.x.shape[0] == b.n_id.numel() and "train_mask" in b
        np.testing.assert_array_equal(b.x.numpy(), pubmed2.original_rows("feat", b.n_id.numpy()))
        # the old behaviour on request: no processes, num_workers a prefetch depth on the event loop
        loop = DistNeighborLoader(g, [5, 3], num_workers=2, worker_mode="loop", **kw)
        assert loop._pool is None and loop.num_workers == 2 and loop.prefetch == 4
        ref.set_epoch(0)
        for e, got in zip(ref, loop, strict=True):
            _assert_same(e, got)
    finally:
        loader.close()
    assert not any(_alive(p) for p in pids)


def test_link_loader_workers_build_the_event_loops_batches(g: Any) -> None:
    eli = torch.stack(g.find_edges(torch.arange(0, 88648, 400)))
    labels = torch.randint(1, 4, (eli.shape[1],), generator=torch.Generator().manual_seed(0))
    cases: list[dict[str, Any]] = [
        {"edge_label": labels, "neg_sampling": "binary"},  # labels travel as bytes to the workers
        {"neg_sampling": ("triplet", 2)},
    ]
    for case in cases:
        kw = {"edge_label_index": eli, "batch_size": 64, "shuffle": True, "seed": 3, **case}
        ref = DistLinkNeighborLoader(g, [4, 2], **kw)
        loader = DistLinkNeighborLoader(g, [4, 2], num_workers=1, **kw)
        assert loader._pool is not None
        pids = loader._pool.pids
        try:
            batches = _check_epochs(ref, loader, epochs=1)
        finally:
            loader.close()
        assert not any(_alive(p) for p in pids)
        b = batches[0]
        if "edge_label" in case:
            assert b.edge_label_index.shape == (2, 128) and b.edge_label.dtype == torch.int64
            assert int((b.edge_label == 0).sum()) == 64  # the negatives
        else:
            assert b.dst_neg_index.shape == (64, 2)


@pytest.fixture(scope="module")
def acm_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """ACM (small word features) in 2 partitions, served by 2 server processes."""
    from asyncgraph.testing import start_servers

    examples = Path(__file__).resolve().parent.parent / "examples"
    sys.path.insert(0, str(examples))
    from hetero_node_classification import load_acm

    out = tmp_path_factory.mktemp("acm2")
    asyncgraph.partition_graph(load_acm(words=32), "acm", 2, out, part_method="random")
    group = start_servers(out / "acm.json", tmp_path_factory.mktemp("acm2-served"), num_parts=2)
    yield group
    group.stop()


def test_hetero_loaders_workers_on_servers(acm_served: Any) -> None:
    asyncgraph.initialize(acm_served.ip_config())
    try:
        g = asyncgraph.DistGraph("acm")
        papers = torch.arange(0, 4019, 7)
        fan = {c: [4, 3] for c in g.canonical_etypes}
        kw: dict[str, Any] = {
            "input_nodes": ("paper", papers),
            "batch_size": 128,
            "shuffle": True,
            "seed": 11,
        }
        ref = DistNeighborLoader(g, fan, **kw)
        loader = DistNeighborLoader(g, fan, num_workers=2, **kw)
        assert loader._pool is not None
        pids = loader._pool.pids
        try:
            batches = _check_epochs(ref, loader, epochs=1)
        finally:
            loader.close()
        b = batches[0]
        assert b["paper"].batch_size == 128 and "y" in b["paper"]
        assert b["author"].x.shape == (b["author"].n_id.numel(), 32)
        etype = ("paper", "written-by", "author")
        kw = {"edge_label_index": (etype, None), "batch_size": 512, "neg_sampling": "binary", "seed": 5}
        ref_link = DistLinkNeighborLoader(g, fan, **kw)
        link = DistLinkNeighborLoader(g, fan, num_workers=1, **kw)
        assert link._pool is not None
        pids += link._pool.pids
        try:
            first = next(iter(link))
            _assert_same(next(iter(ref_link)), first)
            assert first[etype].edge_label_index.shape == (2, 1024)
        finally:
            link.close()
        assert not any(_alive(p) for p in pids)
    finally:
        asyncgraph.finalize()


def test_standalone_workers_stop_when_the_loader_is_closed_or_dropped(pubmed2: Any) -> None:
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
        loader = DistNeighborLoader(g, [3], input_nodes=torch.arange(600), batch_size=100, num_workers=2)
        assert loader._pool is not None
        pids = loader._pool.pids
        it = iter(loader)
        assert next(it).batch_size == 100  # mid-epoch
        del it
        loader.close()
        assert not any(_alive(p) for p in pids)
        dropped = DistNeighborLoader(g, [3], input_nodes=torch.arange(600), batch_size=100, num_workers=2)
        assert dropped._pool is not None
        pids = dropped._pool.pids
        assert sum(1 for _ in dropped) == 6
        del dropped
        gc.collect()
        assert not any(_alive(p) for p in pids)
    finally:
        asyncgraph.finalize()


def test_bad_worker_arguments_are_refused(g: Any) -> None:
    with pytest.raises(ValueError, match="worker_mode"):
        DistNeighborLoader(g, [2], batch_size=4, num_workers=1, worker_mode="fork")
    with pytest.raises(ValueError, match="num_workers"):
        DistLinkNeighborLoader(g, [2], batch_size=4, num_workers=-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_worker_batches_on_cuda_equal_cpu_batches(pubmed2: Any) -> None:
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
        kw: dict[str, Any] = {"input_nodes": torch.arange(0, g.num_nodes(), 13), "batch_size": 200, "seed": 2}
        cpu = list(DistNeighborLoader(g, [5, 3], **kw))
        loader = DistNeighborLoader(g, [5, 3], num_workers=2, device="cuda", **kw)
        got = list(loader)
        torch.cuda.synchronize()
        assert len(got) == len(cpu) > 1
        for a, b in zip(cpu, got, strict=True):
            assert b.x.is_cuda and b.edge_index.is_cuda
            _assert_same(a, b.cpu())
        assert loader.stats.host_copy_bytes == loader.stats.feature_bytes > 0
        loader.close()
    finally:
        asyncgraph.finalize()
