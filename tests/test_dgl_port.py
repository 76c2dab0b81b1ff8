"""Porting a DGL script: loader tensor names, DGL-shaped partition tools (ID mapping files,
load_partition/load_partition_book, num_hops, num_trainers_per_machine), DGL's older names."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import asyncgraph
import asyncgraph as dgl
from asyncgraph.errors import InvalidRequestError, UnknownTensorError
from asyncgraph.partition import load_orig_ids, load_partition, load_partition_book, partition_graph
from asyncgraph.partition.graph import Graph

ROOT = Path(__file__).resolve().parent.parent
CORA = ROOT / "examples" / "data" / "cora.npz"


@pytest.fixture
def cora_g(cora2) -> Iterator[asyncgraph.DistGraph]:
    asyncgraph.initialize()
    yield asyncgraph.DistGraph("cora", part_config=cora2.part_config)
    asyncgraph.finalize()


# --- 1. the node loader fetches what it is told, and says what exists -----------------------------
def test_node_loader_names(cora_g: asyncgraph.DistGraph, cora2) -> None:
    sampler = dgl.dataloading.MultiLayerNeighborSampler([3, 3])
    nids = torch.arange(0, 40)
    with pytest.raises(UnknownTensorError, match=r"'labels'.*\['feat', 'label', 'test_mask'"):
        dgl.dataloading.DistNodeDataLoader(cora_g, nids, sampler, batch_size=8, labels="labels")
    with pytest.raises(UnknownTensorError, match="node_feats: the graph has no node tensor 'features'"):
        dgl.dataloading.DistNodeDataLoader(cora_g, nids, sampler, batch_size=8, node_feats=["features"])
    # DGL's older name; explicit names are fetched under those names
    cora_g.ndata["labels"] = dgl.DistTensor((cora_g.num_nodes(),), torch.int64, name="labels")
    cora_g.ndata["labels"][nids] = nids * 2
    loader = dgl.dataloading.NodeDataLoader(
        cora_g, nids, sampler, batch_size=8, shuffle=False, node_feats=["train_mask"], labels="labels"
    )
    input_nodes, seeds, blocks = next(iter(loader))
    assert torch.equal(blocks[-1].dstdata["labels"], seeds * 2)
    assert "feat" not in blocks[0].srcdata
    want = cora2.original_rows("train_mask", input_nodes.numpy())
    assert np.array_equal(np.asarray(blocks[0].srcdata["train_mask"]), want)
    # defaults: feat/label when present
    _, seeds, blocks = next(iter(dgl.dataloading.DistNodeDataLoader(cora_g, nids, sampler, batch_size=8)))
    assert np.array_equal(blocks[-1].dstdata["label"].numpy(), cora2.original_rows("label", seeds.numpy()))


def test_dgl_namespaces() -> None:
    assert dgl.distributed.node_split is asyncgraph.node_split
    assert dgl.distributed.DistDataLoader is asyncgraph.DistDataLoader
    assert dgl.distributed.DistNodeDataLoader is dgl.dataloading.NodeDataLoader
    assert dgl.dataloading.MultiLayerNeighborSampler is dgl.sampling.MultiLayerNeighborSampler
    assert dgl.distributed.partition_graph is partition_graph
    assert dgl.distributed.load_partition_book is load_partition_book


# --- 2. partition tools shaped like DGL's -----------------------------------------------------------
def test_partition_writes_mapping_and_dgl_shapes(tmp_path: Path, cora2) -> None:
    nmap, emap = load_orig_ids(cora2.part_config)
    assert np.array_equal(nmap, cora2.orig_nids) and np.array_equal(emap, cora2.orig_eids)
    graph, node_feats, edge_feats, gpb, name, ntypes, etypes = load_partition(cora2.part_config, 1)
    assert name == "cora" and list(ntypes) == ["_N"] and list(etypes) == [("_N", "_E", "_N")]
    n0, n1 = gpb.node_range(1)
    assert graph.node_range == (n0, n1) and node_feats["feat"].shape == (n1 - n0, 1433)
    assert edge_feats == {}
    book, name2, _, _ = load_partition_book(cora2.part_config, 0)
    assert book == gpb and name2 == "cora"
    with pytest.raises(InvalidRequestError, match="out of range"):
        load_partition_book(cora2.part_config, 2)
    g = Graph.from_npz(CORA)
    with pytest.raises(InvalidRequestError, match="num_hops=1"):
        partition_graph(g, "cora", 2, tmp_path / "h", num_hops=2)
    with pytest.raises(InvalidRequestError, match="num_trainers_per_machine"):
        partition_graph(g, "cora", 2, tmp_path / "h", num_trainers_per_machine=0)
    assert not (tmp_path / "h").exists()


def test_cli_writes_id_mapping(tmp_path: Path) -> None:
    out = tmp_path / "c"
    cmd = [sys.executable, "-m", "asyncgraph.partition", "--input", str(CORA), "--graph-name", "cora"]
    cmd += ["--num-parts", "2", "--method", "random", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "orig_nids.npy" in res.stderr
    nmap, emap = load_orig_ids(out / "cora.json")
    raw = np.load(CORA)
    part = load_partition(out / "cora.json", 0)
    n0, n1 = part.node_range
    assert np.array_equal(part.node_feats["label"], raw["label"][nmap[n0:n1]])
    src = part.indices[:10]
    dst = np.repeat(np.arange(part.node_range[0], part.node_range[1]), np.diff(part.indptr))[:10]
    eids = part.eids[:10]
    assert np.array_equal(raw["src"][emap[eids]], nmap[src])
    assert np.array_equal(raw["dst"][emap[eids]], nmap[dst])


def test_num_trainers_per_machine_gives_each_trainer_its_range(tmp_path: Path) -> None:
    g = Graph.from_npz(CORA)
    cats = np.asarray(g.ndata["train_mask"], dtype=np.int64)
    partition_graph(g, "cora", 2, tmp_path / "t", balance_ntypes=cats, num_trainers_per_machine=2)
    cfg = tmp_path / "t" / "cora.json"
    book, *_ = load_partition_book(cfg, 0)
    tid = np.concatenate([load_partition(cfg, p).node_feats["trainer_id"] for p in range(2)])
    part_of = book.nid2partid(np.arange(book.num_nodes))
    assert np.array_equal(tid // 2, part_of)  # trainer IDs are part * T + local
    assert np.all(np.diff(tid) >= 0)  # contiguous sub-ranges per trainer
    train = np.concatenate([load_partition(cfg, p).node_feats["train_mask"] for p in range(2)])
    for rank in range(4):
        share = dgl.distributed.node_split(train, book, rank=rank, world_size=4, node_trainer_ids=tid).numpy()
        assert share.size == 35 and train[share].all()
        assert np.mean(tid[share] == rank) >= 0.9, rank  # mostly its own sub-range
    asyncgraph.initialize()  # the same through DistTensors, as a DGL script writes it
    try:
        g = asyncgraph.DistGraph("cora", part_config=cfg)
        for rank in range(4):
            share = dgl.distributed.node_split(
                g.ndata["train_mask"], rank=rank, world_size=4, node_trainer_ids=g.ndata["trainer_id"]
            ).numpy()
            want = dgl.distributed.node_split(train, book, rank=rank, world_size=4, node_trainer_ids=tid)
            assert np.array_equal(share, want.numpy())
    finally:
        asyncgraph.finalize()


def test_to_block_dgl_form(cora_g: asyncgraph.DistGraph) -> None:
    seeds = torch.tensor([5, 9, 300])
    frontier = dgl.distributed.sample_neighbors(cora_g, seeds, 4, replace=True)
    block = dgl.to_block(frontier, seeds)
    src, _, eids = frontier
    assert torch.equal(block.dstdata[dgl.NID], seeds) and torch.equal(block.srcdata[dgl.NID], block.srcnodes)
    assert torch.equal(block.eids, eids) and block.num_edges() == src.numel()
    with pytest.raises(InvalidRequestError, match="dst_nodes"):
        dgl.to_block(frontier)


# --- 'Done when': DGL's tutorial and user-guide snippets, launched -----------------------------------
def test_dgl_tutorial_and_guide_run_launched(tmp_path: Path) -> None:
    """tests/dgl_scripts holds DGL's text with only the imports (and the marked lines) changed."""
    from asyncgraph.testing import subprocess_env

    scripts = ROOT / "tests" / "dgl_scripts"
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    part = subprocess.run(
        [sys.executable, str(scripts / "partition_tutorial.py"), str(CORA)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert part.returncode == 0, part.stderr[-3000:]
    cfg = tmp_path / "4part_data" / "ogbn-products.json"
    assert (tmp_path / "4part_data" / "orig_nids.npy").is_file()
    for script, expect in [
        ("train_tutorial.py", r"(?s)\[trainer 1\] Epoch 1: Validation Accuracy 0\.\d+.*final loss \d"),
        (
            "guide_snippets.py",
            r"\[trainer 0\] guide snippets ran: 70 trainer nodes, 3 \+ 3 batches, blocks 2",
        ),
    ]:
        cmd = [sys.executable, "-m", "asyncgraph.launch", "--part-config", str(cfg), "--"]
        res = subprocess.run(
            [*cmd, sys.executable, str(scripts / script)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        assert re.search(expect, out), out[-4000:]


# --- 3. persistent= as in DGL: non-persistent tensors go with their last handle --------------------
def _stored(client) -> list[set[str]]:
    """Every partition's stored tensor names, asked of the partitions themselves."""
    return [{m.name for m in client.loop.run(p.list_tensors())} for p in client.aio.partitions]


@pytest.mark.parametrize("mode", ["served", "standalone"])
def test_non_persistent_tensors_are_freed(cora2, tmp_path: Path, mode: str) -> None:
    import gc

    from asyncgraph.client import Client
    from asyncgraph.testing import start_servers

    served = mode == "served"
    group = start_servers(cora2.part_config, tmp_path, num_parts=2, num_clients=2) if served else None
    try:
        if group is not None:
            asyncgraph.initialize(group.ip_config())
            g = asyncgraph.DistGraph("cora")
        else:
            asyncgraph.initialize()
            g = asyncgraph.DistGraph("cora", part_config=cora2.part_config)
        client, n = g.client, g.num_nodes()
        before = _stored(client)
        for i in range(40):  # anonymous tensors in a loop: the servers' lists do not grow
            t = dgl.distributed.DistTensor((n, 4), torch.float32)
            t[[0, i]] = torch.ones(2, 4)
            assert len(_stored(client)[0]) <= len(before[0]) + 2
        del t
        gc.collect()
        client.flush_releases()
        assert _stored(client) == before
        kept = dgl.distributed.DistTensor((n,), torch.float32, name="kept", persistent=True)
        a = dgl.distributed.DistTensor((n,), torch.float32, name="shared")
        b = dgl.distributed.DistTensor((n,), torch.float32, name="shared")
        g.ndata["viewed"] = dgl.distributed.DistTensor((n,), torch.float32, name="viewed")
        emb = dgl.distributed.DistEmbedding(n, 4)
        opt = dgl.distributed.SparseAdagrad([emb], lr=0.1)
        emb(torch.tensor([1, 2])).sum().backward()
        opt.step()
        assert any(k.startswith(emb.key + "#") for k in _stored(client)[0])
        del kept, a, emb, opt
        gc.collect()
        client.flush_releases()
        now = _stored(client)[0]
        assert {"node:kept", "node:shared", "node:viewed"} <= now  # persistent, b and the view hold
        assert not any(k.startswith("node:_emb") for k in now)  # the embedding and its state went
        del b
        gc.collect()
        client.flush_releases()
        assert "node:shared" not in _stored(client)[0] and "node:viewed" in _stored(client)[0]
        if group is not None:  # a bad release over the wire: typed error, server keeps serving
            from asyncgraph.protocol.ops import Op

            remote = client.aio.partitions[1]
            remote = getattr(remote, "server", None) or remote
            with pytest.raises(InvalidRequestError, match="holder"):
                client.loop.run(remote.conn.call(Op.RELEASE_TENSORS, {"holder": 5, "names": []}, 10.0))
            assert g.ndata["label"][[n - 1]].shape == (1,)
        if group is not None:  # a client that disconnects drops its references
            other = Client.connect(group.addresses)
            theirs = dgl.distributed.DistTensor((n,), torch.float32, name="theirs", client=other)
            assert "node:theirs" in _stored(client)[0]
            other.close()  # the handle is still alive: closing released it
            assert theirs.name == "theirs"
            assert "node:theirs" not in _stored(client)[0]
        g.client.delete_tensor("node:kept")
        del g.ndata["viewed"]
        assert not {"node:kept", "node:viewed"} & _stored(client)[0]
    finally:
        asyncgraph.finalize()
        if group is not None:
            group.stop()


def test_release_records_reject_bad_arguments() -> None:
    from asyncgraph.protocol.ops import CreateTensorArgs, ReleaseTensorsArgs

    ok = ReleaseTensorsArgs("h", ["node:x", "node:x"], False)
    assert ReleaseTensorsArgs.decode(ok.encode()) == ok
    for bad in ({"holder": 1, "names": []}, {"holder": "h", "names": [3]}, {"holder": "h"}):
        with pytest.raises(InvalidRequestError, match="release_tensors"):
            ReleaseTensorsArgs.decode(bad)
    args = CreateTensorArgs("node:x", "node", [3], "float32", None, "h").encode()
    assert CreateTensorArgs.decode(args).holder == "h"
    with pytest.raises(InvalidRequestError, match="holder"):
        CreateTensorArgs.decode({**args, "holder": 7})


def test_initialize_accepts_use_graphbolt(cora2) -> None:
    dgl.distributed.initialize(use_graphbolt=True)  # the tutorial's GraphBolt section
    try:
        g = dgl.distributed.DistGraph("cora", part_config=cora2.part_config)
        assert g.num_nodes() == 2708
    finally:
        dgl.distributed.exit_client()
