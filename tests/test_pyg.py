"""asyncgraph.pyg: PyG's store interface, sampler and loaders over real servers and standalone."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    MemoryBudgetError,
    OutOfRangeError,
    UnknownTensorError,
    UnknownTypeError,
)

pytest.importorskip("torch_geometric")  # in the dev extra: CI always runs these

from torch_geometric.loader import LinkLoader, NeighborLoader, NodeLoader
from torch_geometric.sampler import NegativeSampling, NodeSamplerInput

from asyncgraph.pyg import (
    DistFeatureStore,
    DistGraphStore,
    DistLinkNeighborLoader,
    DistNeighborLoader,
    DistNeighborSampler,
)


def _new_ids(pubmed2: Any) -> tuple[np.ndarray, np.ndarray]:
    """The raw graph's edges in the partitioned (new) node IDs."""
    new_of_orig = np.empty_like(pubmed2.orig_nids)
    new_of_orig[pubmed2.orig_nids] = np.arange(pubmed2.orig_nids.size)
    return new_of_orig[pubmed2.raw["src"]], new_of_orig[pubmed2.raw["dst"]]


def test_feature_store_semantics(g: Any, pubmed2: Any) -> None:
    fs = DistFeatureStore(g)
    names = [a.attr_name for a in fs.get_all_tensor_attrs()]
    assert names[:2] == ["x", "y"] and "feat" not in names and "train_mask" in names
    idx = torch.tensor([5, 0, 19716, 5])
    want = pubmed2.original_rows("feat", idx.numpy())
    assert np.array_equal(fs[None, "x", idx].numpy(), want)  # PyG's fs[group, attr, index]
    assert np.array_equal(fs[None, "feat", idx].numpy(), want)  # our own name works too
    assert np.array_equal(
        fs.get_tensor(group_name=None, attr_name="y", index=idx).numpy(),
        pubmed2.original_rows("label", idx.numpy()),
    )
    view = fs[None, "x"]  # a partially specified key is a view, as PyG's stores give
    assert np.array_equal(view[idx].numpy(), want)
    assert fs.get_tensor_size(None, "x", None) == (19717, 500)
    x, y, mask = fs.multi_get_tensor(
        [(None, "x", idx), (None, "y", idx[:2]), (None, "train_mask", slice(0, 3))]
    )
    assert x.shape == (4, 500) and y.shape == (2,) and mask.shape == (3,)
    mask = torch.zeros(19717, dtype=torch.bool)
    mask[[0, 5]] = True  # a boolean index selects rows, as in PyG
    assert np.array_equal(fs[None, "x", mask].numpy(), pubmed2.original_rows("feat", np.array([0, 5])))
    everything = fs[None, "y", None]
    assert np.array_equal(everything.numpy(), pubmed2.original_rows("label", np.arange(19717)))
    # put / update / remove a tensor of our own
    h = torch.arange(19717 * 2, dtype=torch.float32).view(-1, 2)
    fs[None, "pyg_h", None] = h
    assert torch.equal(fs[None, "pyg_h", idx], h[idx])
    fs.update_tensor(torch.zeros(2, 2), group_name=None, attr_name="pyg_h", index=torch.tensor([1, 2]))
    assert torch.equal(fs[None, "pyg_h", torch.tensor([0, 1, 2])], torch.tensor([[0.0, 1], [0, 0], [0, 0]]))
    assert "pyg_h" in [a.attr_name for a in fs.get_all_tensor_attrs()]
    assert fs.remove_tensor(None, "pyg_h", None) is True
    assert fs.remove_tensor(None, "pyg_h", None) is False  # PyG's contract: False if absent
    with pytest.raises(UnknownTensorError, match="pyg_h"):
        fs[None, "pyg_h", idx]


