"""Tensors stored per (type, name) (issue 33): a ``paper`` ``feat`` of 3 float64 and an
``author`` ``feat`` of 8 float32 on one heterograph, an edge tensor on one edge type only.

Partitioned in memory, served by 2 real server processes and read standalone: served =
standalone = the input for every type; the files hold each type's rows and nothing else; the
typed loader's batches carry each type's own rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import DistGraph
from asyncgraph.errors import OutOfRangeError, UnknownTensorError
from asyncgraph.partition import PartitionConfig
from asyncgraph.partition.hetero_graph import HeteroGraph
from asyncgraph.partition.reader import load_partition
from asyncgraph.testing import ServerGroup, start_servers

CITES = ("paper", "cites", "paper")
N = {"paper": 400, "author": 250, "venue": 12}


def build(seed: int = 0) -> HeteroGraph:
    """paper/author/venue; ``feat`` of different dtypes and widths, ``venue`` without one."""
    rng = np.random.default_rng(seed)
    spec = [
        ("author", "writes", "paper", 1200),
        ("paper", "written-by", "author", 1200),
        ("paper", "cites", "paper", 900),
        ("paper", "in", "venue", 400),
        ("venue", "has", "paper", 400),
    ]
    g = asyncgraph.heterograph(
        {(s, r, d): (rng.integers(0, N[s], k), rng.integers(0, N[d], k)) for s, r, d, k in spec},
        num_nodes_dict=N,
    )
    g.nodes["paper"].data["feat"] = rng.random((N["paper"], 3))  # float64
    g.nodes["author"].data["feat"] = rng.random((N["author"], 8)).astype(np.float32)
    g.nodes["paper"].data["label"] = rng.integers(0, 5, N["paper"])
    g.edges[CITES].data["count"] = rng.integers(0, 100, 900).astype(np.int32)
    return g


@pytest.fixture(scope="module")
def parted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, HeteroGraph, Any, Any]:
    g = build()
    out = tmp_path_factory.mktemp("pertype")
    nmap, emap = asyncgraph.partition_graph(g, "pt", 2, out, part_method="random", return_mapping=True)
    return out / "pt.json", g, nmap, emap


@pytest.fixture(scope="module")
def served(
    parted: tuple[Path, HeteroGraph, Any, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerGroup]:
    group = start_servers(
        parted[0], tmp_path_factory.mktemp("pt-srv"), num_parts=2, extra_args=["--writable-partition-data"]
    )
    yield group
    group.stop()


@pytest.fixture(scope="module")
def graphs(parted: tuple[Path, HeteroGraph, Any, Any], served: ServerGroup) -> Iterator[list[DistGraph]]:
    # standalone; co-located (the servers' files and memfds mapped); over the socket only
    local, remote = Client.standalone(parted[0]), Client.connect(served.addresses)
    socket = Client.connect(served.addresses, use_shared_memory=False)
    assert remote.local_partitions() == [0, 1] and socket.local_partitions() == []
    yield [DistGraph("pt", client=c) for c in (local, remote, socket)]
    for c in (local, remote, socket):
        c.close()


def test_files_hold_each_types_rows_only(parted: tuple[Path, HeteroGraph, Any, Any]) -> None:
    """No merge, no padding: part p's ``paper/feat`` has exactly p's paper rows, in per-type ID
    order, with the input's dtype and width; no type has rows of another."""
    cfg, g, nmap, emap = parted
    config = PartitionConfig.load(cfg)
    book = config.book()
    assert {"paper/feat", "author/feat", "paper/label"} <= set(config.node_feats)
    assert "feat" not in config.node_feats and not any(k.startswith("venue/") for k in config.node_feats)
    assert config.node_feats["paper/feat"].dtype == "float64" and config.node_feats[
        "paper/feat"
    ].row_shape == [3]
    assert config.node_feats["author/feat"].dtype == "float32" and config.node_feats[
        "author/feat"
    ].row_shape == [8]
    assert set(config.edge_feats) >= {"paper:cites:paper/count"} and "count" not in config.edge_feats
    rows = {"paper": 0, "author": 0}
    for p in range(2):
        part = load_partition(cfg, p)
        for t in rows:
            lo, hi = book.ntype_bounds(t)[p : p + 2]
            arr = np.asarray(part.node_feats[f"{t}/feat"])
            assert arr.shape[0] == hi - lo  # this part's nodes of t, nothing else
            np.testing.assert_array_equal(arr, g.nodes[t].data["feat"][nmap[t][lo:hi]])
            rows[t] += arr.shape[0]
            path = cfg.parent / f"part{p}" / "node_feat" / t / "feat.npy"
            assert path.stat().st_size < 128 + arr.nbytes + 1  # header + the type's rows
        lo, hi = book.etype_bounds(CITES)[p : p + 2]
        count = np.asarray(part.edge_feats["paper:cites:paper/count"])
        np.testing.assert_array_equal(count, g.edges[CITES].data["count"][emap[CITES][lo:hi]])
    assert rows == {"paper": N["paper"], "author": N["author"]}


