"""DGL-parity additions: init_func callables, node_split on DistTensors, graph queries, sampling
options, torch input graphs, initialize in launched jobs, checkpoints (served and standalone)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from servers import ServerGroup, start_servers

import asyncgraph
from asyncgraph.errors import InvalidRequestError


@pytest.fixture(scope="module")
def served(pubmed2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(pubmed2.part_config, tmp_path_factory.mktemp("parity"), num_parts=2)
    yield group
    group.stop()


@pytest.fixture(params=["served", "standalone"])
def g(request: pytest.FixtureRequest, pubmed2) -> Iterator[asyncgraph.DistGraph]:
    if request.param == "served":
        asyncgraph.initialize(request.getfixturevalue("served").ip_config())
        graph = asyncgraph.DistGraph("pubmed")
    else:
        asyncgraph.initialize()
        graph = asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
    yield graph
    asyncgraph.finalize()


# --- 1. init_func -----------------------------------------------------------------------------
def test_init_func_callable_runs_once_per_new_tensor(g: asyncgraph.DistGraph, monkeypatch) -> None:
    import asyncgraph.distributed.tensor as tensor_mod

    monkeypatch.setattr(tensor_mod, "INIT_CHUNK_BYTES", 4096 * 12)  # force several chunks
    calls: list[tuple[tuple[int, ...], torch.dtype]] = []

    def init(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        calls.append((tuple(shape), dtype))
        return torch.full(shape, 7.0, dtype=dtype)

    n = g.num_nodes()
    t = asyncgraph.DistTensor((n, 3), torch.float32, name="pf_init", init_func=init)
    assert sum(s[0] for s, _ in calls) == n and len(calls) > 2
    assert all(dt == torch.float32 and s[0] <= 4096 for s, dt in calls)
    assert torch.equal(t[[0, n // 2, n - 1]], torch.full((3, 3), 7.0))
    again = asyncgraph.DistTensor((n, 3), torch.float32, name="pf_init", init_func=init)
    assert sum(s[0] for s, _ in calls) == n  # attaching does not initialise again
    assert torch.equal(again[[5]], torch.full((1, 3), 7.0))
    emb = asyncgraph.DistEmbedding(n, 2, name="pf_emb", init_func=lambda s, d: torch.ones(s, dtype=d))
    assert torch.equal(emb.weight[[1, n - 1]], torch.ones(2, 2))
    t.delete()


def test_init_forms_are_typed_errors(g: asyncgraph.DistGraph) -> None:
    n = g.num_nodes()
    for bad in ("zeros", 3, ["kind"]):
        with pytest.raises(InvalidRequestError, match="named initialiser"):
            asyncgraph.DistTensor((n,), torch.float32, name="pf_bad", init=bad)
        with pytest.raises(InvalidRequestError, match="named initialiser"):
            asyncgraph.DistEmbedding(n, 2, name="pf_bad_emb", init_func=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="not both"):
        asyncgraph.DistTensor((n,), torch.float32, init=asyncgraph.zeros_init(), init_func=lambda s, d: 0)
    with pytest.raises(InvalidRequestError, match="returned shape"):
        asyncgraph.DistTensor((n, 2), torch.float32, name="pf_bad", init_func=lambda s, d: torch.ones(3))
    assert "pf_bad" not in g.ndata


# --- 2. node_split / edge_split over DistTensor masks --------------------------------------------
def test_node_split_dist_tensor_mask_is_fast_and_partition_aware(g: asyncgraph.DistGraph, pubmed2) -> None:
    import time

    book = g.get_partition_book()
    mask_t = g.ndata["train_mask"]
    full = mask_t[0 : g.num_nodes()].numpy()
    for force_even in (True, False):
        t0 = time.perf_counter()
        shares = [
            asyncgraph.node_split(mask_t, rank=r, world_size=4, force_even=force_even) for r in range(4)
        ]
        assert time.perf_counter() - t0 < 5.0
        for r, share in enumerate(shares):
            want = asyncgraph.node_split(full, book, rank=r, world_size=4, force_even=force_even)
            assert torch.equal(share, want)
            # no book given: the current graph's is used
            assert torch.equal(asyncgraph.node_split(full, rank=r, world_size=4, force_even=force_even), want)
        every = torch.cat(shares).numpy()
        np.testing.assert_array_equal(np.sort(every), np.flatnonzero(full))
        owner = book.nid2partid(every)
        expect = np.repeat(np.arange(4) // 2, [s.numel() for s in shares])
        assert np.mean(owner == expect) > 0.9
    emask = asyncgraph.DistTensor((g.num_edges(),), torch.bool, name="pf_emask", init=asyncgraph.zeros_init())
    emask[0:100] = True
    eshare = asyncgraph.edge_split(emask, rank=0, world_size=1)
    assert eshare.tolist() == list(range(100))
    with pytest.raises(InvalidRequestError, match="node mask"):
        asyncgraph.node_split(emask)
    emask.delete()