def test_graph_store_walks_like_pygs(g: Any, pubmed2: Any) -> None:
    gs = DistGraphStore(g)
    attrs = gs.get_all_edge_attrs()
    assert {a.layout.value for a in attrs} == {"coo", "csc"}
    assert all(a.edge_type is None and a.size == (19717, 19717) for a in attrs)
    src, dst = gs[attrs[0]] if attrs[0].layout.value == "coo" else gs[attrs[1]]
    want_src, want_dst = _new_ids(pubmed2)
    got = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert got == set(zip(want_src.tolist(), want_dst.tolist(), strict=True))
    _row, colptr, _ = gs.csc()  # PyG's own conversion, as its NeighborSampler calls it
    assert colptr.numel() == 19718 and int(colptr[-1]) == 88648
    deg = np.bincount(want_dst, minlength=19717)
    assert np.array_equal(np.diff(colptr.numpy()), deg)
    # PyG's own NeighborSampler builds itself from our stores (sampling then needs pyg-lib)
    from torch_geometric.sampler import NeighborSampler

    fs = DistFeatureStore(g)
    with warnings.catch_warnings():  # PyG warns that it runs without pyg-lib
        warnings.simplefilter("ignore", UserWarning)
        assert NeighborSampler((fs, gs), num_neighbors=[-1]).num_nodes == 19717


def _reference_hops(src: np.ndarray, dst: np.ndarray, seeds: np.ndarray, hops: int) -> list[set[int]]:
    """Exact PyG-style hop node sets: each hop adds in-neighbours of the previous hop's new nodes."""
    seen = set(seeds.tolist())
    frontier = seeds
    out = [set(seeds.tolist())]
    for _ in range(hops):
        nbrs = set(src[np.isin(dst, frontier)].tolist()) - seen
        out.append(nbrs)
        seen |= nbrs
        frontier = np.fromiter(nbrs, dtype=np.int64)
    return out


def test_sampler_full_neighbourhood_equals_reference(g: Any, pubmed2: Any) -> None:
    src, dst = _new_ids(pubmed2)
    seeds = torch.tensor([17, 3, 9000, 19000, 12345])
    sampler = DistNeighborSampler(g, [-1, -1], seed=0)
    out = sampler.sample_from_nodes(NodeSamplerInput(input_id=torch.arange(5), node=seeds))
    node, row, col = out.node.numpy(), out.row.numpy(), out.col.numpy()
    assert np.array_equal(node[:5], seeds.numpy())  # seeds first, in order
    assert np.unique(node).size == node.size
    bounds = np.cumsum([0, *out.num_sampled_nodes])
    ref = _reference_hops(src, dst, seeds.numpy(), 2)
    for h in range(3):
        assert set(node[bounds[h] : bounds[h + 1]].tolist()) == ref[h]
    # every in-edge of each expanded node, once; edge IDs name those edges
    ebounds = np.cumsum([0, *out.num_sampled_edges])
    for h in range(2):
        frontier = node[bounds[h] : bounds[h + 1]]
        want = set(
            zip(src[np.isin(dst, frontier)].tolist(), dst[np.isin(dst, frontier)].tolist(), strict=True)
        )
        sl = slice(ebounds[h], ebounds[h + 1])
        assert set(zip(node[row[sl]].tolist(), node[col[sl]].tolist(), strict=True)) == want
    fsrc, fdst = g.find_edges(out.edge)
    assert np.array_equal(fsrc.numpy(), node[row]) and np.array_equal(fdst.numpy(), node[col])
    # features ride along in metadata as PyG's loaders read them: (input_id, time, x, y, edge_attr)
    x, y = out.metadata[-3], out.metadata[-2]
    assert np.array_equal(x.numpy(), pubmed2.original_rows("feat", node))
    assert np.array_equal(y.numpy(), pubmed2.original_rows("label", node))


