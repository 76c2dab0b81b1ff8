"""Layer-wise inference of heterogeneous models (ACM, served by 2 server processes and standalone)
and of PyG models (PubMed): equal to a full-graph forward pass on one machine to 1e-5."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.dataloading import to_block
from asyncgraph.dataloading.hetero_block import HeteroBlock
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError, UnknownTypeError
from asyncgraph.inference import layerwise_inference
from asyncgraph.nn import GraphConv, HeteroGraphConv, HeteroGraphSAGE
from asyncgraph.partition.hetero_graph import HeteroGraph

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from hetero_node_classification import load_acm  # noqa: E402

WORDS = 64


def _full_block(hg: HeteroGraph) -> HeteroBlock:
    """The whole original graph as one block: every node a destination and a source."""
    ids = {t: torch.arange(hg.num_nodes(t)) for t in hg.ntypes}
    edges = {}
    for c in hg.canonical_etypes:
        s, d = hg.edges(etype=c)
        edges[c] = (torch.from_numpy(s), torch.from_numpy(d), torch.arange(s.size))
    empty = np.empty(0, dtype=np.int64)
    return HeteroBlock(
        list(hg.ntypes), list(hg.canonical_etypes), ids, ids, edges, to_block(empty, empty, empty)
    )


def _full_forward(hg: HeteroGraph, layers: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """The reference: every layer on the whole original graph, in one process, no partitions."""
    full = _full_block(hg)
    h = {t: torch.from_numpy(np.asarray(hg.nodes[t].data["feat"])) for t in hg.ntypes}
    with torch.no_grad():
        for i, layer in enumerate(layers):
            h = layer(full, h)
            if i != len(layers) - 1:
                h = {t: torch.relu(v) for t, v in h.items()}
    return h


@pytest.fixture(scope="module")
def acm(tmp_path_factory: pytest.TempPathFactory) -> tuple[HeteroGraph, Path, dict[str, np.ndarray]]:
    """ACM (64 words) in 2 random partitions, with the per-type new -> original ID maps."""
    out = tmp_path_factory.mktemp("acm-inf")
    hg = load_acm(words=WORDS)
    nmap, _ = asyncgraph.partition_graph(hg, "acm", 2, out, part_method="random", return_mapping=True)
    return hg, out / "acm.json", {t: np.asarray(v) for t, v in nmap.items()}


@pytest.fixture(params=["served", "standalone"])
def acm_g(
    request: pytest.FixtureRequest, acm: tuple[HeteroGraph, Path, dict[str, np.ndarray]], tmp_path: Path
) -> Iterator[asyncgraph.DistGraph]:
    """ACM's DistGraph over 2 real server processes, or standalone."""
    from asyncgraph.testing import start_servers

    _, cfg, _ = acm
    group = None
    if request.param == "served":
        group = start_servers(cfg, tmp_path / "srv", num_parts=2)
        asyncgraph.initialize(group.ip_config())
        g = asyncgraph.DistGraph("acm")
    else:
        asyncgraph.initialize()
        g = asyncgraph.DistGraph("acm", part_config=cfg)
    try:
        yield g
    finally:
        asyncgraph.finalize()
        if group is not None:
            group.stop()


def _check(out: dict[str, object], want: dict[str, torch.Tensor], nmap: dict[str, np.ndarray]) -> None:
    assert set(out) == set(want)
    for t, tensor in out.items():
        n = nmap[t].size
        got = tensor[0:n]  # type: ignore[index]
        assert tuple(got.shape) == tuple(want[t].shape)
        torch.testing.assert_close(got, want[t][torch.from_numpy(nmap[t])], atol=1e-5, rtol=1e-5)


def test_hetero_sage_equals_full_graph_forward(
    acm_g: asyncgraph.DistGraph, acm: tuple[HeteroGraph, Path, dict[str, np.ndarray]]
) -> None:
    hg, _, nmap = acm
    torch.manual_seed(0)
    model = HeteroGraphSAGE(hg.canonical_etypes, WORDS, 32, 3, n_layers=2, target="paper").eval()
    want = _full_forward(hg, list(model.layers))
    out = layerwise_inference(acm_g, model, "feat", batch_size=1500, name="hs")
    assert all(v.shape == (hg.num_nodes(t), 3) for t, v in out.items())
    _check(out, want, nmap)
    assert "hs.0" not in acm_g.ndata  # the intermediate layer was freed
    assert acm_g.ndata["hs.done"].count_nonzero() == acm_g.num_nodes()
    for name in ("hs.1", "hs.done"):
        acm_g.ndata[name].delete()


@pytest.fixture
def acm_alone(acm: tuple[HeteroGraph, Path, dict[str, np.ndarray]]) -> Iterator[asyncgraph.DistGraph]:
    """ACM's DistGraph standalone (the served path is checked by the SAGE test)."""
    asyncgraph.initialize()
    try:
        yield asyncgraph.DistGraph("acm", part_config=acm[1])
    finally:
        asyncgraph.finalize()


