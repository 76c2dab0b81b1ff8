"""Typed edges (issue 27 §2): per-type edge IDs, ``g.edges[etype].data``, ``find_edges(etype=)``,
``partid2eids(p, etype)``, ``DistEdgeDataLoader({etype: eids})`` with per-relation negatives and
DGL's exclusions, on a hand-built heterograph with known answers and on ACM; served (2 real
server processes, over shared memory and over the socket) equals standalone."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph import function as fn
from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading import DistEdgeDataLoader, NeighborSampler
from asyncgraph.dataloading.negative import Uniform
from asyncgraph.distributed import DistGraph, DistTensor
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownTensorError,
    UnknownTypeError,
)
from asyncgraph.partition import PartitionConfig
from asyncgraph.testing import ServerGroup, start_servers, subprocess_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from hetero_node_classification import load_acm  # noqa: E402

BUYS, BOUGHT, VIEWS = ("user", "buys", "item"), ("item", "bought-by", "user"), ("user", "views", "item")
# Hand-built: 4 users, 3 items; "bought-by" reverses "buys" edge by edge; w = 10*type + index.
EDGES = {
    BUYS: ([0, 0, 1, 2, 3, 3], [0, 1, 2, 0, 1, 2]),
    BOUGHT: ([0, 1, 2, 0, 1, 2], [0, 0, 1, 2, 3, 3]),
    VIEWS: ([1, 2], [0, 2]),
}
W = {BUYS: [10, 11, 12, 13, 14, 15], BOUGHT: [20, 21, 22, 23, 24, 25], VIEWS: [30, 31]}


def tiny() -> asyncgraph.HeteroGraph:
    g = asyncgraph.heterograph(
        {c: (np.array(s), np.array(d)) for c, (s, d) in EDGES.items()}, {"user": 4, "item": 3}
    )
    for c, w in W.items():
        g.edges[c].data["w"] = np.array(w, dtype=np.float32)
    g.nodes["user"].data["feat"] = np.arange(8, dtype=np.float32).reshape(4, 2)
    g.nodes["item"].data["feat"] = -np.arange(6, dtype=np.float32).reshape(3, 2)
    return g


def acm() -> asyncgraph.HeteroGraph:
    """ACM (16 words) plus an edge tensor per type naming each edge: 1e5 * type + original ID."""
    g = load_acm(words=16)
    for i, c in enumerate(g.canonical_etypes):
        g.edges[c].data["tag"] = (100000 * i + np.arange(g.num_edges(c))).astype(np.int64)
    return g


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict, dict]]:
    out = {}
    for name, make in (("tiny", tiny), ("acm", acm)):
        d = tmp_path_factory.mktemp(name)
        nmap, emap = asyncgraph.partition_graph(make(), name, 2, d, part_method="random", return_mapping=True)
        out[name] = (d / f"{name}.json", nmap, emap)
    return out


@pytest.fixture(scope="module")
def servers(
    parts: dict[str, tuple[Path, dict, dict]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServerGroup]]:
    groups = {
        n: start_servers(p[0], tmp_path_factory.mktemp(f"{n}-srv"), num_parts=2) for n, p in parts.items()
    }
    yield groups
    for group in groups.values():
        group.stop()


def _graphs(name: str, parts: dict, servers: dict) -> Iterator[list[DistGraph]]:
    clients = [
        Client.standalone(parts[name][0]),
        Client.connect(servers[name].addresses),  # co-located: reads over shared memory
        Client.connect(servers[name].addresses, use_shared_memory=False),  # over the socket
    ]
    yield [DistGraph(name, client=c) for c in clients]
    for c in clients:
        c.close()


@pytest.fixture(scope="module")
def tinies(parts: dict, servers: dict) -> Iterator[list[DistGraph]]:
    yield from _graphs("tiny", parts, servers)


@pytest.fixture(scope="module")
def acms(parts: dict, servers: dict) -> Iterator[list[DistGraph]]:
    yield from _graphs("acm", parts, servers)


# --- per-type IDs, data and endpoints ----------------------------------------------------------------
def test_tiny_known_answers_every_path(tinies: list[DistGraph], parts: dict) -> None:
    _, nmap, emap = parts["tiny"]
    for g in tinies:
        assert sorted(g.edges["buys"].data) == ["w"] and g.num_edges("views") == 2
        for c, (osrc, odst) in EDGES.items():
            n = g.num_edges(c)
            tids = np.arange(n)
            w = g.edges[c].data["w"][tids].numpy()
            s, d = g.find_edges(tids, etype=c)
            # the typed edges, mapped back to original node IDs, are exactly the hand-built ones
            got = sorted(
                zip(nmap[c[0]][s.numpy()].tolist(), nmap[c[2]][d.numpy()].tolist(), w.tolist(), strict=True)
            )
            assert got == sorted(zip(osrc, odst, [float(x) for x in W[c]], strict=True))
            np.testing.assert_array_equal(
                w, np.asarray(W[c], np.float32)[emap[c]]
            )  # per-type ID k is emap[c][k]
            us, vs = g.edges(etype=c)
            np.testing.assert_array_equal(us.numpy(), s.numpy())
            np.testing.assert_array_equal(vs.numpy(), d.numpy())
            assert g.edges(form="all", etype=c)[2].tolist() == list(range(n))


def test_book_maps_per_type_edge_ids(tinies: list[DistGraph], acms: list[DistGraph]) -> None:
    for g in [*tinies, *acms]:
        book = g.get_partition_book()
        for r, c in enumerate(g.canonical_etypes):
            owned = [book.partid2eids(p, c).numpy() for p in range(2)]
            np.testing.assert_array_equal(np.concatenate(owned), np.arange(g.num_edges(c)))
            for p in range(2):  # per-type IDs are range-partitioned: part p's map into its edge range
                homo = book.map_to_homo_eid(owned[p], c)
                lo, hi = book.edge_range(p)
                assert homo.size == 0 or (homo.min() >= lo and homo.max() < hi)
                assert np.all(np.diff(homo) > 0)  # in homogeneous order inside a partition
                types, back = book.map_to_per_etype(homo)
                assert np.all(types == r)
                np.testing.assert_array_equal(back, owned[p])
    for g in acms:  # owners of per-type IDs, as DGL's eid2partid(eids, etype) / nid2partid(nids, ntype)
        book = g.get_partition_book()
        tids = np.arange(g.num_edges("writes"))
        np.testing.assert_array_equal(
            book.eid2partid(tids, "writes"), book.eid2partid(book.map_to_homo_eid(tids, "writes"))
        )
        nids = np.arange(g.num_nodes("author"))
        np.testing.assert_array_equal(
            book.nid2partid(nids, "author"), book.nid2partid(book.map_to_homo_nid(nids, "author"))
        )
        with pytest.raises(OutOfRangeError, match="writes"):
            book.eid2partid([13407], "writes")
    homo = [g.get_partition_book().map_to_homo_eid([5, 0, 5, 13406], "writes") for g in acms]
    np.testing.assert_array_equal(homo[0], homo[1])
    np.testing.assert_array_equal(homo[0], homo[2])


def test_acm_edge_data_served_equals_standalone(acms: list[DistGraph], parts: dict) -> None:
    _, _, emap = parts["acm"]
    for i, c in enumerate(acms[0].canonical_etypes):
        n = acms[0].num_edges(c)
        ids = np.r_[0, n - 1, np.arange(0, n, 97), 3, 3]
        rows = [g.edges[c].data["tag"][ids].numpy() for g in acms]
        for r in rows[1:]:
            np.testing.assert_array_equal(r, rows[0])
        np.testing.assert_array_equal(rows[0], 100000 * i + emap[c][ids])  # exactly DGL's rows
        ends = [tuple(t.numpy() for t in g.find_edges(ids, etype=c)) for g in acms]
        for e in ends[1:]:
            np.testing.assert_array_equal(e[0], ends[0][0])
            np.testing.assert_array_equal(e[1], ends[0][1])


def test_create_and_write_per_type_tensors(tinies: list[DistGraph]) -> None:
    for k, g in enumerate(tinies):
        name = f"z{k}"
        g.edges["views"].data[name] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # created from rows
        assert name in g.edges["views"].data and name not in g.edges["buys"].data
        t = g.edges["views"].data[name]
        assert t.shape == (2, 2) and t.etype == VIEWS
        np.testing.assert_array_equal(t[[1, 0]].numpy(), [[3, 4], [1, 2]])
        t[[1]] = torch.tensor([[7.0, 8.0]])
        homo = g.get_partition_book().map_to_homo_eid([1], "views")
        np.testing.assert_array_equal(g.edata[name][homo].numpy(), [[7, 8]])  # landed on its edge
        # DGL's form: a DistTensor with the type's policy, then added under a name
        pol = g.get_edge_partition_policy("buys")
        p = DistTensor(
            (g.num_edges("buys"),),
            torch.float32,
            f"p{k}",
            init_func=lambda s, d: torch.ones(s),
            part_policy=pol,
            client=g.client,
        )
        g.edges["buys"].data["prob"] = p
        assert g.edges[BUYS].data["prob"] is p and len(p) == 6
        p[[0, 5]] = torch.tensor([0.0, 2.0])
        np.testing.assert_array_equal(p[np.arange(6)].numpy(), [0, 1, 1, 1, 1, 2])
        p.push([5, 5], torch.tensor([1.0, 1.0]), op="add")
        assert float(p[5]) == 4.0
        # a tensor of that size infers the edge type's policy, as DGL's
        q = DistTensor((g.num_edges("views"), 3), torch.float32, f"q{k}", client=g.client)
        assert q.etype == VIEWS and q.policy == "edge"


def test_bad_input_is_typed_and_changes_nothing(tinies: list[DistGraph], parts: dict) -> None:
    for k, g in enumerate(tinies):
        book = g.get_partition_book()
        with pytest.raises(UnknownTypeError):
            g.edges["likes"]
        with pytest.raises(UnknownTypeError):
            g.find_edges([0], etype="likes")
        with pytest.raises(UnknownTypeError):
            book.partid2eids(0, ("user", "likes", "item"))
        with pytest.raises(OutOfRangeError, match="views"):
            g.edges["views"].data["w"][[0, 2]]
        with pytest.raises(OutOfRangeError):
            g.edges["views"].data["w"][[-1]]
        with pytest.raises(OutOfRangeError, match="buys"):
            g.find_edges([6], etype="buys")
        with pytest.raises(OutOfRangeError, match="buys"):
            book.map_to_homo_eid([0, 6], "buys")
        with pytest.raises(OutOfRangeError):
            book.partid2eids(2, "buys")
        with pytest.raises(UnknownTensorError):
            g.edges["views"].data["nope"]
        with pytest.raises(ShapeMismatchError, match="2 edges"):
            g.edges["views"].data[f"bad{k}"] = torch.zeros(3, 2)
        with pytest.raises(InvalidRequestError, match="cannot infer"):  # buys and bought-by: 6 each
            DistTensor((g.num_edges("buys"),), torch.float32, f"u{k}", client=g.client)
        other = DistTensor(
            (6,), torch.float32, f"u{k}", part_policy=g.get_edge_partition_policy("buys"), client=g.client
        )
        with pytest.raises(InvalidRequestError, match="edge type"):
            g.edges["views"].data["x"] = other
        with pytest.raises(InvalidRequestError, match="edge type"):
            DistTensor(
                (5, 2),
                torch.float32,
                f"v{k}",
                part_policy=g.get_edge_partition_policy("views"),
                client=g.client,
            )
        name = f"keep{k}"
        g.edges["views"].data[name] = torch.tensor([1.0, 2.0])
        with pytest.raises(OutOfRangeError):
            g.edges["views"].data[name][[0, 2]] = torch.tensor([9.0, 9.0])
        np.testing.assert_array_equal(g.edges["views"].data[name][[0, 1]].numpy(), [1, 2])  # unchanged
    with pytest.raises(InvalidRequestError, match="DistGraph"):  # a book from the files alone
        PartitionConfig.load(parts["tiny"][0]).book().map_to_homo_eid([0], "buys")


# --- edge loader ------------------------------------------------------------------------------------
def _batches(g: DistGraph, **kw: object) -> list:
    loader = DistEdgeDataLoader(g, sampler=NeighborSampler([4, 4]), **kw)  # type: ignore[arg-type]
    return [tuple(b) for b in loader]


def _check_batch(g: DistGraph, batch, k: int, feats: bool = True) -> None:  # type: ignore[no-untyped-def]
    inputs, pos, neg, blocks = batch
    for t in g.ntypes:
        np.testing.assert_array_equal(blocks[-1].dstnodes[t].numpy(), pos.nodes_of[t].numpy())
        np.testing.assert_array_equal(blocks[0].srcnodes[t].numpy(), inputs[t].numpy())
        if feats and inputs[t].numel():
            want = g.nodes[t].data["feat"][inputs[t]].numpy()
            np.testing.assert_array_equal(blocks[0].srcdata[t]["feat"].numpy(), want)
    for c in g.canonical_etypes:
        s, d = pos.edges(etype=c)
        eids = pos.edges[c].data["_ID"]
        fs, fd = g.find_edges(eids, etype=c)
        np.testing.assert_array_equal(pos.nodes_of[c[0]][s].numpy(), fs.numpy())  # the pairs are the edges
        np.testing.assert_array_equal(pos.nodes_of[c[2]][d].numpy(), fd.numpy())
        ns, nd = neg.edges(etype=c)
        assert ns.numel() == nd.numel() == k * s.numel()  # k negatives per positive, same relation
        np.testing.assert_array_equal(neg.nodes_of[c[0]][ns].numpy(), np.repeat(fs.numpy(), k))


def test_typed_edge_loader_served_equals_standalone(acms: list[DistGraph]) -> None:
    eids = {"written-by": np.arange(0, 13407, 5), ("subject", "subject-of", "paper"): np.arange(0, 4019, 9)}
    kw = dict(batch_size=300, negative_sampler=Uniform(2), seed=7, shuffle=True)
    runs = [_batches(g, eids=eids, **kw)[:3] for g in acms]
    for g, run in zip(acms, runs, strict=True):
        for b in run:
            _check_batch(g, b, 2)
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            for c in acms[0].canonical_etypes:
                for x, y in zip((a[1].pairs[c], a[2].pairs[c]), (b[1].pairs[c], b[2].pairs[c]), strict=True):
                    for u, v in zip(x, y, strict=True):
                        np.testing.assert_array_equal(u.numpy(), v.numpy())
                for layer in range(2):
                    for u, v in zip(a[3][layer].edges(c), b[3][layer].edges(c), strict=True):
                        np.testing.assert_array_equal(u.numpy(), v.numpy())
    seen = np.concatenate(
        [b[1].edges["written-by"].data["_ID"].numpy() for b in _batches(acms[1], eids=eids, **kw)]
    )
    np.testing.assert_array_equal(np.sort(seen), eids["written-by"])  # every edge once per epoch


@pytest.mark.parametrize("overlap", [True, False])
def test_typed_batches_staged_to_a_device(acms: list[DistGraph], overlap: bool) -> None:
    """``device=`` stages typed pair graphs and blocks like any batch (here to the CPU through the
    staging buffer: every tensor is a view of the copy, and the values are the same)."""
    g = acms[0]
    kw = dict(
        eids={"written-by": np.arange(0, 13407, 50)}, batch_size=100, negative_sampler=Uniform(1), seed=3
    )
    plain = _batches(g, **kw)
    staged = [
        tuple(b)
        for b in DistEdgeDataLoader(g, sampler=NeighborSampler([4, 4]), device="cpu", overlap=overlap, **kw)
    ]  # type: ignore[arg-type]
    for a, b in zip(plain, staged, strict=True):
        for t in g.ntypes:
            np.testing.assert_array_equal(a[0][t].numpy(), b[0][t].numpy())
            np.testing.assert_array_equal(
                a[3][0].srcdata[t]["feat"].numpy(), b[3][0].srcdata[t]["feat"].numpy()
            )
        for c in g.canonical_etypes:
            for x, y in zip(a[1].pairs[c] + a[2].pairs[c], b[1].pairs[c] + b[2].pairs[c], strict=True):
                np.testing.assert_array_equal(x.numpy(), y.numpy())
            np.testing.assert_array_equal(
                a[1].edges[c].data["_ID"].numpy(), b[1].edges[c].data["_ID"].numpy()
            )
            for layer in range(2):
                np.testing.assert_array_equal(
                    a[3][layer].edges[c].data["_ID"].numpy(), b[3][layer].edges[c].data["_ID"].numpy()
                )
        if overlap:  # packed into the staging buffer: views of the one copied buffer
            assert a[1].pairs[WB_ACM][0]._base is None
            for t in (b[1].pairs[WB_ACM][0], b[2].nodes_of["author"], b[3][1].edges[WB_ACM].data["_ID"]):
                assert t._base is not None


WB_ACM = ("paper", "written-by", "author")


def test_exclusions_as_dgl(tinies: list[DistGraph]) -> None:
    g = tinies[1]
    all_buys = {BUYS: np.arange(6)}
    # no exclusion: a full-neighbourhood block holds the batch's own edges
    b = _batches(g, eids=all_buys, batch_size=6, negative_sampler=Uniform(1), shuffle=False)[0]
    blk = DistEdgeDataLoader(
        g, all_buys, NeighborSampler([-1]), 6, shuffle=False, negative_sampler=Uniform(1)
    )
    first = tuple(next(iter(blk)))
    assert first[3][0].num_edges("buys") == 6  # every in-edge of the items: all 6 "buys" edges
    assert sorted(first[3][0].edges["buys"].data["_ID"].tolist()) == list(range(6))
    _check_batch(g, b, 1)
    for exclude, extra in (
        ("self", {}),
        ("reverse_types", {"reverse_etypes": {"buys": "bought-by", "bought-by": "buys"}}),
    ):
        loader = DistEdgeDataLoader(
            g,
            all_buys,
            NeighborSampler([-1, -1]),
            2,
            shuffle=False,
            exclude=exclude,
            **extra,  # type: ignore[arg-type]
        )
        for batch in loader:
            _, pair, blocks = batch
            own = pair.edges["buys"].data["_ID"]
            for blk_ in blocks:
                assert not torch.isin(blk_.edges["buys"].data["_ID"], own).any()
                if exclude == "reverse_types":  # the same per-type IDs of the reverse type too
                    assert not torch.isin(blk_.edges["bought-by"].data["_ID"], own).any()
            if exclude == "self":  # the reverse type's edges stay
                got = torch.cat([blk_.edges["bought-by"].data["_ID"] for blk_ in blocks])
                assert got.numel() > 0
    # reverse_id: reverses of the same type, per-type table
    table = np.array([5, 4, 3, 2, 1, 0])
    loader = DistEdgeDataLoader(
        g,
        all_buys,
        NeighborSampler([-1]),
        2,
        shuffle=False,
        exclude="reverse_id",
        reverse_eids={"buys": table},
    )
    for batch in loader:
        _, pair, blocks = batch
        own = pair.edges["buys"].data["_ID"]
        gone = torch.cat([own, torch.from_numpy(table)[own]])
        assert not torch.isin(blocks[0].edges["buys"].data["_ID"], gone).any()
    # errors, raised when the loader is built
    with pytest.raises(UnknownTypeError):
        DistEdgeDataLoader(g, {"likes": [0]}, NeighborSampler([1]), 2)
    with pytest.raises(OutOfRangeError, match="views"):
        DistEdgeDataLoader(g, {"views": [0, 2]}, NeighborSampler([1]), 2)
    with pytest.raises(InvalidRequestError, match="reverse_etypes"):
        DistEdgeDataLoader(g, all_buys, NeighborSampler([1]), 2, exclude="reverse_types", reverse_etypes={})
    with pytest.raises(OutOfRangeError):  # "views" has 2 edges: IDs 2..5 of "buys" have no same-ID reverse
        DistEdgeDataLoader(
            g, all_buys, NeighborSampler([1]), 2, exclude="reverse_types", reverse_etypes={"buys": "views"}
        )
    with pytest.raises(ShapeMismatchError, match="reverse_eids"):
        DistEdgeDataLoader(
            g, all_buys, NeighborSampler([1]), 2, exclude="reverse_id", reverse_eids={"buys": [0, 1]}
        )
    with pytest.raises(InvalidRequestError, match="exclude"):
        DistEdgeDataLoader(g, np.arange(3), NeighborSampler([1]), 2, exclude="reverse_types")


def test_pair_graph_scores_and_block_edge_data(tinies: list[DistGraph]) -> None:
    g = tinies[0]
    batch = next(
        iter(
            DistEdgeDataLoader(
                g,
                {BUYS: np.arange(6), VIEWS: [0, 1]},
                NeighborSampler([-1]),
                8,
                negative_sampler=Uniform(3),
                seed=1,
            )
        )
    )
    _, pos, neg, blocks = batch
    h = {t: torch.randn(pos.num_nodes(t), 4) for t in pos.ntypes}
    with pos.local_scope():
        pos.ndata["h"] = h
        pos.apply_edges(fn.u_dot_v("h", "h", "score"))  # every relation
        scores = pos.edata["score"]
        for c in (BUYS, VIEWS):
            s, d = pos.edges(etype=c)
            np.testing.assert_allclose(
                scores[c][:, 0].numpy(), (h[c[0]][s] * h[c[2]][d]).sum(1).numpy(), rtol=1e-6
            )
        assert scores[BOUGHT].shape == (0, 1)
    assert "score" not in pos.edata  # local_scope dropped it
    assert neg.num_edges("buys") == 18 and "_ID" not in neg.edges["buys"].data  # negatives: no IDs
    eid = blocks[0].edata["_ID"]
    assert set(eid) == set(g.canonical_etypes)
    w = g.edges["buys"].data["w"][
        blocks[0].edges["buys"].data["_ID"]
    ]  # lp_perf's read: block EIDs index g.edges
    assert w.shape == (blocks[0].num_edges("buys"),)


def test_per_type_prob_sampling_and_edge_split(acms: list[DistGraph]) -> None:
    """lp_perf's pattern: an anonymous DistTensor per edge type set as ``g.edges[c].data["prob"]``
    (half of each type's weights 0), then typed sampling with ``prob="prob"`` never picks a 0."""
    for k, g in enumerate(acms[:2]):  # standalone, served
        for c in g.canonical_etypes:
            n = g.num_edges(c)
            zero = np.random.default_rng(k).permutation(n)[: n // 2]

            t = DistTensor(
                (n,),
                torch.float32,
                init_func=lambda shape, dtype: torch.ones(shape, dtype=dtype),
                part_policy=g.get_edge_partition_policy(c),
                client=g.client,
            )
            t[zero] = torch.zeros(zero.size)
            g.edges[c].data["prob"] = t
        eids = {("author", "writes", "paper"): np.arange(0, 13407, 3)}
        loader = DistEdgeDataLoader(
            g, eids, NeighborSampler([4, 4], prob="prob"), 500, negative_sampler=Uniform(3)
        )
        picked = 0
        for _, _, _, blocks in loader:
            for blk in blocks:
                for c in blk.canonical_etypes:
                    ids = blk.edges[c].data["_ID"]
                    picked += ids.numel()
                    assert bool((g.edges[c].data["prob"][ids] > 0).all()), c
        assert picked > 1000
        from asyncgraph.dataloading import DistNodeDataLoader

        nodes = DistNodeDataLoader(
            g, {"paper": np.arange(0, 4019, 5)}, NeighborSampler([4], prob="prob"), 400
        )
        for _, _, blocks in nodes:  # the typed node loader resolves the per-type tensors too
            for c in blocks[0].canonical_etypes:
                ids = blocks[0].edges[c].data["_ID"]
                assert bool((g.edges[c].data["prob"][ids] > 0).all()), c
        pb = g.get_partition_book()
        mask = torch.zeros(g.num_edges("writes"), dtype=torch.bool)
        mask[::2] = True
        shares = [asyncgraph.edge_split(mask, pb, rank=r, world_size=2, etype="writes") for r in range(2)]
        np.testing.assert_array_equal(torch.cat(shares).sort().values.numpy(), np.arange(0, 13407, 2))
        assert abs(len(shares[0]) - len(shares[1])) <= 1


def test_per_type_prob_bad_input(acms: list[DistGraph]) -> None:
    from asyncgraph.protocol.args import SampleEdgesArgs

    g = acms[1]
    seeds, fan = np.arange(3), np.full(4, 2)
    with pytest.raises(InvalidRequestError, match="one prob per edge type"):
        g.client.sample_etypes(seeds, fan, prob=["a", None])
    with pytest.raises(InvalidRequestError, match="etype_probs"):
        SampleEdgesArgs.decode(
            {"seeds": seeds, "fanout": -1, "edge_dir": "in", "etype_probs": [None, None]}
        )  # no fanouts
    with pytest.raises(InvalidRequestError, match="etype_probs"):
        SampleEdgesArgs.decode(
            {
                "seeds": seeds,
                "fanout": -1,
                "edge_dir": "in",
                "etype_fanouts": fan,
                "etype_probs": [1, 2, 3, 4],
            }
        )
    with pytest.raises(InvalidRequestError, match="nope"):  # the servers name the missing tensor
        g.client.sample_etypes(seeds, fan, prob=[None, "nope", None, None])
    with pytest.raises(DTypeMismatchError):
        NeighborSampler([2], prob=3)  # type: ignore[arg-type]


def test_homogeneous_sampler_prob(cora2) -> None:  # type: ignore[no-untyped-def]
    """``NeighborSampler(prob=)`` on a homogeneous graph: the owners skip 0-weight edges."""
    from asyncgraph.dataloading import DistNodeDataLoader

    client = Client.standalone(cora2.part_config)
    g = DistGraph("cora", client=client)
    w = DistTensor((g.num_edges(),), torch.float32, "w_prob", client=client)
    w[np.arange(g.num_edges())] = torch.from_numpy((np.arange(g.num_edges()) % 2).astype(np.float32))
    loader = DistNodeDataLoader(g, np.arange(0, 2708, 7), NeighborSampler([5, 5], prob="w_prob"), 128)
    for _, _, blocks in loader:
        for blk in blocks:
            assert blk.eids.numel() > 0 and bool((blk.eids % 2 == 1).all())
    client.close()


# --- durability ------------------------------------------------------------------------------------
def test_snapshot_without_type_order_restores(parts: dict, tmp_path: Path) -> None:
    """A snapshot written before ``_TYPE_ORDER`` existed (a store without it) restores into a
    store that derives it: the derived base tensor stays, the snapshot's rows come back."""
    from asyncgraph.names import TYPE_ORDER, tensor_key
    from asyncgraph.partition.reader import load_partition
    from asyncgraph.server.durable import DurableState
    from asyncgraph.storage.store import PartitionStore

    part = load_partition(parts["tiny"][0], 1)
    key = tensor_key("edge", TYPE_ORDER)
    old = PartitionStore.create(
        part.config.graph_name, 1, part.book, part.indptr, part.indices, part.eids,
        part.node_feats, part.edge_feats, shared=False,
    )  # fmt: skip
    assert not old.has_tensor(key)
    old.create_tensor("edge:s", "edge", (14,), "float32", None)
    lo, hi = old.edge_range
    old.push("edge:s", np.arange(lo, hi), np.arange(hi - lo, dtype=np.float32))
    state = DurableState(tmp_path, 1, wal=False)
    state.snapshot(old, 1)
    state.close()
    fresh = PartitionStore.from_partition(part, shared=False)
    want = fresh.local_rows(key).copy()
    restored = DurableState(tmp_path, 1, wal=False)
    restored.restore(fresh, lambda *a: None)
    restored.close()
    np.testing.assert_array_equal(fresh.local_rows(key), want)
    np.testing.assert_array_equal(fresh.local_rows("edge:s"), np.arange(hi - lo, dtype=np.float32))


def test_typed_reads_after_a_durable_server_restarts(parts: dict, tmp_path: Path) -> None:
    group = start_servers(
        parts["tiny"][0], tmp_path / "run", num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )  # fmt: skip
    try:
        client = Client.connect(group.addresses, use_shared_memory=False)
        g = DistGraph("tiny", client=client)
        before = g.edges["buys"].data["w"][np.arange(6)].numpy()
        client.close()
        group.kill(1)
        group.restart(1)
        client = Client.connect(group.addresses)
        g = DistGraph("tiny", client=client)
        np.testing.assert_array_equal(g.edges["buys"].data["w"][np.arange(6)].numpy(), before)
        np.testing.assert_array_equal(np.sort(before), [10, 11, 12, 13, 14, 15])
        client.close()
    finally:
        group.stop()


def test_typed_reads_and_weighted_typed_sampling_with_replicas(parts: dict, tmp_path: Path) -> None:
    """Each partition served by a primary and a replica (reads take turns): the replica derives
    ``_TYPE_ORDER`` on load too, so typed reads and typed weighted sampling agree with standalone."""
    group = start_servers(parts["tiny"][0], tmp_path / "srv", num_parts=2, num_servers=2)
    local = Client.standalone(parts["tiny"][0])
    remote = Client.connect(group.addresses, use_shared_memory=False)
    try:
        graphs = [DistGraph("tiny", client=c) for c in (local, remote)]
        for _ in range(3):  # several rounds: primaries and replicas both answer
            rows = [g.edges[c].data["w"][np.arange(g.num_edges(c))].numpy() for g in graphs for c in EDGES]
            half = len(rows) // 2
            for a, b in zip(rows[:half], rows[half:], strict=True):
                np.testing.assert_array_equal(a, b)
        samples = [
            g.client.sample_etypes(np.arange(7), np.full(3, -1), seed=1, prob=[None, None, "w"])
            for g in graphs
        ]
        for key in ("eids", "etype", "type_eid"):
            np.testing.assert_array_equal(np.sort(samples[0][key]), np.sort(samples[1][key]))
    finally:
        local.close()
        remote.close()
        group.stop()


# --- the example --------------------------------------------------------------------------------------
def test_link_prediction_example_learns() -> None:
    example = str(ROOT / "examples" / "hetero_link_prediction.py")
    out = subprocess.run(
        [sys.executable, example, "--epochs", "2", "--words", "64"],
        capture_output=True, text=True, timeout=300, env=subprocess_env(), cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if "held-out AUC" in line)
    auc = float(line.split("held-out AUC", 1)[1].split()[0])
    assert auc > 0.75, line  # chance is 0.5


def test_typed_edge_batches_from_worker_processes_equal_the_loop_threads(acms: list[DistGraph]) -> None:
    """``num_workers=2`` over typed edges (standalone, shared memory, socket): every tensor of
    every batch equals ``num_workers=0``'s, in the same order."""
    from asyncgraph.dataloading.device import map_tensors

    def flat(batch: object) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        map_tensors(batch, lambda t: out.append(t) or t)
        return out

    for g in acms[:2]:
        eids = {c: np.arange(0, g.num_edges(c), 7) for c in g.canonical_etypes[:2]}
        kwargs = {"negative_sampler": Uniform(1), "exclude": "self", "seed": 3}
        ref = DistEdgeDataLoader(g, eids, NeighborSampler([3, 2]), 64, **kwargs)
        loader = DistEdgeDataLoader(g, eids, NeighborSampler([3, 2]), 64, num_workers=2, **kwargs)
        try:
            expected = [flat(b) for b in ref]
            got = [flat(b) for b in loader]
            assert len(got) == len(expected) > 1
            for e, b in zip(expected, got, strict=True):
                assert len(e) == len(b)
                for x, y in zip(e, b, strict=True):
                    assert x.dtype == y.dtype and torch.equal(x, y)
            assert loader.stats.sample > 0 and loader.stats.pull > 0
        finally:
            loader.close()
