"""A live heterogeneous graph (issue 35): typed nodes and edges added and removed on ACM.

ACM in two partitions, served by real server processes (a co-located client through shared
memory, one over the socket) and standalone in-process, fed the same typed updates. Every
check compares with a model of each relation's live edges in per-type IDs, built from the
base graph and the acknowledged updates; bad input is a typed error and changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncgraph
from asyncgraph import DistGraph
from asyncgraph.client import Client
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.errors import (
    InvalidRequestError,
    NodeTypeMismatchError,
    OutOfRangeError,
    UnknownEdgeError,
    UnknownTypeError,
)
from asyncgraph.testing import start_servers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from hetero_node_classification import load_acm  # noqa: E402

Edges = dict[tuple[str, str, str], dict[int, tuple[int, int]]]
Added = dict[str, list[int]]


@pytest.fixture(scope="module")
def acm_parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("acm-live")
    asyncgraph.partition_graph(load_acm(words=16), "acm", 2, out, part_method="random")
    return out / "acm.json"


def _model(g: DistGraph) -> Edges:
    model: Edges = {}
    for c in g.canonical_etypes:
        s, d, e = (t.numpy().tolist() for t in g.edges(form="all", etype=c))
        model[c] = dict(zip(e, zip(s, d, strict=True), strict=True))
    return model


def _update(g: DistGraph, model: Edges, added: Added, rng: np.random.Generator) -> None:
    """Typed nodes of two types, edges of every relation (new and base ends), removals."""
    feat = np.full((3, 16), 0.5 + len(added.get("paper", [])), np.float32)
    papers = g.add_nodes(3, ntype="paper", data={"feat": feat}).numpy()  # "paper/feat" rows
    authors = g.add_nodes(2, ntype="author", part=1).numpy()
    added.setdefault("paper", []).extend(papers.tolist())
    added.setdefault("author", []).extend(authors.tolist())
    n = {t: g.num_nodes(t) for t in g.ntypes}
    for c in g.canonical_etypes:
        src_new = {"paper": papers, "author": authors}.get(c[0], np.empty(0, np.int64))
        dst_new = {"paper": papers, "author": authors}.get(c[2], np.empty(0, np.int64))
        src = np.concatenate([src_new, rng.integers(0, n[c[0]], 6), rng.integers(0, n[c[0]], dst_new.size)])
        dst = np.concatenate([rng.integers(0, n[c[2]], src_new.size + 6), dst_new])
        ids = g.add_edges(src, dst, etype=c).numpy()
        assert ids.min() >= g.num_edges(c)  # per-type IDs above the base: E_c + p + k * P
        model[c].update(zip(ids.tolist(), zip(src.tolist(), dst.tolist(), strict=True), strict=True))
        live = np.array(sorted(model[c]))
        gone = rng.choice(live, 4, replace=False)
        gone = np.concatenate([gone, ids[:1]])  # a new edge too
        g.remove_edges(gone, etype=c)
        for e in gone.tolist():
            del model[c][e]


def _every_edge(g: DistGraph, c: tuple[str, str, str], added: Added) -> set[tuple[int, int, int]]:
    """Every live edge of ``c``: all in-edges of all its destination type's nodes, new ones too."""
    seeds = np.concatenate([np.arange(g.num_nodes(c[2])), added.get(c[2], [])]).astype(np.int64)
    s, d, e = g.sample_etype_neighbors({c[2]: seeds}, {c: -1}, seed=1)[c]
    return set(zip(s.tolist(), d.tolist(), e.tolist(), strict=True))


def _check(g: DistGraph, model: Edges, added: Added) -> None:
    for c, edges in model.items():
        want = {(s, d, e) for e, (s, d) in edges.items()}
        assert _every_edge(g, c, added) == want, c
        new = np.array([e for e in edges if e >= g.num_edges(c)])
        s, d = g.find_edges(new, etype=c)
        assert list(zip(s.tolist(), d.tolist(), strict=True)) == [edges[e] for e in new.tolist()]