def test_hetero_graphconv_typed_nodes_and_resume(
    acm_alone: asyncgraph.DistGraph, acm: tuple[HeteroGraph, Path, dict[str, np.ndarray]]
) -> None:
    """An RGCN-style model (per-relation GraphConv, right norm) as a list of layers, nodes given
    as {ntype: ids}, a resume that recomputes only lost rows, and typed errors."""
    hg, _, nmap = acm
    acm_g = acm_alone
    torch.manual_seed(1)
    mods = {f"{s}:{r}:{d}": GraphConv(WORDS, 16, norm="right") for s, r, d in hg.canonical_etypes}
    mods2 = {f"{s}:{r}:{d}": GraphConv(16, 4, norm="right") for s, r, d in hg.canonical_etypes}
    layers = [HeteroGraphConv(mods), HeteroGraphConv(mods2)]
    want = _full_forward(hg, layers)
    nodes = {t: np.arange(hg.num_nodes(t)) for t in hg.ntypes}
    out = layerwise_inference(
        acm_g, layers, "feat", nodes=nodes, batch_size=2500, name="rg", keep_intermediate=True
    )
    _check(out, want, nmap)
    lost = torch.from_numpy(acm_g.get_partition_book().map_to_homo_nid(np.arange(0, 4000, 3), "paper"))
    acm_g.ndata["rg.done"][lost] = torch.ones(lost.numel(), dtype=torch.int8)
    acm_g.ndata["rg.1"][lost] = torch.full((lost.numel(), 4), 99.0)
    seen: list[int] = []

    def step(i: int, layer: torch.nn.Module, block: HeteroBlock, h: dict[str, torch.Tensor]) -> dict:
        seen.append(block.num_dst_nodes())
        return {t: torch.relu(v) if i == 0 else v for t, v in layer(block, h).items()}

    out = layerwise_inference(
        acm_g, layers, "feat", nodes=nodes, batch_size=2500, name="rg", resume=True, layer_fn=step
    )
    assert sum(seen) == lost.numel()  # only the lost rows of layer 1 were recomputed
    _check(out, want, nmap)
    # a type the model gives no output for is an error naming it
    only_paper = [HeteroGraphConv({"writes": GraphConv(WORDS, 4, norm="right")})]
    with pytest.raises(ShapeMismatchError, match="no output for node type 'author'"):
        layerwise_inference(acm_g, only_paper, "feat", name="bad")
    with pytest.raises(UnknownTypeError, match="shop"):
        layerwise_inference(acm_g, only_paper, "feat", nodes={"shop": [0]}, name="bad")
    for name in [n for n in acm_g.ndata if n.startswith(("rg.", "bad."))]:
        acm_g.ndata[name].delete()


def test_pyg_model_through_the_pyg_backend(pubmed2) -> None:  # type: ignore[no-untyped-def]
    """PyG's own SAGEConv layers (a BasicGNN's .convs) over asyncgraph's blocks, PubMed standalone."""
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
        torch.manual_seed(0)
        model = pyg_nn.GraphSAGE(500, 32, num_layers=2, out_channels=3).eval()
        src, dst = g.edges()
        edge_index = torch.stack([torch.as_tensor(src), torch.as_tensor(dst)])
        x = g.ndata["feat"][0 : g.num_nodes()]
        with torch.no_grad():
            want = model(x, edge_index)  # PyG's own full-graph forward
        out = layerwise_inference(g, model, "feat", batch_size=5000, name="pyg")
        torch.testing.assert_close(out[0 : g.num_nodes()], want, atol=1e-5, rtol=1e-5)
        for name in ("pyg.1", "pyg.done"):
            g.ndata[name].delete()
    finally:
        asyncgraph.finalize()


def test_default_share_balances_in_edges(pubmed2, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The default split gives each of 2 trainers a contiguous range with the same in-edges +
    nodes cost (node-balanced partitions can differ several-fold in edges), covering every node."""
    from asyncgraph.inference import _my_nodes

    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
        deg = np.asarray(g.in_degrees(), dtype=np.float64)
        shares = []
        for rank in (0, 1):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            shares.append(_my_nodes(g, None, "edges").numpy())
        np.testing.assert_array_equal(np.concatenate(shares), np.arange(g.num_nodes()))
        cost = [float((deg[s] + deg.mean()).sum()) for s in shares]
        assert abs(cost[0] - cost[1]) <= 2 * (deg.max() + deg.mean())
        with pytest.raises(InvalidRequestError, match="balance"):
            layerwise_inference(g, [GraphConv(500, 3)], "feat", balance="work")
    finally:
        asyncgraph.finalize()
