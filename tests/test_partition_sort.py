"""Out-of-core partitioning: the sort stage (packed 64-bit keys, destination-range tasks, the
external path) and the lean structure behind KaMinPar (CSR, repairs, compressed loading)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _partition_helpers import make_graph
from test_partition_chunked import same_tree

import asyncgraph.partition.tasks as tasks
from asyncgraph.partition import partition_graph
from asyncgraph.partition.chunked import load_chunked, read_metadata
from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.csc_sort import csc_block
from asyncgraph.partition.stream import partition_chunked


@pytest.mark.parametrize("n", [1 << 12, 1 << 40])  # 1 << 40: keys need > 64 bits, sub-ranges
def test_csc_block_matches_lexsort(n: int) -> None:
    rng = np.random.default_rng(3)
    k, n0, n_local = 50_000, 7, 3000
    dst = rng.integers(n0, n0 + n_local, k)
    dst[:5000] = n0 + 11  # a hub
    src = rng.integers(0, 40, k) * (n // 40)  # few sources: many duplicate (dst, src) pairs
    eid = np.sort(rng.choice(10 * k, k, replace=False))  # records arrive in edge-ID order
    rec = np.stack([dst, src, eid], axis=1).astype(np.int64)
    deg, s, e = csc_block(rec, n0, n_local, n)
    order = np.lexsort((eid, src, dst))
    assert np.array_equal(deg, np.bincount(dst - n0, minlength=n_local))
    assert np.array_equal(s, src[order]) and np.array_equal(e, eid[order])


@pytest.mark.parametrize("compact_below", [2**32, 0])  # spill records of 3 x uint32 / 3 x int64
def test_one_range_per_part_over_the_cap_sorts_externally(
    compact_below: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One destination range per part and a worker share of a few thousand edges: every group
    exceeds the cap and takes the on-disk bucket sort; the bytes equal the in-memory path's."""
    meta = write_chunked(make_graph("pubmed"), tmp_path / "in", 3, "numpy", "pubmed")
    monkeypatch.setattr(tasks, "RANGES", 1)  # inline run (workers=1): the patches apply
    monkeypatch.setattr(tasks, "COMPACT_BELOW", compact_below)
    partition_graph(load_chunked(meta), "pubmed", 2, tmp_path / "mem", part_method="random")
    buckets: list[Path] = []
    real = Path.mkdir

    def spy(self: Path, *a: object, **kw: object) -> None:
        if self.parent.name == "buckets":
            buckets.append(self)
        real(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", spy)
    partition_chunked(meta, 2, tmp_path / "st", part_method="random", workers=1, memory_limit="161MiB")
    assert {b.name for b in buckets} == {"p0.0", "p1.0"}  # both parts' single group went external
    same_tree(tmp_path / "mem", tmp_path / "st")
    g = read_metadata(meta)
    assert tasks.Ctx(g, tmp_path, 2, (0, 1, g.num_nodes["_N"])).rec_bytes == (12 if compact_below else 24)


def test_lean_symmetric_csr_equals_in_memory(tmp_path: Path) -> None:
    """KaMinPar's structure, built chunk by chunk in place, is symmetric_csr's, in-degrees too."""
    from asyncgraph.partition.assign import symmetric_csr
    from asyncgraph.partition.assign_stream import _lean_symmetric_csr
    from asyncgraph.partition.chunked import read_metadata

    graph = make_graph("pubmed")
    meta = write_chunked(graph, tmp_path / "in", 3, "numpy", "pubmed")
    in_deg = np.zeros(graph.num_nodes, dtype=np.int64)
    xadj, adj = _lean_symmetric_csr(read_metadata(meta), 7919, in_deg)  # pieces straddle duplicates
    ref_x, ref_a = symmetric_csr(graph.num_nodes, graph.src, graph.dst)
    assert np.array_equal(xadj, ref_x) and np.array_equal(adj, ref_a)
    assert np.array_equal(in_deg, np.bincount(graph.dst, minlength=graph.num_nodes))


@pytest.mark.parametrize("rows", [1, 7, 1 << 22])
def test_parhip_in_degree_order_is_the_same_graph_renumbered(tmp_path: Path, rows: int) -> None:
    """Written in ``order`` (pieces of ``rows`` entries, one long row alone in a piece), the
    file holds node ``order[i]`` as node ``i`` with every neighbour renumbered the same way."""
    from asyncgraph.partition.assign import symmetric_csr
    from asyncgraph.partition.assign_stream import write_parhip

    rng = np.random.default_rng(5)
    n = 300
    src = np.concatenate([rng.integers(0, n, 2000), np.full(40, 5, dtype=np.int64)])  # node 5: a hub
    dst = np.concatenate([rng.integers(0, n, 2000), np.arange(6, 46)])
    xadj, adj = symmetric_csr(n, src, dst)
    order = np.argsort(-np.diff(xadj), kind="stable")
    write_parhip(tmp_path / "g.parhip", xadj, adj, rows, order)
    raw = np.fromfile(tmp_path / "g.parhip", dtype=np.uint64)
    assert raw[:3].tolist() == [3, n, adj.size]
    new_x = ((raw[3 : 3 + n + 1] - np.uint64((3 + n + 1) * 8)) // np.uint64(8)).astype(np.int64)
    new_adj = raw[3 + n + 1 :].astype(np.int64)
    assert new_adj.size == adj.size and np.all(np.diff(new_x) >= 0)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    for i in (0, 1, 17, n - 1):  # rows spot-checked; the edge sets compared whole below
        v = order[i]
        assert new_adj[new_x[i] : new_x[i + 1]].tolist() == rank[adj[xadj[v] : xadj[v + 1]]].tolist()
    rows_old = np.repeat(np.arange(n), np.diff(xadj))
    rows_new = np.repeat(np.arange(n), np.diff(new_x))
    old_edges = np.sort(rank[rows_old] * n + rank[adj])
    assert np.array_equal(old_edges, np.sort(rows_new * n + new_adj))
    assert np.diff(new_x)[0] == np.diff(xadj).max()  # highest degree first


def test_own_part_neighbours_in_pieces_equals_whole() -> None:
    from asyncgraph.partition.assign import own_part_neighbours, symmetric_csr

    rng = np.random.default_rng(5)
    n = 2000
    src, dst = rng.integers(0, n, 30_000), rng.integers(0, n, 30_000)
    src[:3000] = 7  # a hub bigger than a piece
    xadj, adj = symmetric_csr(n, src, dst)
    parts = rng.integers(0, 3, n)
    rows = np.repeat(np.arange(n), np.diff(xadj))
    whole = np.bincount(rows[parts[rows] == parts[adj]], minlength=n)
    assert np.array_equal(own_part_neighbours(parts, xadj, adj, step=1000), whole)
    assert np.array_equal(own_part_neighbours(parts, xadj, adj), whole)


def test_kaminpar_compressed_when_only_that_fits(tmp_path: Path) -> None:
    """Between the compressed and the plain estimate, KaMinPar loads the structure compressed;
    below the compressed one the run is refused before writing, naming method and sizes."""
    pytest.importorskip("kaminpar")
    from asyncgraph.errors import InvalidRequestError
    from asyncgraph.partition.chunked import read_metadata
    from asyncgraph.partition.reader import summarize_partitions
    from asyncgraph.partition.stream import plan_run

    meta = write_chunked(make_graph("cora"), tmp_path / "in", 2, "numpy", "cora")
    g = read_metadata(meta)
    plain = plan_run(g, "kaminpar", 8 << 30, 1, False)
    assert not plain.compress
    squeezed = plan_run(g, "kaminpar", plain.assign_need - 1, 1, False)
    assert squeezed.compress and squeezed.assign_need < plain.assign_need
    with pytest.raises(InvalidRequestError, match=r"method 'kaminpar' needs about .* memory limit is"):
        partition_chunked(meta, 4, tmp_path / "o", part_method="kaminpar",
                          memory_limit=squeezed.assign_need - 1)  # fmt: skip
    assert not (tmp_path / "o").exists()
    partition_chunked(meta, 4, tmp_path / "o", part_method="kaminpar", workers=1,
                      memory_limit=plain.assign_need - 1)  # fmt: skip
    rows = summarize_partitions(tmp_path / "o" / "cora.json")
    cut = sum(r["remote_src_edges"] for r in rows) / sum(r["in_edges"] for r in rows)
    assert sum(r["owned_nodes"] for r in rows) == 2708 and cut < 0.3, cut
