"""asyncgraph.pyg behaves as PyG does (issue 33 items 7-10): each divergence against PyG's own code.

PyG's in-memory ``NeighborLoader`` needs pyg-lib or torch-sparse (no wheel for this torch), so
PyG's behaviour is taken from the PyG code that runs without them on the same input: its
``NumNeighbors`` checks, its ``LinkLoader`` over our stores, its ``filter_data`` (what its
in-memory loaders put in a batch), its ``NodeLoader`` with worker processes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, ShapeMismatchError, UnknownTensorError

pytest.importorskip("torch_geometric")

from torch_geometric.data import Data
from torch_geometric.loader import LinkLoader, NodeLoader
from torch_geometric.loader.utils import filter_data
from torch_geometric.sampler.base import NumNeighbors

from asyncgraph.pyg import (
    DistFeatureStore,
    DistGraphStore,
    DistLinkNeighborLoader,
    DistNeighborLoader,
    DistNeighborSampler,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def acm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ACM (32 word features, labels on papers only), one partition."""
    import sys

    sys.path.insert(0, str(EXAMPLES))
    from hetero_node_classification import load_acm

    out = tmp_path_factory.mktemp("acm1")
    asyncgraph.partition_graph(load_acm(words=32), "acm", 1, out, part_method="random")
    return out / "acm.json"


@pytest.fixture
def acm_g(acm: Path) -> Any:
    """ACM standalone on a client of its own (beside the process's PubMed one)."""
    from asyncgraph.client import Client

    client = Client.standalone(acm)
    yield asyncgraph.DistGraph("acm", client=client)
    client.close()


def _pyg_error(values: Any, edge_types: list[Any]) -> BaseException:
    with pytest.raises(BaseException) as info:
        NumNeighbors(values).get_values(edge_types)
    return info.value


def test_num_neighbors_checked_as_pyg_does(acm_g: Any, g: Any) -> None:
    canon = list(acm_g.canonical_etypes)
    missing = {canon[0]: [5]}
    unequal = {c: [5] if i else [5, 5] for i, c in enumerate(canon)}
    for bad in (missing, unequal):
        want = _pyg_error(bad, canon)
        assert isinstance(want, ValueError)
        with pytest.raises(ValueError, match="num_neighbors") as got:
            DistNeighborSampler(acm_g, bad)
        assert isinstance(got.value, InvalidRequestError) and str(want) in str(got.value)
        with pytest.raises(ValueError, match=str(want)[:30].replace("(", r"\(").replace(")", r"\)")):
            DistNeighborLoader(acm_g, bad, input_nodes=("paper", None), batch_size=4)
    # every edge type named, same hops: accepted (PyG's NumNeighbors too, with a default)
    DistNeighborSampler(acm_g, {c: [3, 2] for c in canon})
    DistNeighborSampler(acm_g, NumNeighbors({canon[0]: [3]}, default=[2]))
    # an int: PyG fails with "'int' object has no attribute 'values'"; here a TypeError naming it
    with pytest.raises(AttributeError):
        _ = NumNeighbors(10).num_hops
    for graph in (g, acm_g):
        with pytest.raises(TypeError, match=r"num_neighbors must be a list .*\[10, 5\]"):
            DistNeighborSampler(graph, 10)
    with pytest.raises(DTypeMismatchError, match="num_neighbors"):
        DistNeighborLoader(g, 10, batch_size=4)


def test_binary_labels_shift_and_triplet_rule_as_pyg_linkloader(g: Any) -> None:
    eli = torch.stack(g.find_edges(torch.arange(0, 88648, 2000)))
    labels = torch.arange(eli.shape[1]) % 3  # categorical, with 0: PyG shifts it by one
    fs, gs = DistFeatureStore(g), DistGraphStore(g)
    sampler = DistNeighborSampler(g, [3], seed=0)
    theirs = next(
        iter(
            LinkLoader(
                (fs, gs),
                link_sampler=sampler,
                edge_label_index=(None, eli),
                edge_label=labels,
                neg_sampling="binary",
                batch_size=16,
            )
        )
    )
    for eli_form in (eli, (None, eli)):  # a plain tensor and PyG's store form
        ours = next(
            iter(
                DistLinkNeighborLoader(
                    g, [3], edge_label_index=eli_form, edge_label=labels, neg_sampling="binary", batch_size=16
                )
            )
        )
        assert torch.equal(ours.edge_label, theirs.edge_label)
    assert theirs.edge_label[:16].tolist() == (labels[:16] + 1).tolist()
    assert theirs.edge_label[16:].tolist() == [0] * 16
    with pytest.raises(ValueError, match="edge_label") as pyg:
        LinkLoader(
            (fs, gs),
            link_sampler=sampler,
            edge_label_index=(None, eli),
            edge_label=labels,
            neg_sampling="triplet",
        )
    with pytest.raises(ValueError, match="'edge_label' needs to be undefined for 'triplet'") as mine:
        DistLinkNeighborLoader(g, [3], edge_label_index=eli, edge_label=labels, neg_sampling="triplet")
    assert isinstance(mine.value, InvalidRequestError) and isinstance(pyg.value, ValueError)
    with pytest.raises(InvalidRequestError, match="homogeneous"):
        DistLinkNeighborLoader(g, [3], edge_label_index=(("a", "b", "c"), eli))


