"""DGL-parity additions: init_func callables, node_split on DistTensors, graph queries, sampling
options, torch input graphs, initialize in launched jobs, checkpoints (served and standalone)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.errors import InvalidRequestError
from asyncgraph.testing import ServerGroup


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


# --- 3. graph queries --------------------------------------------------------------------------
def _new_edges(pubmed2) -> tuple[np.ndarray, np.ndarray]:
    """Global (src, dst) of every edge in new IDs, in new edge-ID order."""
    new_of = np.empty_like(pubmed2.orig_nids)
    new_of[pubmed2.orig_nids] = np.arange(pubmed2.orig_nids.size)
    oe = pubmed2.orig_eids
    return new_of[pubmed2.raw["src"][oe]], new_of[pubmed2.raw["dst"][oe]]


def test_degrees_edges_and_subgraphs(g: asyncgraph.DistGraph, pubmed2) -> None:
    src, dst = _new_edges(pubmed2)
    n = g.num_nodes()
    indeg, outdeg = np.bincount(dst, minlength=n), np.bincount(src, minlength=n)
    np.testing.assert_array_equal(g.in_degrees().numpy(), indeg)
    np.testing.assert_array_equal(g.out_degrees().numpy(), outdeg)
    ids = np.array([n - 1, 0, 7, 0, n // 2])
    np.testing.assert_array_equal(g.in_degrees(torch.from_numpy(ids)).numpy(), indeg[ids])
    np.testing.assert_array_equal(g.out_degrees(ids).numpy(), outdeg[ids])
    assert g.out_degrees(7) == outdeg[7] and isinstance(g.in_degrees(7), int)
    with pytest.raises(asyncgraph.errors.OutOfRangeError):
        g.out_degrees([n])
    es, ed = g.edges()
    np.testing.assert_array_equal(es.numpy(), src)
    np.testing.assert_array_equal(ed.numpy(), dst)
    nodes = np.array([5, 100, 5])
    sub = g.in_subgraph(nodes)
    s_src, s_dst = sub.edges()
    assert sub.num_edges() == indeg[[5, 100]].sum() and set(s_dst.tolist()) <= {5, 100}
    np.testing.assert_array_equal(src[sub.edata[asyncgraph.EID].numpy()], s_src.numpy())
    eids = np.array([3, 88647, 40000])
    esub = g.edge_subgraph(eids)
    nid = esub.ndata[asyncgraph.NID].numpy()
    ls, ld = esub.edges()
    np.testing.assert_array_equal(nid[ls.numpy()], src[eids])
    np.testing.assert_array_equal(nid[ld.numpy()], dst[eids])
    np.testing.assert_array_equal(esub.edata[asyncgraph.EID].numpy(), eids)


def test_graph_metadata_methods(g: asyncgraph.DistGraph, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert g.rank() == 1 and g.get_num_clients() == g.num_clients == 1
    assert g.idtype == torch.int64 and g.device == torch.device("cpu")
    assert g.number_of_nodes() == g.num_nodes() and g.number_of_edges() == g.num_edges()
    npol, epol = g.get_node_partition_policy(), g.get_edge_partition_policy()
    assert npol.policy_str == "node:_N" and epol.policy_str == "edge:_E"
    assert npol.get_size() == g.num_nodes() and epol.get_size() == g.num_edges()
    lo, hi = g.get_partition_book().node_range(npol.part_id)
    assert npol.get_part_size() == hi - lo
    assert npol.to_local(torch.tensor([lo, hi - 1])).tolist() == [0, hi - lo - 1]
    assert npol.to_partid([lo]).tolist() == [npol.part_id]


# --- 4. sampling options -----------------------------------------------------------------------
def test_sample_neighbors_out_prob_exclude(g: asyncgraph.DistGraph, pubmed2) -> None:
    src, dst = _new_edges(pubmed2)
    n = g.num_nodes()
    outdeg = np.bincount(src, minlength=n)
    seeds = np.flatnonzero(outdeg >= 1)[::97]
    sub = asyncgraph.sample_neighbors(g, seeds, 3, edge_dir="out", seed=4)
    s, d = sub.edges()
    e = sub.edata["_ID"].numpy()
    np.testing.assert_array_equal(src[e], s.numpy())
    np.testing.assert_array_equal(dst[e], d.numpy())
    per_seed = np.bincount(np.searchsorted(seeds, s.numpy()), minlength=seeds.size)
    np.testing.assert_array_equal(per_seed, np.minimum(outdeg[seeds], 3))
    assert np.unique(e).size == e.size and sub.num_edges() == e.size
    _, _, e2 = asyncgraph.sample_neighbors(g, seeds, 3, edge_dir="out", seed=4)  # unpacks
    assert torch.equal(e2, sub.edata["_ID"])
    tup = asyncgraph.sample_neighbors(g, seeds, 3, edge_dir="out", seed=4, output="tuple")
    assert isinstance(tup, tuple) and torch.equal(tup[2], e2)
    # with replacement: exactly fanout draws per seed with out-edges
    s3, _, e3 = asyncgraph.sample_neighbors(g, seeds, 5, edge_dir="out", replace=True, seed=1)
    np.testing.assert_array_equal(np.bincount(np.searchsorted(seeds, s3.numpy()), minlength=seeds.size), 5)
    np.testing.assert_array_equal(src[e3.numpy()], s3.numpy())
    # exclude: those edge IDs never come back; all in-edges of a node minus the excluded
    hub = int(np.argmax(np.bincount(dst, minlength=n)))
    all_in = np.flatnonzero(dst == hub)
    drop = all_in[::2]
    _, _, e4 = asyncgraph.sample_neighbors(g, [hub], -1, exclude=drop)
    np.testing.assert_array_equal(np.sort(e4.numpy()), np.setdiff1d(all_in, drop))
    # prob: zero weights never picked; weights favour heavy edges
    w = asyncgraph.DistTensor((g.num_edges(),), torch.float32, name="pf_w", init=asyncgraph.zeros_init())
    heavy = all_in[:4]
    w[torch.from_numpy(all_in)] = 0.01
    w[torch.from_numpy(heavy)] = 100.0
    w[torch.from_numpy(all_in[4:6])] = 0.0
    counts = np.zeros(g.num_edges())
    for k in range(20):
        _, _, ek = asyncgraph.sample_neighbors(g, [hub], 4, prob="pf_w", seed=k)
        counts[ek.numpy()] += 1
    assert counts[heavy].sum() >= 70 and counts[all_in[4:6]].sum() == 0
    _, _, eo = asyncgraph.sample_neighbors(g, seeds, 2, edge_dir="out", prob="pf_w", replace=True, seed=2)
    assert (w[eo].numpy() > 0).all()
    with pytest.raises(asyncgraph.errors.UnknownTensorError):
        asyncgraph.sample_neighbors(g, seeds, 2, prob="nope")
    w.delete()


def test_sample_neighbors_out_is_uniform_over_partitions(g: asyncgraph.DistGraph, pubmed2) -> None:
    src, _ = _new_edges(pubmed2)
    book = g.get_partition_book()
    owner = book.eid2partid(np.arange(src.size))
    both = [u for u in np.flatnonzero(np.bincount(src) >= 6)[:400] if len(set(owner[src == u].tolist())) == 2]
    u = int(both[0])
    out_e = np.flatnonzero(src == u)
    hits = np.zeros(src.size)
    trials = 600
    for k in range(trials):
        _, _, e = asyncgraph.sample_neighbors(g, [u], 2, edge_dir="out", seed=k)
        hits[e.numpy()] += 1
    expect = trials * 2 / out_e.size
    assert np.all(np.abs(hits[out_e] - expect) < 5 * np.sqrt(expect) + 3)


def test_new_op_records_reject_bad_arguments() -> None:
    from asyncgraph.protocol.ops import DegreesArgs, SampleEdgesArgs

    ids = np.arange(3)
    assert DegreesArgs.decode(DegreesArgs(None, "out").encode()).ids is None
    with pytest.raises(InvalidRequestError, match="edge_dir"):
        DegreesArgs.decode({"ids": ids, "edge_dir": "both"})
    good = SampleEdgesArgs(ids, 2, "out", False, 1, "w", np.array([4])).encode()
    back = SampleEdgesArgs.decode(good)
    assert back.prob == "w" and back.exclude is not None and back.exclude.tolist() == [4]
    with pytest.raises(InvalidRequestError, match="prob"):
        SampleEdgesArgs.decode({**good, "prob": 3})
    with pytest.raises(asyncgraph.errors.DTypeMismatchError, match="exclude"):
        SampleEdgesArgs.decode({**good, "exclude": np.array([1.5])})


# --- 5. Graph with torch inputs, DGL-style constructor -------------------------------------------
def test_graph_accepts_torch_and_dgl_constructor(tmp_path) -> None:
    from asyncgraph.errors import ShapeMismatchError
    from asyncgraph.partition.graph import Graph

    src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])
    g = asyncgraph.graph((src, dst), num_nodes=5)
    assert isinstance(g, Graph) and g.num_nodes() == 5 and g.num_nodes == 5 and g.number_of_nodes() == 5
    assert g.num_edges() == 4 == g.number_of_edges()
    assert asyncgraph.graph((src, dst)).num_nodes() == 4
    g.ndata["feat"] = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    g.edata["w"] = torch.ones(4)
    g.ndata["train_mask"] = torch.tensor([True, False, True, False, True])
    assert isinstance(g.ndata["feat"], np.ndarray) and g.ndata["train_mask"].dtype == np.bool_
    with pytest.raises(ShapeMismatchError):
        g.ndata["bad"] = torch.ones(4)
    orig_nids, _ = asyncgraph.partition_graph(
        g, "toy", 2, tmp_path / "out", part_method="random", return_mapping=True
    )
    cfg = tmp_path / "out" / "toy.json"
    asyncgraph.initialize()
    try:
        dg = asyncgraph.DistGraph("toy", part_config=cfg)
        assert dg.num_nodes() == g.num_nodes()
        feat = dg.ndata["feat"][0:5].numpy()
        np.testing.assert_array_equal(feat, g.ndata["feat"][np.asarray(orig_nids)])
    finally:
        asyncgraph.finalize()
    from asyncgraph.partition.graph import Graph as G2  # the module stays importable as a module

    assert G2 is Graph


# --- 6. initialize inside a launched job -------------------------------------------------------
def test_initialize_prefers_launcher_env(served: ServerGroup, tmp_path, monkeypatch, caplog) -> None:
    from asyncgraph.env import ENV_IP_CONFIG

    monkeypatch.setenv(ENV_IP_CONFIG, str(served.ip_config()))
    stale = tmp_path / "ip_config.txt"
    stale.write_text("127.0.0.1 1\n127.0.0.1 2\n")  # what the script was written against
    with caplog.at_level("WARNING", logger="asyncgraph"), pytest.warns(UserWarning, match="num_workers"):
        asyncgraph.initialize(str(stale), num_workers=2)
    try:
        assert not asyncgraph.is_standalone()
        assert asyncgraph.DistGraph("pubmed").num_nodes() == 19717
        assert any("ignored" in r.message and str(stale) in r.message for r in caplog.records)
    finally:
        asyncgraph.finalize()
    with pytest.raises(InvalidRequestError, match="num_workers"):
        asyncgraph.initialize(num_workers=-1)


# --- 7. checkpoints ------------------------------------------------------------------------------
def test_checkpoint_loads_into_other_partitioning(
    g: asyncgraph.DistGraph, pubmed2, pubmed1, tmp_path
) -> None:
    import asyncgraph.distributed.checkpoint as ck

    ck_chunk = ck.CHUNK_BYTES
    ck.CHUNK_BYTES = 4096 * 16  # several chunks per partition
    try:
        n = g.num_nodes()
        emb = asyncgraph.DistEmbedding(n, 4, name="ck_emb")
        opt = asyncgraph.SparseAdam([emb], lr=0.05)
        rng = np.random.default_rng(0)
        for _ in range(3):
            ids = torch.from_numpy(rng.integers(0, n, 64))
            (emb(ids) ** 2).sum().backward()
            opt.step()
        emb.save(tmp_path / "emb", orig_ids=pubmed2.orig_nids)
        opt.save(tmp_path / "opt", orig_ids=pubmed2.orig_nids)
        want = emb.state_dict(orig_ids=pubmed2.orig_nids)["weight"]
        want_opt = opt.state_dict(orig_ids={"ck_emb": pubmed2.orig_nids})
        assert set(want_opt["state"]["ck_emb"]) == {"adam_m", "adam_v", "adam_step"}
        assert int(want_opt["state"]["ck_emb"]["adam_step"].sum()) > 0
        new_ids = np.arange(n)
        np.testing.assert_array_equal(want[pubmed2.orig_nids].numpy(), emb.weight[new_ids].numpy())

        client = asyncgraph.Client.standalone(pubmed1.part_config)
        try:
            emb1 = asyncgraph.DistEmbedding(
                n, 4, name="ck_emb", init_func=asyncgraph.zeros_init(), client=client
            )
            opt1 = asyncgraph.SparseAdam([emb1], lr=0.05)
            with pytest.raises(InvalidRequestError, match="orig_ids"):
                emb1.load(tmp_path / "emb")
            emb1.load(tmp_path / "emb", orig_ids=pubmed1.orig_nids)
            opt1.load(tmp_path / "opt", orig_ids=pubmed1.orig_nids)
            assert torch.equal(emb1.state_dict(orig_ids=pubmed1.orig_nids)["weight"], want)
            got_opt = opt1.state_dict(orig_ids=pubmed1.orig_nids)
            for key, rows in want_opt["state"]["ck_emb"].items():
                assert torch.equal(got_opt["state"]["ck_emb"][key], rows), key
            # in-memory state dicts round-trip too
            emb1.load_state_dict({"weight": torch.zeros(n, 4)})
            emb1.load_state_dict({"weight": want}, orig_ids=pubmed1.orig_nids)
            assert torch.equal(emb1.state_dict(orig_ids=pubmed1.orig_nids)["weight"], want)
            opt1.load_state_dict(want_opt, orig_ids=pubmed1.orig_nids)
            with pytest.raises(InvalidRequestError, match="adagrad"):
                asyncgraph.SparseAdagrad([emb1], lr=0.1).load(tmp_path / "opt", orig_ids=pubmed1.orig_nids)
            with pytest.raises(asyncgraph.errors.ShapeMismatchError):
                emb1.load_state_dict({"weight": torch.zeros(3, 4)})
        finally:
            client.close()
    finally:
        ck.CHUNK_BYTES = ck_chunk