def test_sampler_fanout_and_served_equals_standalone(served: Any, pubmed2: Any) -> None:
    seeds = np.arange(0, 19717, 97)

    def run() -> Any:
        g = (
            asyncgraph.DistGraph("pubmed")
            if not asyncgraph.is_standalone()
            else asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
        )
        return DistNeighborSampler(g, [4, 3], seed=7).sample_from_nodes(
            NodeSamplerInput(input_id=None, node=torch.from_numpy(seeds))
        )

    asyncgraph.initialize(served.ip_config())
    try:
        a = run()
    finally:
        asyncgraph.finalize()
    asyncgraph.initialize()
    try:
        b = run()
    finally:
        asyncgraph.finalize()
    for k in ("node", "row", "col", "edge"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
    # at most 4 (hop 1) and 3 (hop 2) in-edges per expanded node
    col = a.col.numpy()
    e1 = a.num_sampled_edges[0]
    assert np.bincount(col[:e1]).max() <= 4 and np.bincount(col[e1:]).max() <= 3


def test_pyg_node_and_link_loaders_take_our_sampler(g: Any, pubmed2: Any) -> None:
    fs, gs = DistFeatureStore(g), DistGraphStore(g)
    sampler = DistNeighborSampler(g, [5, 5], seed=1)
    train = torch.from_numpy(pubmed2.raw["train_mask"][pubmed2.orig_nids])
    loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=train, batch_size=16, shuffle=True)
    batches = list(loader)
    assert sum(b.batch_size for b in batches) == 60
    b = batches[0]
    assert b.x.shape == (b.n_id.numel(), 500) and b.y.shape == (b.n_id.numel(),)
    assert np.array_equal(b.x.numpy(), pubmed2.original_rows("feat", b.n_id.numpy()))
    assert int(b.edge_index.max()) < b.n_id.numel()
    assert bool(train[b.n_id[: b.batch_size]].all())
    # our loader takes the (fs, gs) pair as PyG's loaders do
    ours = next(iter(DistNeighborLoader((fs, gs), [5, 5], input_nodes=train, batch_size=16)))
    assert ours.batch_size == 16 and ours.x.shape == (ours.n_id.numel(), 500)
    # PyG's NeighborLoader with our sampler in place of its own (which needs pyg-lib)
    nl = NeighborLoader((fs, gs), [5, 5], neighbor_sampler=sampler, input_nodes=train, batch_size=60)
    assert next(iter(nl)).batch_size == 60
    # LinkLoader with PyG's binary negative sampling
    eli = torch.stack(g.find_edges(torch.arange(0, 88648, 1000)))
    ll = LinkLoader(
        (fs, gs),
        link_sampler=sampler,
        edge_label_index=(None, eli),
        batch_size=32,
        neg_sampling=NegativeSampling("binary", 1.0),
    )
    lb = next(iter(ll))
    assert lb.edge_label_index.shape == (2, 64) and lb.edge_label.tolist() == [1.0] * 32 + [0.0] * 32
    assert torch.equal(lb.n_id[lb.edge_label_index[:, :32]], eli[:, :32])