@pytest.fixture
def graphs(acm_parts: Path, tmp_path: Path) -> Iterator[tuple[list[DistGraph], Any]]:
    group = start_servers(acm_parts, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"])
    clients = [
        Client.standalone(acm_parts),
        Client.connect(group.addresses),  # co-located: shared memory
        Client.connect(group.addresses, use_shared_memory=False),
    ]
    try:
        yield [DistGraph("acm", client=c) for c in clients], group
    finally:
        for c in clients:
            c.close()
        group.stop()


@pytest.mark.timeout(240)
def test_acm_served_equals_standalone_after_the_same_typed_updates(
    graphs: tuple[list[DistGraph], Any],
) -> None:
    (alone, shm, sock), _ = graphs
    alone_model, served_model = _model(alone), _model(sock)
    assert alone_model == served_model
    alone_added: Added = {}
    served_added: Added = {}
    _update(alone, alone_model, alone_added, np.random.default_rng(7))
    _update(shm, served_model, served_added, np.random.default_rng(7))
    assert alone_model == served_model  # the same per-type IDs, new nodes and edges
    assert alone_added == served_added
    for g in (alone, shm, sock):
        _check(g, served_model, served_added)
    seeds = {
        "paper": np.concatenate([np.arange(0, 4019, 3), served_added["paper"]]),
        "author": np.concatenate([np.arange(0, 7167, 5), served_added["author"]]),
    }
    want = alone.sample_etype_neighbors(seeds, 2, seed=5)
    for g in (shm, sock):
        got = g.sample_etype_neighbors(seeds, 2, seed=5)
        for c in alone.canonical_etypes:
            for a, b in zip(got[c], want[c], strict=True):
                np.testing.assert_array_equal(a.numpy(), b.numpy())
    stats = sock._client.server_stats()
    assert sum(s["overlay_nodes"] for s in stats) == 5
    new_papers = np.asarray(served_added["paper"])
    np.testing.assert_array_equal(sock.nodes["paper"].data["feat"][new_papers].numpy(), np.full((3, 16), 0.5))
    # a typed loader's seed set grows by the added papers between epochs; their rows arrive
    fan = {c: 3 for c in shm.canonical_etypes}
    loader = DistNodeDataLoader(shm, {"paper": np.arange(0, 40)}, NeighborSampler([fan, fan]), 16, seed=1)
    assert len(loader) == 3
    loader.add_seeds({"paper": new_papers})
    assert len(loader) == 3  # 43 seeds: 16 + 16 + 11
    seen, rows = [], 0
    for _inputs, seeds, blocks in loader:
        seen.extend(seeds["paper"].tolist())
        first = blocks[0]
        is_new = first.srcnodes["paper"].numpy() >= 4019  # the added papers among the inputs
        got = first.srcdata["paper"]["feat"].numpy()[is_new]
        np.testing.assert_array_equal(got, np.full((int(is_new.sum()), 16), 0.5))
        rows += int(is_new.sum())
    assert sorted(seen) == [*range(40), *sorted(new_papers.tolist())]
    assert rows >= 3  # every added paper was a seed, so an input, with its stored row
    with pytest.raises(UnknownTypeError):
        loader.add_seeds({"venue": [0]})
    # a compaction folds typed updates too: the same edges, IDs and samples after it
    for g in (alone, shm):
        g.compact()
    _update(alone, alone_model, alone_added, np.random.default_rng(8))  # typed slots go on
    _update(shm, served_model, served_added, np.random.default_rng(8))
    assert alone_model == served_model and alone_added == served_added
    for g in (alone, shm, sock):
        _check(g, served_model, served_added)
    want = alone.sample_etype_neighbors(seeds, 2, seed=6)
    got = sock.sample_etype_neighbors(seeds, 2, seed=6)
    for c in alone.canonical_etypes:
        for a, b in zip(got[c], want[c], strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.timeout(180)
def test_bad_typed_updates_are_typed_errors_and_change_nothing(graphs: tuple[list[DistGraph], Any]) -> None:
    (_, _, g), _ = graphs
    before = g._client.server_stats()
    writes = ("author", "writes", "paper")
    with pytest.raises(UnknownTypeError):
        g.add_edges([0], [0], etype=("paper", "cites", "paper"))
    with pytest.raises(UnknownTypeError):
        g.add_nodes(1, ntype="venue")
    with pytest.raises(InvalidRequestError, match="needs ntype"):
        g.add_nodes(1)
    with pytest.raises(OutOfRangeError):  # per-type ID past the base: no such added author yet
        g.add_edges([7167 + 2], [0], etype=writes)
    with pytest.raises(NodeTypeMismatchError):  # global IDs: paper 0 is no author
        paper0 = int(g.get_partition_book().map_to_homo_nid([0], "paper")[0])
        g._client.add_edges([paper0], [paper0], {"_ETYPE": np.array([1], np.int64)})
    with pytest.raises(OutOfRangeError):  # never added
        g.remove_edges([g.num_edges(writes) + 10**5], etype=writes)
    with pytest.raises(UnknownEdgeError):
        ids = g.add_edges([0], [0], etype=writes).numpy()
        g.remove_edges(ids, etype=("paper", "written-by", "author"))
    after = g._client.server_stats()
    assert sum(s["overlay_edges"] for s in after) == sum(s["overlay_edges"] for s in before) + 1
    assert sum(s["overlay_removed"] for s in after) == sum(s["overlay_removed"] for s in before)
    assert sum(s["overlay_nodes"] for s in after) == sum(s["overlay_nodes"] for s in before)


@pytest.mark.timeout(240)
def test_typed_updates_survive_kill9_with_wal(acm_parts: Path, tmp_path: Path) -> None:
    group = start_servers(
        acm_parts,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )
    client = Client.connect(group.addresses, use_shared_memory=False, reconnect_window=30.0)
    try:
        g = DistGraph("acm", client=client)
        model = _model(g)
        added: Added = {}
        rng = np.random.default_rng(11)
        _update(g, model, added, rng)
        client.snapshot()  # half the history in a snapshot, half in the log after it
        _update(g, model, added, rng)
        seeds = {"paper": np.arange(0, 4019, 4), "author": np.arange(1, 7167, 9)}
        before = g.sample_etype_neighbors(seeds, 3, seed=2)
        for index in (0, 1):
            group.kill(index)
            group.restart(index)
        _check(g, model, added)
        after = g.sample_etype_neighbors(seeds, 3, seed=2)
        for c in g.canonical_etypes:
            for a, b in zip(after[c], before[c], strict=True):
                np.testing.assert_array_equal(a.numpy(), b.numpy())
        more = g.add_nodes(1, ntype="paper", part=0).numpy()  # slots continue after the restore
        on_part0 = sum(1 for v in added["paper"] if (v - 4019) % 2 == 0)
        assert int(more[0]) == 4019 + 2 * on_part0  # N_paper + p + k * P
    finally:
        client.close()
        group.stop()