def test_hetero_types_without_a_tensor_have_none(acm_g: Any) -> None:
    fs = DistFeatureStore(acm_g)
    assert fs["paper", "y", torch.tensor([0, 1])].shape == (2,)
    with pytest.raises(
        KeyError, match=r"node type 'author' has no tensor y \(label\); node types with it: \['paper'\]"
    ):
        fs["author", "y", torch.tensor([0, 1])]  # before: zeros
    with pytest.raises(UnknownTensorError):
        fs.get_tensor_size("author", "train_mask", None)
    assert {a.group_name for a in fs.get_all_tensor_attrs()} == {"author", "paper", "subject"}
    canon = list(acm_g.canonical_etypes)
    b = next(
        iter(DistNeighborLoader(acm_g, {c: [4] for c in canon}, input_nodes=("paper", None), batch_size=8))
    )
    assert "y" in b["paper"] and "train_mask" in b["paper"]
    assert "y" not in b["author"] and "train_mask" not in b["author"] and "x" in b["author"]
    assert torch.equal(b["paper"].y, fs["paper", "y", b["paper"].n_id])
    # PyG's own NodeLoader over our stores: y of the seed type only, x for every type
    sampler = DistNeighborSampler(acm_g, {c: [4] for c in canon})
    nb = next(
        iter(
            NodeLoader(
                (fs, DistGraphStore(acm_g)),
                node_sampler=sampler,
                input_nodes=("paper", torch.arange(8)),
                batch_size=8,
            )
        )
    )
    assert torch.equal(nb["paper"].y, fs["paper", "y", nb["paper"].n_id]) and "y" not in nb["author"]


def test_masks_uint8_like_bool_and_shapes_named(acm_g: Any, g: Any) -> None:
    m = acm_g.nodes["paper"].data["train_mask"][0:4019]
    assert m.dtype == torch.uint8  # as stored
    canon = list(acm_g.canonical_etypes)
    fan = {c: [2] for c in canon}
    via_u8 = DistNeighborLoader(acm_g, fan, input_nodes=("paper", m), batch_size=64)
    via_bool = DistNeighborLoader(acm_g, fan, input_nodes=("paper", m.bool()), batch_size=64)
    assert np.array_equal(via_u8.input_nodes, via_bool.input_nodes) and via_u8.input_nodes.size == int(
        m.sum()
    )
    for bad in (m.bool()[:-1], m.bool().view(-1, 1)):
        with pytest.raises(
            ShapeMismatchError, match=r"input_nodes of 'paper': a boolean mask must have shape \(4019,\), got"
        ):
            DistNeighborLoader(acm_g, fan, input_nodes=("paper", bad), batch_size=64)
    mask = g.ndata["train_mask"][0 : g.num_nodes()].to(torch.uint8)
    assert DistNeighborLoader(g, [2], input_nodes=mask, batch_size=16).input_nodes.size == 60