def _train_graphsage(loader: Any, test_loader: Any, epochs: int) -> float:
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(0)
    model = GraphSAGE(500, 32, num_layers=2, out_channels=3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        for b in loader:
            opt.zero_grad()
            out = model(b.x, b.edge_index)[: b.batch_size]
            torch.nn.functional.cross_entropy(out, b.y[: b.batch_size]).backward()
            opt.step()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for b in test_loader:
            pred = model(b.x, b.edge_index)[: b.batch_size].argmax(-1)
            correct += int((pred == b.y[: b.batch_size]).sum())
            total += b.batch_size
    return correct / total


def test_dist_neighbor_loader_trains_graphsage(g: Any, pubmed2: Any) -> None:
    train = g.ndata["train_mask"][0 : g.num_nodes()]
    test = g.ndata["test_mask"][0 : g.num_nodes()]
    loader = DistNeighborLoader(g, [10, 10], input_nodes=train, batch_size=20, shuffle=True, seed=0)
    test_loader = DistNeighborLoader(g, [10, 10], input_nodes=test, batch_size=500, seed=0)
    b = next(iter(loader))
    assert {"x", "y", "edge_index", "n_id", "e_id", "batch_size", "input_id"} <= set(b.keys())
    assert np.array_equal(b.n_id[: b.batch_size].numpy(), loader.input_nodes[b.input_id.numpy()])
    # device=: batches staged and copied in the background arrive identical (CPU here; CUDA in
    # dataloading/device.py's own tests)
    on_dev = next(iter(DistNeighborLoader(g, [5, 5], batch_size=64, seed=0, device="cpu")))
    plain = next(iter(DistNeighborLoader(g, [5, 5], batch_size=64, seed=0)))
    assert set(on_dev.keys()) == set(plain.keys())
    for k in plain.keys():  # noqa: SIM118 (a Data iterates as (key, value) pairs)
        assert (
            torch.equal(on_dev[k], plain[k]) if isinstance(plain[k], torch.Tensor) else on_dev[k] == plain[k]
        )
    acc = _train_graphsage(loader, test_loader, epochs=15)
    assert acc > 0.6, acc  # 3 classes; chance ~0.4 (the largest class)
    assert loader.stats.batches == 3


def test_dist_link_neighbor_loader(g: Any) -> None:
    eli = torch.stack(g.find_edges(torch.arange(0, 88648, 500)))
    ll = DistLinkNeighborLoader(g, [5], edge_label_index=eli, batch_size=50, neg_sampling="binary", seed=3)
    batches = list(ll)
    assert len(batches) == 4
    b = batches[0]
    assert b.edge_label_index.shape == (2, 100) and float(b.edge_label.sum()) == 50
    assert torch.equal(b.n_id[b.edge_label_index[:, :50]], eli[:, :50])
    ll.set_epoch(0)  # seeded per (seed, epoch, batch): epoch 0 again gives the same batches
    assert torch.equal(next(iter(ll)).n_id, b.n_id)
    tl = DistLinkNeighborLoader(g, [5], edge_label_index=eli, batch_size=8, neg_sampling=("triplet", 3))
    tb = next(iter(tl))
    assert tb.dst_neg_index.shape == (8, 3) and tb.src_index.shape == (8,)


def test_bad_input_is_typed_and_servers_keep_serving(g: Any) -> None:
    fs = DistFeatureStore(g)
    idx = torch.tensor([1, 2])
    with pytest.raises(UnknownTensorError, match="nope"):
        fs[None, "nope", idx]
    with pytest.raises(UnknownTypeError, match="paper"):
        fs["paper", "x", idx]
    with pytest.raises(DTypeMismatchError, match="integers"):
        fs[None, "x", torch.tensor([1.5])]
    with pytest.raises(OutOfRangeError, match="19717"):
        fs[None, "x", torch.tensor([19717])]
    with pytest.raises(UnknownTensorError, match="nope"):
        DistFeatureStore(g, attrs=["x", "nope"])
    for opts, word in [
        ({"disjoint": True}, "disjoint"),
        ({"subgraph_type": "induced"}, "induced"),
        ({"time_attr": "t"}, "temporal"),
        ({"weight_attr": "w"}, "weight_attr"),
    ]:
        with pytest.raises(InvalidRequestError, match=word):
            DistNeighborSampler(g, [5], **opts)
    with pytest.raises(DTypeMismatchError):
        DistNeighborSampler(g, [2.5])
    with pytest.raises(UnknownTensorError, match="nope"):
        DistNeighborSampler(g, [5], x="nope")
    sampler = DistNeighborSampler(g, [5])
    with pytest.raises(OutOfRangeError):
        sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([0, 10**9])))
    with pytest.raises(InvalidRequestError, match="unique"):
        sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.tensor([3, 3])))
    with pytest.raises(OutOfRangeError):
        DistNeighborLoader(g, [5], input_nodes=torch.tensor([-1]))
    with pytest.raises(InvalidRequestError, match="edge_label_index"):
        DistLinkNeighborLoader(g, [5], edge_label_index=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(InvalidRequestError, match="read-only"):
        DistGraphStore(g).put_edge_index(
            torch.zeros(2, 1, dtype=torch.long), edge_type=None, layout="coo", size=(1, 1)
        )
    # issue 32: a 2e8-row index (zero pages: it costs no memory) is refused typed, before any
    # row is allocated (500 float32 a row: 400 GB), not a MemoryError
    huge = torch.from_numpy(np.zeros(200_000_000, dtype=np.int64))
    with pytest.raises(MemoryBudgetError, match="200000000 rows of 1 tensor"):
        fs[None, "x", huge]
    with pytest.raises(MemoryBudgetError, match="max_get_bytes"):
        DistFeatureStore(g, max_get_bytes=1000)[None, "x", torch.arange(2)]  # 4000 bytes
    del huge
    # nothing changed, everything still answers
    assert fs[None, "x", idx].shape == (2, 500)
    assert sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=idx)).node[:2].tolist() == [1, 2]