def test_served_equals_standalone_equals_input(
    parted: tuple[Path, HeteroGraph, Any, Any], graphs: list[DistGraph]
) -> None:
    _, g, nmap, emap = parted
    rng = np.random.default_rng(3)
    for dg in graphs:
        assert sorted(dg.nodes["paper"].data) == ["feat", "label"]
        assert list(dg.nodes["author"].data) == ["feat"] and list(dg.nodes["venue"].data) == []
        assert list(dg.edges[CITES].data) == ["count"] and list(dg.edges["writes"].data) == []
        for t, width, dtype in (("paper", 3, torch.float64), ("author", 8, torch.float32)):
            view = dg.nodes[t].data["feat"]
            assert view.shape == (N[t], width) and view.dtype == dtype
            ids = np.concatenate([np.arange(N[t]), rng.integers(0, N[t], 50)])
            np.testing.assert_array_equal(view[ids].numpy(), g.nodes[t].data["feat"][nmap[t][ids]])
        count = dg.edges[CITES].data["count"]
        assert count.shape == (900,) and count.dtype == torch.int32
        ids = rng.permutation(900)
        np.testing.assert_array_equal(count[ids].numpy(), g.edges[CITES].data["count"][emap[CITES][ids]])
        with pytest.raises(UnknownTensorError):
            dg.nodes["venue"].data["feat"]
        with pytest.raises(UnknownTensorError):
            dg.edges["writes"].data["count"]
        with pytest.raises(OutOfRangeError):
            dg.nodes["author"].data["feat"][[N["author"]]]


def test_writes_to_a_per_type_tensor(
    parted: tuple[Path, HeteroGraph, Any, Any], graphs: list[DistGraph]
) -> None:
    """``g.nodes[t].data[name][ids] = v`` and an edge type's ``DistTensor`` write the type's own
    rows (on the servers: every reader sees them); a row of another type is refused by the owner."""
    _, g, nmap, emap = parted
    dg = graphs[1]
    feat = dg.nodes["author"].data["feat"]
    ids = np.array([0, 7, N["author"] - 1])
    old = feat[ids].clone()
    feat[ids] = torch.full((3, 8), 2.5)
    try:
        assert bool((feat[ids] == 2.5).all())
        others = np.setdiff1d(np.arange(N["author"]), ids)
        np.testing.assert_array_equal(
            feat[others].numpy(), g.nodes["author"].data["feat"][nmap["author"][others]]
        )
        np.testing.assert_array_equal(  # paper's feat of the same IDs is untouched
            dg.nodes["paper"].data["feat"][ids].numpy(), g.nodes["paper"].data["feat"][nmap["paper"][ids]]
        )
    finally:
        feat[ids] = old
    count = dg.edges[CITES].data["count"]
    count[[5, 6]] = torch.tensor([-1, -2], dtype=torch.int32)
    try:
        assert count[[5, 6]].tolist() == [-1, -2]
    finally:
        count[[5, 6]] = torch.from_numpy(g.edges[CITES].data["count"][emap[CITES][[5, 6]]])
    book = dg.get_partition_book()
    paper0 = book.map_to_homo_nid([0], "paper")  # a paper's homogeneous ID is no author row
    with pytest.raises(OutOfRangeError, match="author/feat"):
        dg.client.pull("node:author/feat", paper0)
    assert dg.nodes["author"].data["feat"][[0]].shape == (1, 8)  # the server serves on


