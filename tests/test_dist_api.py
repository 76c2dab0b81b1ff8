"""The DGL-like user API (initialize, DistGraph, DistTensor, sample_neighbors), served and standalone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.client import IpConfig
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError, UnknownTensorError


@pytest.fixture(params=["served", "standalone"])
def g(request: pytest.FixtureRequest, pubmed2) -> Iterator[asyncgraph.DistGraph]:
    if request.param == "served":
        asyncgraph.initialize(request.getfixturevalue("served").ip_config())
        graph = asyncgraph.DistGraph("pubmed")
    else:
        asyncgraph.initialize()
        graph = asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
    assert asyncgraph.is_standalone() == (request.param == "standalone")
    yield graph
    asyncgraph.finalize()


def test_ip_config_errors_name_the_line(tmp_path: Path) -> None:
    good = IpConfig.parse("# servers\n127.0.0.1 4000\n\n127.0.0.1\nnode-2.cluster 4001  # comment\n")
    assert good.addresses() == [("127.0.0.1", 4000), ("127.0.0.1", 30050), ("node-2.cluster", 4001)]
    for text, where in [
        ("127.0.0.1 4000\n127.0.0.1 99999\n", "line 2"),
        ("a b c\n", "line 1"),
        ("127.0.0.1 port\n", "line 1"),
        ("bad_host! 1\n", "line 1"),
    ]:
        with pytest.raises(ValueError, match=where):
            IpConfig.parse(text)
    with pytest.raises(ValueError, match="no servers"):
        IpConfig.parse("# nothing\n")


def test_graph_metadata_and_ndata(g: asyncgraph.DistGraph, pubmed2) -> None:
    assert g.num_nodes() == 19717 and g.num_edges() == 88648
    book = g.get_partition_book()
    assert book.num_partitions() == 2
    assert {"feat", "label", "train_mask", "val_mask", "test_mask"} <= set(g.ndata)
    feat = g.ndata["feat"]
    assert feat.shape == (19717, 500) and feat.dtype == torch.float32 and len(feat) == 19717
    ids = torch.tensor([3, 19716, 3, 10000])
    np.testing.assert_array_equal(feat[ids].numpy(), pubmed2.original_rows("feat", ids.numpy()))
    np.testing.assert_array_equal(feat[5:9].numpy(), pubmed2.original_rows("feat", np.arange(5, 9)))
    assert feat[7].shape == (500,)
    assert g.local_partition is not None  # served: shared memory; standalone: in-process
    with pytest.raises(UnknownTensorError):
        g.ndata["nope"]
    with pytest.raises(OutOfRangeError):
        feat[19717]


def test_dist_tensor_create_write_and_accumulate(g: asyncgraph.DistGraph) -> None:
    n = g.num_nodes()
    t = asyncgraph.DistTensor((n, 2), torch.float32, name="api_scratch", init=asyncgraph.zeros_init())
    assert t.policy == "node" and t.shape == (n, 2)
    g.ndata["api_scratch"] = t
    assert "api_scratch" in g.ndata
    t[torch.tensor([0, n - 1])] = torch.ones(2, 2)
    t[10:12] = 5.0  # broadcast
    t.push(torch.tensor([0, 0, n - 1]), torch.full((3, 2), 2.0), op="add")
    np.testing.assert_array_equal(t[[0, n - 1, 10, 11, 1]].numpy(), [[5, 5], [3, 3], [5, 5], [5, 5], [0, 0]])
    same = asyncgraph.DistTensor((n, 2), torch.float32, name="api_scratch")  # reuse by name
    assert same[0].tolist() == [5.0, 5.0]
    with pytest.raises(InvalidRequestError):
        asyncgraph.DistTensor((n, 3), torch.float32, name="api_scratch")
    with pytest.raises(DTypeMismatchError):
        t[[1]] = torch.ones(1, 2, dtype=torch.int64)
    e = asyncgraph.DistTensor((g.num_edges(), 1), torch.int64, name="api_edge")
    assert e.policy == "edge" and int(e[[g.num_edges() - 1]].sum()) == 0
    with pytest.raises(InvalidRequestError, match="partition policy"):
        asyncgraph.DistTensor((17, 2), torch.float32)
    r = asyncgraph.DistTensor(
        (n, 4), torch.float32, name="api_rand", init=asyncgraph.uniform_init(-1, 1, seed=7)
    )
    values = r[0:n].numpy()
    assert -1 <= values.min() < -0.9 and 0.9 < values.max() <= 1
    t.delete()
    e.delete()
    r.delete()


def test_sample_neighbors_api(g: asyncgraph.DistGraph, pubmed2) -> None:
    seeds = torch.arange(0, g.num_nodes(), 50)
    src, dst, eids = asyncgraph.sample_neighbors(g, seeds, 4, seed=3)
    assert src.dtype == torch.int64 and len(src) == len(dst) == len(eids)
    assert np.isin(dst.numpy(), seeds.numpy()).all()
    counts = np.bincount(np.searchsorted(seeds.numpy(), dst.numpy()), minlength=len(seeds))
    assert counts.max() <= 4
    orig = pubmed2.raw
    pairs = set(zip(orig["src"].tolist(), orig["dst"].tolist(), strict=True))
    on = pubmed2.orig_nids
    assert all((int(on[s]), int(on[d])) in pairs for s, d in zip(src.tolist(), dst.tolist(), strict=True))
    np.testing.assert_array_equal(pubmed2.raw["src"][pubmed2.orig_eids[eids.numpy()]], on[src.numpy()])
    again = asyncgraph.sample_neighbors(g, seeds, 4, seed=3)
    assert all(torch.equal(a, b) for a, b in zip((src, dst, eids), again, strict=True))
    with pytest.raises(InvalidRequestError, match="edge_dir"):
        asyncgraph.sample_neighbors(g, seeds, 4, edge_dir="both")