# --- heterogeneous: ACM ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """ACM (small word features) partitioned once into 1 partition, with its per-type ID mapping."""
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parent.parent / "examples"
    sys.path.insert(0, str(examples))
    from hetero_node_classification import load_acm

    out = tmp_path_factory.mktemp("acm1")
    nmap, _ = asyncgraph.partition_graph(
        load_acm(words=32), "acm", 1, out, part_method="random", return_mapping=True
    )
    return {
        "config": out / "acm.json",
        "nmap": {k: np.asarray(v) for k, v in nmap.items()},
        "raw": dict(np.load(examples / "data" / "acm.npz")),
    }


def test_hetero_sampler_and_loader(acm: dict[str, Any]) -> None:
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("acm", part_config=acm["config"])
        fs, gs = DistFeatureStore(g), DistGraphStore(g)
        assert {a.group_name for a in fs.get_all_tensor_attrs()} == {"paper", "author", "subject"}
        assert fs.get_tensor_size("author", "x", None) == (7167, 32)
        with pytest.raises(UnknownTypeError, match="venue"):
            fs["venue", "x", torch.tensor([0])]
        with pytest.raises(OutOfRangeError, match="7167"):
            fs["author", "x", torch.tensor([7167])]
        # one hop, every in-edge: the seeds' authors and subjects, exactly
        new = {t: np.argsort(m) for t, m in acm["nmap"].items()}  # original per-type ID -> new
        raw = acm["raw"]
        seeds = torch.tensor([3, 0, 100, 4018])
        sampler = DistNeighborSampler(g, [-1], seed=0)
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds, input_type="paper"))
        assert torch.equal(out.node["paper"][:4], seeds)
        pa_paper = new["paper"][raw["src:paper:written-by:author"]]
        pa_author = new["author"][raw["dst:paper:written-by:author"]]
        want = pa_author[np.isin(pa_paper, seeds.numpy())]
        writes = ("author", "writes", "paper")
        got_authors = out.node["author"][out.row[writes]].numpy()
        got_papers = out.node["paper"][out.col[writes]].numpy()
        assert sorted(got_authors.tolist()) == sorted(want.tolist())
        assert set(got_papers.tolist()) <= set(seeds.tolist())
        assert set(out.node["author"].tolist()) == set(want.tolist())
        assert out.num_sampled_nodes["paper"] == [4, 0] and out.num_sampled_edges[writes] == [want.size]
        # PyG's NodeLoader and our loader give HeteroData with x per type and y for papers
        train = torch.from_numpy(np.flatnonzero(g.nodes["paper"].data["train_mask"][0:4019].numpy()))
        fan = {c: [5, 5] for c in g.canonical_etypes}
        nl = NodeLoader(
            (fs, gs), node_sampler=DistNeighborSampler(g, fan), input_nodes=("paper", train), batch_size=20
        )
        hb = next(iter(nl))
        assert hb["paper"].batch_size == 20 and hb["author"].x.shape[1] == 32
        for b in (hb, next(iter(DistNeighborLoader(g, fan, input_nodes=("paper", train), batch_size=20)))):
            assert torch.equal(b["paper"].n_id[:20], train[:20])  # seeds first
            for c in g.canonical_etypes:
                ei = b[c].edge_index
                assert ei.shape[1] == 0 or (
                    int(ei[0].max()) < b[c[0]].num_nodes and int(ei[1].max()) < b[c[2]].num_nodes
                )
            n_id = b["paper"].n_id
            assert torch.equal(b["paper"].y, fs["paper", "y", n_id])
            assert torch.equal(b["author"].x, fs["author", "x", b["author"].n_id])
        # the graph store: per-type COO equals the raw relation
        src, dst = gs[("paper", "written-by", "author"), "coo"]
        assert set(zip(src.tolist(), dst.tolist(), strict=True)) == set(
            zip(pa_paper.tolist(), pa_author.tolist(), strict=True)
        )
        with pytest.raises(InvalidRequestError, match="replace"):
            DistNeighborSampler(g, [5], replace=True)
    finally:
        asyncgraph.finalize()