def test_typed_loader_carries_each_types_rows(
    parted: tuple[Path, HeteroGraph, Any, Any], graphs: list[DistGraph]
) -> None:
    """``blocks[0].srcdata["feat"][t]`` are the input rows of ``srcnodes[t]`` for the types
    that have ``feat`` (none for ``venue``); labels of the seeds in ``blocks[-1].dstdata``."""
    _, g, nmap, _ = parted
    batches = []
    for dg in graphs:
        loader = DistNodeDataLoader(
            dg, {"paper": np.arange(0, N["paper"], 3)}, NeighborSampler([4, 4]), 64, seed=5,
            node_feats=["feat"], labels="label",
        )  # fmt: skip
        got = []
        for _, _, blocks in loader:
            first, last = blocks[0], blocks[-1]
            assert set(first.srcdata) >= {"paper", "author"} and "feat" not in first.srcdata.get("venue", {})
            for t in ("paper", "author"):
                src = first.srcnodes[t].numpy()
                np.testing.assert_array_equal(
                    first.srcdata[t]["feat"].numpy(), g.nodes[t].data["feat"][nmap[t][src]]
                )
            dst = last.dstnodes["paper"].numpy()
            np.testing.assert_array_equal(
                last.dstdata["paper"]["label"].numpy(), g.nodes["paper"].data["label"][nmap["paper"][dst]]
            )
            got.append(first.srcnodes["author"].numpy())
        batches.append(got)
    for other in batches[1:]:  # served = standalone, batch for batch
        assert len(other) == len(batches[0])
        for a, b in zip(batches[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_pyg_heterodata_per_type_x(tmp_path: Path) -> None:
    """PyG's ``HeteroData`` with ``x`` of another dtype and width per type: partitioned as it is,
    read by ``DistFeatureStore`` (``fs[ntype, "x", ids]``) and ``DistNeighborLoader`` from 2
    servers exactly as given."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import HeteroData

    from asyncgraph.pyg import DistFeatureStore, DistNeighborLoader

    gen = torch.Generator().manual_seed(0)
    hd = HeteroData()
    hd["paper"].x = torch.randn(60, 3, generator=gen, dtype=torch.float64)
    hd["author"].x = torch.randn(40, 8, generator=gen)
    writes = torch.stack(
        [torch.randint(0, 40, (200,), generator=gen), torch.randint(0, 60, (200,), generator=gen)]
    )
    hd["author", "writes", "paper"].edge_index = writes
    hd["paper", "written_by", "author"].edge_index = writes.flip(0)
    nmap, _ = asyncgraph.partition_graph(
        hd, "h", 2, tmp_path / "out", part_method="random", return_mapping=True
    )
    group = start_servers(tmp_path / "out" / "h.json", tmp_path / "srv", num_parts=2)
    client = Client.connect(group.addresses)
    try:
        g = DistGraph("h", client=client)
        fs = DistFeatureStore(g)
        for t, width, dtype in (("paper", 3, torch.float64), ("author", 8, torch.float32)):
            ids = torch.arange(hd[t].num_nodes)
            got = fs[t, "x", ids]
            assert got.dtype == dtype and tuple(got.shape) == (hd[t].num_nodes, width)
            assert torch.equal(got, hd[t].x[torch.from_numpy(nmap[t])])
        loader = DistNeighborLoader(
            g, {c: [3] for c in g.canonical_etypes}, input_nodes=("paper", None), batch_size=16
        )
        for b in loader:
            for t in ("paper", "author"):
                assert torch.equal(b[t].x, hd[t].x[torch.from_numpy(nmap[t][b[t].n_id.numpy()])])
    finally:
        client.close()
        group.stop()


def test_chunked_path_writes_the_same_per_type_files(
    parted: tuple[Path, HeteroGraph, Any, Any], tmp_path: Path
) -> None:
    """DGL's chunked format (per-type ``node_data``/``edge_data`` chunks), partitioned out of core
    on a process pool: the same files, byte for byte, as ``partition_graph`` in memory, so the
    per-type tensors are read back exactly as given."""
    from asyncgraph.partition.chunked_write import write_chunked
    from asyncgraph.partition.stream import partition_chunked

    g = build()
    meta = write_chunked(g, tmp_path / "chunked", 3, "csv", "pt")
    partition_chunked(meta, 2, tmp_path / "st", graph_name="pt", part_method="random", workers=2)
    mem = parted[0].parent
    files = sorted(str(p.relative_to(mem)) for p in mem.rglob("*") if p.is_file())
    assert files == sorted(
        str(p.relative_to(tmp_path / "st")) for p in (tmp_path / "st").rglob("*") if p.is_file()
    )
    assert (
        "part1/node_feat/author/feat.npy" in files and "part0/edge_feat/paper:cites:paper/count.npy" in files
    )
    differ = [f for f in files if (mem / f).read_bytes() != (tmp_path / "st" / f).read_bytes()]
    assert differ == []
    client = Client.standalone(tmp_path / "st" / "pt.json")
    try:
        dg = DistGraph("pt", client=client)
        nmap = parted[2]
        rows = dg.nodes["author"].data["feat"][np.arange(N["author"])].numpy()
        np.testing.assert_array_equal(rows, g.nodes["author"].data["feat"][nmap["author"]])
    finally:
        client.close()


def _to_merged_layout(cfg: Path, name: str) -> None:
    """Rewrite a partitioning as partitions before per-type storage were: one ``name`` over every
    node of the part (zero rows for types without it), listed once in the config."""
    import json

    from asyncgraph.partition.layout import config_file

    doc = json.loads(cfg.read_text())
    config = PartitionConfig.load(cfg)
    book = config.book()
    typed = {k: v for k, v in doc["node_feats"].items() if k.endswith(f"/{name}")}
    spec = next(iter(typed.values()))
    for p in range(config.num_parts):
        lo, hi = book.node_range(p)
        merged = np.zeros((hi - lo, *spec["row_shape"]), dtype=spec["dtype"])
        for key in typed:
            t = key.split("/")[0]
            tb = book.ntype_bounds(t)
            path = cfg.parent / f"part{p}" / "node_feat" / f"{key}.npy"
            if tb[p + 1] > tb[p]:
                start = int(book.map_to_homo_nid(tb[p : p + 1], t)[0]) - lo
                merged[start : start + int(tb[p + 1] - tb[p])] = np.load(path)
            path.unlink()
        np.save(cfg.parent / f"part{p}" / "node_feat" / f"{name}.npy", merged)
    doc["node_feats"] = {k: v for k, v in doc["node_feats"].items() if k not in typed} | {name: spec}
    for part in doc["parts"]:
        part["fingerprint"] = None
    config_file(cfg.parent, doc["graph_name"]).write_text(json.dumps(doc))


def test_partitions_with_merged_tensors_are_served_as_before(tmp_path: Path) -> None:
    """A partition written before per-type storage (``feat`` merged over every node) is still
    served: ``g.nodes[t].data["feat"]`` reads the type's rows, the typed loader fills srcdata."""
    rng = np.random.default_rng(1)
    g = build()
    g.nodes["author"].data["feat"] = rng.random((N["author"], 3))  # one dtype and width: mergeable
    nmap, _ = asyncgraph.partition_graph(
        g, "old", 2, tmp_path / "old", part_method="random", return_mapping=True
    )
    cfg = tmp_path / "old" / "old.json"
    _to_merged_layout(cfg, "feat")
    assert "feat" in PartitionConfig.load(cfg).node_feats
    group = start_servers(cfg, tmp_path / "srv", num_parts=2)
    client = Client.connect(group.addresses)
    try:
        dg = DistGraph("old", client=client)
        for t in ("paper", "author"):
            assert "feat" in dg.nodes[t].data
            rows = dg.nodes[t].data["feat"][np.arange(N[t])].numpy()
            np.testing.assert_array_equal(rows, g.nodes[t].data["feat"][nmap[t]])
        loader = DistNodeDataLoader(
            dg, {"paper": np.arange(40)}, NeighborSampler([3]), 20, node_feats=["feat"]
        )
        for _, _, blocks in loader:
            for t in ("paper", "author"):
                src = blocks[0].srcnodes[t].numpy()
                np.testing.assert_array_equal(
                    blocks[0].srcdata[t]["feat"].numpy(), g.nodes[t].data["feat"][nmap[t][src]]
                )
    finally:
        client.close()
        group.stop()
