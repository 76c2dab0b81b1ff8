"""partition_graph(Data | HeteroData) (issue 33 item 9): PyG's graphs partitioned as they are,
tensors under PyG's names, served back to PyG's loaders under the same names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.errors import InvalidRequestError

pytest.importorskip("torch_geometric")

from torch_geometric.data import Data, HeteroData

from asyncgraph.pyg import DistFeatureStore, DistNeighborLoader


def _data(seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    n, m = 200, 900
    return Data(
        x=torch.randn(n, 5, generator=g),
        y=torch.randint(0, 3, (n,), generator=g),
        train_mask=torch.rand(n, generator=g) < 0.5,
        edge_index=torch.randint(0, n, (2, m), generator=g),
        edge_attr=torch.randn(m, 2, generator=g),
    )


def test_partition_pyg_data(tmp_path: Path) -> None:
    data = _data()
    orig_n, orig_e = asyncgraph.partition_graph(
        data, "d", 2, tmp_path, part_method="random", return_mapping=True
    )
    orig_n, orig_e = np.asarray(orig_n), np.asarray(orig_e)
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("d", part_config=tmp_path / "d.json")
        assert g.num_nodes() == 200 and g.num_edges() == 900
        assert sorted(g.ndata.keys()) == ["train_mask", "x", "y"] and list(g.edata.keys()) == ["edge_attr"]
        b = next(iter(DistNeighborLoader(g, [4], batch_size=16, seed=0)))
        old = torch.from_numpy(orig_n[b.n_id.numpy()])
        for key in ("x", "y", "train_mask"):
            assert torch.equal(b[key], data[key][old]), key
        # each sampled edge is an edge of the PyG graph, edge_attr rows follow the edge IDs
        src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
        old_e = torch.from_numpy(orig_e[b.e_id.numpy()])
        assert torch.equal(data.edge_index[0, old_e], torch.from_numpy(orig_n[src.numpy()]))
        assert torch.equal(data.edge_index[1, old_e], torch.from_numpy(orig_n[dst.numpy()]))
        assert torch.equal(g.edata["edge_attr"][b.e_id], data.edge_attr[old_e])
    finally:
        asyncgraph.finalize()


def test_partition_pyg_heterodata(tmp_path: Path) -> None:
    hd = HeteroData()
    hd["paper"].x = torch.randn(30, 4)
    hd["paper"].y = torch.arange(30) % 3
    hd["author"].x = torch.randn(20, 4)
    hd["author", "writes", "paper"].edge_index = torch.stack([torch.arange(60) % 20, torch.arange(60) % 30])
    hd["paper", "written_by", "author"].edge_index = hd["author", "writes", "paper"].edge_index.flip(0)
    asyncgraph.partition_graph(hd, "h", 1, tmp_path, part_method="random")
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("h", part_config=tmp_path / "h.json")
        assert sorted(g.ntypes) == ["author", "paper"] and g.num_nodes("paper") == 30
        fs = DistFeatureStore(g)
        with pytest.raises(KeyError, match="author"):
            fs["author", "y", torch.tensor([0])]
        loader = DistNeighborLoader(
            g, {c: [3] for c in g.canonical_etypes}, input_nodes=("paper", None), batch_size=8
        )
        b = next(iter(loader))
        assert b["paper"].y.shape == (b["paper"].n_id.numel(),) and "y" not in b["author"]
        assert b["author"].x.shape[1] == 4
    finally:
        asyncgraph.finalize()


def test_pyg_input_refused_by_name(tmp_path: Path) -> None:
    data = _data()
    data.name = "not a tensor"
    with pytest.raises(InvalidRequestError, match="'name' is not a tensor"):
        asyncgraph.partition_graph(data, "d", 1, tmp_path / "a")
    data = _data()
    data.graph_feat = torch.zeros(1, 7)  # graph-level: neither per node nor per edge
    with pytest.raises(InvalidRequestError, match="graph_feat"):
        asyncgraph.partition_graph(data, "d", 1, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