@pytest.fixture(scope="module")
def pyg_named(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small graph whose node tensors carry PyG's names (x, y, train_mask), two partitions."""
    from asyncgraph.partition.graph import Graph

    rng = np.random.default_rng(0)
    n, m = 300, 1500
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    nd = {
        "x": rng.standard_normal((n, 6)).astype(np.float32),
        "y": rng.integers(0, 4, n).astype(np.int64),
        "train_mask": rng.random(n) < 0.3,
    }
    out = tmp_path_factory.mktemp("pyg_named")
    orig, _ = asyncgraph.partition_graph(
        Graph(n, src, dst, ndata=nd), "named", 2, out, part_method="random", return_mapping=True
    )
    return {"config": out / "named.json", "nd": nd, "orig": np.asarray(orig)}


def test_pyg_names_and_every_node_attribute_reach_batches(pyg_named: dict[str, Any]) -> None:
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph("named", part_config=pyg_named["config"])
        b = next(iter(DistNeighborLoader(g, [3, 2], batch_size=32, seed=0)))
        nd, orig = pyg_named["nd"], pyg_named["orig"]
        # what PyG's in-memory loaders put in a batch: every node attribute, rows of n_id
        data = Data(**{k: torch.from_numpy(v) for k, v in nd.items()}, num_nodes=300)
        data.edge_index = torch.zeros(2, 0, dtype=torch.long)
        want = filter_data(
            data,
            torch.from_numpy(orig[b.n_id.numpy()]),
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, dtype=torch.long),
            None,
            None,
        )
        for key in ("x", "y", "train_mask"):
            assert key in b, key
            assert torch.equal(b[key], want[key]), key
        fs = DistFeatureStore(g)
        assert torch.equal(fs[None, "x", torch.tensor([3])], torch.from_numpy(nd["x"][orig[[3]]]))
        only = next(iter(DistNeighborLoader(g, [3], batch_size=8, attrs=[])))
        assert "x" in only and "y" in only and "train_mask" not in only
        with pytest.raises(UnknownTensorError, match="nope"):
            DistNeighborLoader(g, [3], attrs=["nope"])
    finally:
        asyncgraph.finalize()


def test_pyg_loader_arguments_stats_and_initialize_twice(g: Any, caplog: pytest.LogCaptureFixture) -> None:
    asyncgraph.initialize()  # a second call: a no-op (PyG's Sequential re-imports the script)
    seen: list[int] = []

    def transform(d: Any) -> Any:
        seen.append(d.batch_size)
        return d

    with caplog.at_level(logging.INFO, logger="asyncgraph.pyg"):
        loader = DistNeighborLoader(
            g,
            [5, 5],
            batch_size=500,
            num_workers=2,
            persistent_workers=True,
            pin_memory=True,
            prefetch_factor=3,
            filter_per_worker=True,
            current_ctx=None,
            master_addr="127.0.0.1",
            master_port=11111,
            transform=transform,
            seed=0,
        )
    logged = caplog.text
    for key in ("persistent_workers", "filter_per_worker", "current_ctx", "master_addr", "master_port"):
        assert f"{key}=" in logged, key
    assert loader.num_workers == 2 and loader.prefetch == 6
    batches = [b for _, b in zip(range(3), loader, strict=False)]
    assert seen == [500, 500, 500] and len(batches) == 3
    assert loader.stats.sample > 0 and loader.stats.pull > 0, loader.stats
    with pytest.raises(TypeError, match="num_wrokers"):
        DistNeighborLoader(g, [5], num_wrokers=2)
    with pytest.raises(InvalidRequestError, match="temporal"):  # PyG's argument, named
        DistLinkNeighborLoader(g, [5], edge_label_time=torch.zeros(3))
    link = DistLinkNeighborLoader(g, [5], batch_size=64, num_workers=1, persistent_workers=False)
    next(iter(link))
    assert link.num_workers == 1 and link.stats.sample > 0 and link.stats.pull > 0


