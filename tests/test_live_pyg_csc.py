"""PyG's graph store over a live graph (issue 35): after edges were added and removed, its CSC
groups the live edges by destination and its edge permutation names each position's edge ID,
so PyG's loaders (and ours, over the same stores) see only live edges. Cora in two partitions
on real server processes."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.testing import start_servers

pytest.importorskip("torch_geometric")

from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.sampler import NeighborSampler

from asyncgraph.pyg import DistFeatureStore, DistGraphStore, DistNeighborLoader


def _update(g: Any, rng: np.random.Generator) -> dict[int, tuple[int, int]]:
    """Add nodes and edges (some into the new nodes), remove base and new edges; the live
    edge set ``eid -> (src, dst)`` as ``g.edges`` lists it."""
    n = g.num_nodes()
    new = g.add_nodes(3, part=1).numpy()
    src = np.concatenate([rng.integers(0, n, 150), new, rng.integers(0, n, 3)])
    dst = np.concatenate([rng.integers(0, n, 150), rng.integers(0, n, 3), new])
    added = g.add_edges(torch.from_numpy(src), torch.from_numpy(dst)).numpy()
    gone = np.concatenate([np.arange(0, g.num_edges(), 37), added[::5]])
    g.remove_edges(torch.from_numpy(gone))
    s, d, e = (t.numpy() for t in g.edges(form="all"))
    assert not np.isin(gone, e).any() and np.isin(added[1::5], e).all()
    return {int(a): (int(b), int(c)) for a, b, c in zip(e.tolist(), s.tolist(), d.tolist(), strict=True)}


def _check_csc(csc: Any, edges: dict[int, tuple[int, int]]) -> Any:
    """``csc`` (PyG's ``(row, colptr, perm)``) holds each edge of ``edges`` once, position ``k``
    of column ``c`` being edge ``perm[k]`` (``k`` without a perm) from ``row[k]`` to ``c``."""
    row, colptr, perm = csc
    ptr = colptr.numpy()
    col = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    ids = np.arange(row.numel()) if perm is None else perm.numpy()
    assert sorted(ids.tolist()) == sorted(edges)
    assert all(edges[e] == (a, b) for e, a, b in zip(ids.tolist(), row.tolist(), col.tolist(), strict=True))
    return csc


@pytest.mark.timeout(180)
def test_the_graph_stores_csc_of_an_updated_graph_and_loaders_over_it(cora2: Any, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    asyncgraph.initialize(group.ip_config())
    try:
        g = asyncgraph.DistGraph("cora")
        gs, fs = DistGraphStore(g), DistFeatureStore(g)
        s0, d0, e0 = (t.numpy() for t in g.edges(form="all"))
        _check_csc(gs.csc(), {int(e): (int(a), int(b)) for e, a, b in zip(e0, s0, d0, strict=True)})
        live = _update(g, np.random.default_rng(11))
        # the expectation, from g.edges(): sources grouped by destination, stable by edge ID
        eids = np.array(sorted(live), dtype=np.int64)
        src = np.array([live[e][0] for e in eids.tolist()], dtype=np.int64)
        dst = np.array([live[e][1] for e in eids.tolist()], dtype=np.int64)
        order = np.argsort(dst, kind="stable")
        cols = int(dst.max()) + 1
        assert cols > g.num_nodes() - 3  # an added node is a destination: colptr covers it
        want_ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=cols))])
        row, colptr, perm = _check_csc(gs.csc(), live)  # PyG's call (its NeighborSampler's)
        np.testing.assert_array_equal(row.numpy(), src[order])
        np.testing.assert_array_equal(colptr.numpy(), want_ptr)
        assert perm is not None
        np.testing.assert_array_equal(perm.numpy(), eids[order])
        attr = next(a for a in gs.get_all_edge_attrs() if a.layout == EdgeLayout.CSC)
        got_row, got_ptr = gs[attr]  # the CSC attribute itself
        np.testing.assert_array_equal(got_row.numpy(), src[order])
        np.testing.assert_array_equal(got_ptr.numpy(), want_ptr)
        with warnings.catch_warnings():  # PyG warns that it runs without pyg-lib
            warnings.simplefilter("ignore", UserWarning)
            sampler = NeighborSampler((fs, gs), num_neighbors=[-1])
        assert sampler.edge_permutation is not None
        np.testing.assert_array_equal(sampler.edge_permutation.numpy(), eids[order])
        # our loader over the same (fs, gs) pair: every sampled edge is live, nothing removed
        seeds = torch.from_numpy(np.unique(dst[:: max(1, dst.size // 200)]))
        seen = 0
        for batch in DistNeighborLoader((fs, gs), [-1, 4], input_nodes=seeds, batch_size=64):
            s = batch.n_id[batch.edge_index[0]].tolist()
            d = batch.n_id[batch.edge_index[1]].tolist()
            for e, a, b in zip(batch.e_id.tolist(), s, d, strict=True):
                assert live[e] == (a, b)
            seen += batch.e_id.numel()
        assert seen > 0
    finally:
        asyncgraph.finalize()
        group.stop()
