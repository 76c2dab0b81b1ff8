"""DGL's surface that its distributed examples use (issue 27 §3): block/pair-graph data frames
with dgl.NID/EID, counts as methods, local_scope, asyncgraph.function through apply_edges /
update_all, SAGEConv's (h_src, h_dst) input, GraphConv and WeightBasis against dense references,
pb.partid, DistTensor.count_nonzero and pickling, attr schemes, exclude='reverse_id'."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import asyncgraph
import asyncgraph as dgl
import asyncgraph.function as fn
import asyncgraph.nn.pytorch as dglnn
from asyncgraph.dataloading import to_block
from asyncgraph.dataloading.edge_loader import PairGraph
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError, UnknownTensorError


def _block() -> dgl.Block:
    # edges (global) src -> dst; dst nodes 10, 11, 12
    return to_block(
        [10, 20, 11, 30, 20, 40, 12, 10], [10, 10, 11, 11, 12, 12, 12, 12], [10, 11, 12], np.arange(8) + 100
    )


def _dense(block: dgl.Block) -> torch.Tensor:
    adj = torch.zeros(block.num_dst_nodes(), block.num_src_nodes(), dtype=torch.float64)
    adj.index_put_(
        (block.edge_index[1], block.edge_index[0]),
        torch.ones(block.num_edges(), dtype=torch.float64),
        accumulate=True,
    )
    return adj


def test_block_counts_ids_and_scopes() -> None:
    b = _block()
    assert (b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()) == (6, 3, 8)
    assert (b.number_of_src_nodes(), b.number_of_dst_nodes(), b.number_of_edges()) == (6, 3, 8)
    assert b.is_block and b.num_dst_nodes("_N") == 3
    assert torch.equal(b.srcdata[dgl.NID], b.srcnodes) and torch.equal(b.dstdata[dgl.NID], b.dstnodes)
    assert torch.equal(b.edata[dgl.EID], torch.arange(100, 108)) and dgl.EID in b.edata
    assert list(b.srcdata) == []  # the IDs are answered, not stored
    b.srcdata["h"] = torch.ones(6, 2)
    with b.local_scope():
        b.srcdata["tmp"] = torch.zeros(6, 1)
        assert "tmp" in b.srcdata
    assert "tmp" not in b.srcdata and "h" in b.srcdata
    local = b.local_var()
    local.dstdata["x"] = torch.zeros(3)
    assert "x" not in b.dstdata
    moved = b.to("cpu")
    assert torch.equal(moved.srcdata[dgl.NID], b.srcnodes) and "h" in moved.srcdata


def test_function_builtins_match_loops() -> None:
    b = _block()
    g = torch.Generator().manual_seed(0)
    hs, hd, he = (
        torch.randn(6, 4, generator=g),
        torch.randn(3, 4, generator=g),
        torch.randn(8, 4, generator=g),
    )
    b.srcdata["h"], b.dstdata["h"], b.edata["w"] = hs, hd, he
    src, dst = b.edge_index
    b.apply_edges(fn.u_dot_v("h", "h", "s"))
    assert b.edata["s"].shape == (8, 1)
    assert torch.allclose(b.edata["s"][:, 0], (hs[src] * hd[dst]).sum(1))
    b.apply_edges(fn.u_mul_e("h", "w", "m"))
    assert torch.allclose(b.edata["m"], hs[src] * he)
    b.apply_edges(lambda edges: {"d": edges.src["h"] - edges.dst["h"]})
    assert torch.allclose(b.edata["d"], hs[src] - hd[dst])
    for reducer in ("sum", "mean", "max", "min"):
        b.update_all(fn.copy_u("h", "m"), getattr(fn, reducer)("m", "out"))
        want = torch.stack(
            [
                getattr(hs[src[dst == d]], reducer)(0)
                if reducer in ("sum", "mean")
                else getattr(hs[src[dst == d]], reducer)(0).values
                for d in range(3)
            ]
        )
        assert torch.allclose(b.dstdata["out"], want), reducer
    with pytest.raises(UnknownTensorError, match="'nope'"):
        b.apply_edges(fn.u_dot_v("nope", "h", "s"))
    with pytest.raises(InvalidRequestError, match="reduce reads"):
        b.update_all(fn.copy_u("h", "m"), fn.sum("other", "out"))


def test_pair_graph_like_dgl() -> None:
    nodes = torch.tensor([7, 8, 9])
    pair = PairGraph(torch.tensor([0, 1]), torch.tensor([2, 0]), nodes, torch.tensor([40, 41]))
    neg = PairGraph(torch.tensor([0]), torch.tensor([1]), nodes, torch.empty(0, dtype=torch.int64))
    assert (
        pair.num_edges() == 2
        and pair.num_nodes() == 3
        and torch.equal(pair.edata[dgl.EID], torch.tensor([40, 41]))
    )
    assert dgl.EID not in neg.edata and torch.equal(pair.ndata[dgl.NID], nodes)
    h = torch.randn(3, 5)
    with pair.local_scope():
        pair.ndata["h"] = h
        pair.apply_edges(fn.u_dot_v("h", "h", "score"))
        score = pair.edata["score"]
    assert "h" not in pair.ndata and "score" not in pair.edata
    assert torch.allclose(score[:, 0], torch.stack([h[0] @ h[2], h[1] @ h[0]]))
    assert pair.to("cpu").num_edges() == 2


def test_sage_pair_input_and_graphconv_dense() -> None:
    torch.manual_seed(0)
    b = _block()
    x = torch.randn(6, 5, dtype=torch.float64)
    conv = dglnn.SAGEConv(5, 3, "mean").double()
    assert torch.allclose(conv(b, (x, x[:3])), conv(b, x))
    with pytest.raises(ShapeMismatchError, match="h_dst"):
        conv(b, (x, x[:2]))
    adj = _dense(b)
    in_deg = adj.sum(1).clamp(min=1)
    out_deg = adj.sum(0).clamp(min=1)
    for norm, want_adj in [
        ("right", adj / in_deg[:, None]),
        ("left", adj / out_deg[None, :]),
        ("both", adj / in_deg[:, None].sqrt() / out_deg[None, :].sqrt()),
        ("none", adj),
    ]:
        for fin, fout in ((5, 3), (5, 8)):  # weight applied before / after the aggregation
            xx = torch.randn(6, fin, dtype=torch.float64)
            gc = dglnn.GraphConv(fin, fout, norm=norm).double()
            assert torch.allclose(gc(b, xx), want_adj @ xx @ gc.weight + gc.bias), norm
    w = torch.randn(5, 3, dtype=torch.float64)
    gc = dglnn.GraphConv(5, 3, norm="right", weight=False, bias=False)
    assert torch.allclose(gc(b, x, weight=w), adj / in_deg[:, None] @ x @ w)
    with pytest.raises(InvalidRequestError, match="norm"):
        dglnn.GraphConv(5, 3, norm="bad")
    basis = dglnn.WeightBasis((5, 3), 2, 4)
    ws = basis()
    assert ws.shape == (4, 5, 3)
    assert torch.allclose(ws[1], basis.w_comp[1, 0] * basis.weight[0] + basis.w_comp[1, 1] * basis.weight[1])


def test_partid_count_nonzero_schemes_pickle(g: asyncgraph.DistGraph, pubmed2) -> None:
    pb = g.get_partition_book()
    assert pb.partid in (0, 1)
    ids = pb.partid2nids(pb.partid)
    assert (
        isinstance(ids, torch.Tensor)
        and ids.numel() == pb.node_range(pb.partid)[1] - pb.node_range(pb.partid)[0]
    )
    assert g.ndata["train_mask"].count_nonzero() == int(pubmed2.raw["train_mask"].sum()) == 60
    t = dgl.distributed.DistTensor((g.num_nodes(), 2), torch.float32, "cnz", persistent=True)
    t[torch.tensor([0, 5, 9])] = torch.tensor([[1.0, 0.0], [0.0, 0.0], [2.0, 3.0]])
    assert t.count_nonzero(chunk_rows=1000) == 3
    schemes = g.node_attr_schemes()
    assert schemes["feat"].shape == (500,) and schemes["feat"].dtype == torch.float32
    assert schemes["label"].shape == () and g.edge_attr_schemes() == {}
    back = pickle.loads(pickle.dumps(t))
    assert back.name == "cnz" and torch.equal(back[[9]], t[[9]])
    t.delete()


def test_exclude_reverse_id(g: asyncgraph.DistGraph) -> None:
    n = g.num_edges()
    src, dst = g.find_edges(torch.arange(n))
    key = src * g.num_nodes() + dst  # each edge's reverse: (dst, src) is stored too (undirected)
    order = torch.argsort(key)
    rev = order[torch.searchsorted(key[order], dst * g.num_nodes() + src)]
    eids = torch.arange(0, n, 97)
    loader = dgl.distributed.DistEdgeDataLoader(
        g, eids, dgl.dataloading.NeighborSampler([-1]), batch_size=64, shuffle=False,
        exclude="reverse_id", reverse_eids=rev,
    )  # fmt: skip
    for _, pair, blocks in loader:
        banned = torch.cat([pair.edata[dgl.EID], rev[pair.edata[dgl.EID]]])
        assert not torch.isin(blocks[0].edata[dgl.EID], banned).any()
        assert blocks[0].num_edges() > 0
    with pytest.raises(InvalidRequestError, match="reverse_eids"):
        dgl.distributed.DistEdgeDataLoader(
            g, eids, dgl.dataloading.NeighborSampler([2]), 8, exclude="reverse_id"
        )
    with pytest.raises(InvalidRequestError, match="one edge ID per edge"):
        dgl.distributed.DistEdgeDataLoader(
            g, eids, dgl.dataloading.NeighborSampler([2]), 8, exclude="reverse_id", reverse_eids=rev[:5]
        )


def test_per_type_tensors_and_type_data(tmp_path) -> None:
    """DGL's node~ntype policies: a DistTensor / DistEmbedding of one node type takes per-type
    IDs; g.nodes[t].data lists only the tensors type t was partitioned with."""
    a_src, a_dst = np.array([0, 1, 2, 2]), np.array([0, 0, 1, 2])  # author -> paper
    g0 = asyncgraph.heterograph(
        {("author", "writes", "paper"): (a_src, a_dst), ("paper", "written-by", "author"): (a_dst, a_src)},
        num_nodes_dict={"author": 3, "paper": 5},
    )
    g0.nodes["paper"].data["feat"] = np.arange(10, dtype=np.float32).reshape(5, 2)
    asyncgraph.partition_graph(g0, "tiny", 2, tmp_path / "t", part_method="random")
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("tiny", part_config=tmp_path / "t" / "tiny.json")
        assert "feat" in g.nodes["paper"].data and "feat" not in g.nodes["author"].data
        assert list(g.nodes["author"].data) == [] and g.get_ntype_id("paper") == 1
        with pytest.raises(UnknownTensorError, match="author"):
            g.nodes["author"].data["feat"]
        t = dgl.distributed.DistTensor((5,), torch.int64, "res", persistent=True)  # inferred: paper
        assert t.ntype == "paper" and t.shape == (5,) and len(t) == 5
        t[torch.tensor([4, 0])] = torch.tensor([40, 7])
        assert t[[0, 4]].tolist() == [7, 40] and t.count_nonzero() == 2
        assert pickle.loads(pickle.dumps(t))[[4]].tolist() == [40]
        assert "res" in g.nodes["author"].data  # made at run time: every type sees it
        with pytest.raises(InvalidRequestError, match="out of range"):
            t[[5]]
        pol = g.get_node_partition_policy("author")
        emb = dgl.distributed.DistEmbedding(3, 4, "aemb", part_policy=pol)
        rows = emb(torch.tensor([2, 0]))
        assert rows.shape == (2, 4) and emb.shape == (3, 4)
        assert torch.equal(emb.weight[[2, 0]], rows.detach())
        opt = dgl.distributed.optim.SparseAdam([emb], lr=0.1)
        before = emb.weight[[0, 1, 2]].clone()
        rows.sum().backward()
        opt.step()
        after = emb.weight[[0, 1, 2]]
        assert not torch.equal(after[[0, 2]], before[[0, 2]]) and torch.equal(after[1], before[1])
        papers = g.get_partition_book().partid2nids(0, "paper")  # per-type IDs partition 0 owns
        assert papers.dtype == torch.int64 and 0 < papers.numel() <= 5
        with pytest.raises(InvalidRequestError, match="node type"):
            dgl.distributed.DistTensor((4,), torch.float32, "bad", part_policy=pol)
        t.delete()
    finally:
        asyncgraph.finalize()


def test_graphsage_partition_script_calls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What DGL's examples/distributed/graphsage/partition_graph.py calls (its dataset loaders
    aside): ndata.pop renames, to_bidirected(readonly=True) + ndata copied over, and
    partition_graph with balance_ntypes, balance_edges, num_trainers_per_machine, use_graphbolt."""
    from pathlib import Path

    z = np.load(Path(__file__).resolve().parents[1] / "examples" / "data" / "cora.npz")
    g = dgl.graph((z["src"][::2], z["dst"][::2]), num_nodes=z["label"].size)  # half: not symmetric
    g.ndata["feat"], g.ndata["label"] = z["feat"], z["label"]
    g.ndata["train_mask"] = z["train_mask"]
    g.ndata["features"] = g.ndata.pop("feat")
    g.ndata["labels"] = g.ndata.pop("label")
    sym_g = dgl.to_bidirected(g, readonly=True)
    for key in g.ndata:
        sym_g.ndata[key] = g.ndata[key]
    src, dst = g.edges()
    want = sorted(
        set(zip(src.tolist(), dst.tolist(), strict=True)) | set(zip(dst.tolist(), src.tolist(), strict=True))
    )
    got_src, got_dst = sym_g.edges()
    assert list(zip(got_src.tolist(), got_dst.tolist(), strict=True)) == want  # both ways, once, sorted
    assert sym_g.num_edges() > g.num_edges() and sorted(sym_g.ndata) == ["features", "labels", "train_mask"]
    dgl.distributed.partition_graph(
        sym_g, "cora", 2, str(tmp_path), part_method="metis", balance_ntypes=sym_g.ndata["train_mask"],
        balance_edges=True, num_trainers_per_machine=1, use_graphbolt=False,
    )  # fmt: skip
    assert (tmp_path / "cora.json").is_file()
    with pytest.raises(InvalidRequestError, match="homogeneous Graph"):
        dgl.to_bidirected(dgl.heterograph({("a", "r", "a"): ([0], [1])}))