def _batches(loader: Any) -> list[tuple[torch.Tensor, ...]]:
    return [(b.n_id, b.edge_index, b.x, b.y, b.input_id) for b in loader]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_pyg_nodeloader_with_worker_processes(g: Any, context: str) -> None:
    """PyG's own NodeLoader over our stores with num_workers=2: the same batches as with 0, bounded
    (before: a forked worker waited forever on its parent's event loop; spawn could not pickle a lock)."""
    fs, gs = DistFeatureStore(g), DistGraphStore(g)
    sampler = DistNeighborSampler(g, [-1])  # every in-edge: the same sample in any process
    seeds = torch.arange(0, 19717, 97)[:192]

    def loader(**kw: Any) -> NodeLoader:
        return NodeLoader((fs, gs), node_sampler=sampler, input_nodes=seeds, batch_size=48, **kw)

    started = time.monotonic()
    want = _batches(loader(num_workers=0))
    got = _batches(loader(num_workers=2, multiprocessing_context=context, timeout=150))
    assert len(got) == len(want) == 4
    for a, b in zip(want, got, strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
    assert time.monotonic() - started < 300
    # the parent's stores still answer
    assert fs[None, "x", torch.tensor([1])].shape == (1, 500)


def test_readme_pyg_snippet_runs(pubmed1: Any) -> None:
    """The docs' "Coming from PyG" snippet, as printed but for its partition path."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "coming-from-pyg.md").read_text()
    start = readme.index("A PyG script changes only where its data comes from:")
    block = readme[readme.index("```python\n", start) + len("```python\n") :]
    code = block[: block.index("```")]
    assert "import torch\n" in code
    code = code.replace("data/pubmed1/pubmed.json", str(pubmed1.part_config))
    try:
        scope: dict[str, Any] = {}
        exec(compile(code, "docs/coming-from-pyg.md", "exec"), scope)
        assert scope["batch"].batch_size == 20 and scope["loss"].item() > 0
        assert "train_mask" in scope["batch"]
    finally:
        asyncgraph.finalize()


def test_partition_data_read_only_standalone_as_served(
    g: Any, pubmed2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes to a partition's own tensors raise ReadOnlyTensorError standalone as served (before:
    standalone wrote them); tensors made at run time stay writable; the opt-in is the server's."""
    from asyncgraph.client import Client
    from asyncgraph.errors import ReadOnlyTensorError

    fs = DistFeatureStore(g)
    before = fs[None, "x", torch.tensor([0, 1])]
    with pytest.raises(ReadOnlyTensorError, match="read-only"):
        fs.update_tensor(torch.zeros(2, 500), group_name=None, attr_name="x", index=torch.tensor([0, 1]))
    with pytest.raises(ReadOnlyTensorError):
        g.ndata["feat"][0:1] = torch.zeros(1, 500)
    assert torch.equal(fs[None, "x", torch.tensor([0, 1])], before)  # nothing changed
    fs[None, "compat_h", None] = torch.zeros(19717, 2)
    fs.update_tensor(torch.ones(1, 2), group_name=None, attr_name="compat_h", index=torch.tensor([3]))
    assert fs[None, "compat_h", torch.tensor([3])].tolist() == [[1.0, 1.0]]
    fs.remove_tensor(None, "compat_h", None)
    monkeypatch.setenv("ASYNCGRAPH_WRITABLE_PARTITION_DATA", "1")
    own = Client.standalone(pubmed2.part_config)
    try:
        own.push("node:feat", np.array([0]), np.zeros((1, 500), np.float32))
        assert not own.pull("node:feat", np.array([0])).any()
    finally:
        own.close()


def test_hetero_link_loader_lays_out_batches_as_pyg(acm_g: Any) -> None:
    """Heterogeneous DistLinkNeighborLoader: PyG's (edge type, edge_label_index) input and PyG's
    LinkLoader's batch layout (compared with PyG's own LinkLoader over our stores)."""
    et = ("paper", "written-by", "author")
    fs, gs = DistFeatureStore(acm_g), DistGraphStore(acm_g)
    src, dst = gs[et, "coo"]
    pick = torch.arange(0, src.numel(), 97)[:40]
    eli = torch.stack([src[pick], dst[pick]])
    fan = {c: [3] for c in acm_g.canonical_etypes}
    theirs = next(
        iter(
            LinkLoader(
                (fs, gs),
                link_sampler=DistNeighborSampler(acm_g, fan),
                edge_label_index=(et, eli),
                neg_sampling="binary",
                batch_size=20,
            )
        )
    )
    ours = next(
        iter(
            DistLinkNeighborLoader(
                acm_g, fan, edge_label_index=(et, eli), neg_sampling="binary", batch_size=20
            )
        )
    )
    for b in (theirs, ours):
        got = b[et].edge_label_index
        assert got.shape == (2, 40) and b[et].edge_label.tolist() == [1.0] * 20 + [0.0] * 20
        assert torch.equal(b["paper"].n_id[got[0, :20]], eli[0, :20])
        assert torch.equal(b["author"].n_id[got[1, :20]], eli[1, :20])
        assert b["author"].x.shape[1] == 32
    trip = next(
        iter(
            DistLinkNeighborLoader(
                acm_g, fan, edge_label_index=(et, None), neg_sampling=("triplet", 2), batch_size=8
            )
        )
    )
    assert trip["paper"].src_index.shape == (8,) and trip["author"].dst_neg_index.shape == (8, 2)
    assert torch.equal(trip["author"].n_id[trip["author"].dst_pos_index], dst[:8])
    with pytest.raises(KeyError, match="edge type"):
        DistLinkNeighborLoader(acm_g, fan, edge_label_index=(("paper", "cites", "paper"), None))
    with pytest.raises(InvalidRequestError, match=r"\(edge type, \[2, M\] or None\)"):
        DistLinkNeighborLoader(acm_g, fan, edge_label_index=eli)
