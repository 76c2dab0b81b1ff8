"""DGL's chunked input as DGL's own tools take it (issue 33, DGL users): ``--input DIR``,
``--assignment`` checked against its ``partition_meta.json``, the Dask run's peak with its
workers. Real CLI runs in ``tmp_path``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _partition_helpers import make_graph

from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.testing import subprocess_env

PROG = "python -m asyncgraph.partition: error: "


@pytest.fixture(scope="module")
def cora_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chunked(make_graph("cora"), tmp_path_factory.mktemp("cora"), 2, "numpy", "cora")


def cli(src: Path, out: Path, *extra: str, parts: int = 2) -> subprocess.CompletedProcess[str]:
    argv = ["--input", str(src), "--num-parts", str(parts), "--out", str(out), "--memory-limit", "1GiB",
            *extra]  # fmt: skip
    return subprocess.run([sys.executable, "-m", "asyncgraph.partition", *argv], capture_output=True,
                          text=True, timeout=180, env=subprocess_env(), check=False)  # fmt: skip


def one_error(res: subprocess.CompletedProcess[str], pattern: str) -> None:
    lines = res.stderr.strip().splitlines()
    errors = [x for x in lines if "error" in x]
    assert res.returncode == 2, res.stderr
    assert len(errors) == 1 and errors[0] == lines[-1] and errors[0].startswith(PROG), lines
    assert re.search(pattern, errors[0]), errors[0]


def same_tree(a: Path, b: Path) -> None:
    fa = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert fa == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert [f for f in fa if (a / f).read_bytes() != (b / f).read_bytes()] == []


def test_input_dir_is_the_chunked_folder(cora_npy: Path, tmp_path: Path) -> None:
    """``--input DIR`` (DGL's tools take the folder) reads ``DIR/metadata.json``: the same bytes."""
    common = ("--method", "random", "--workers", "1")
    by_file = cli(cora_npy, tmp_path / "file", *common)
    by_dir = cli(cora_npy.parent, tmp_path / "dir", *common)
    assert by_file.returncode == 0 and by_dir.returncode == 0, by_dir.stderr
    same_tree(tmp_path / "file", tmp_path / "dir")
    (tmp_path / "empty").mkdir()
    res = cli(tmp_path / "empty", tmp_path / "o", *common)
    one_error(res, r"--input .*empty is a folder without metadata\.json")
    assert not (tmp_path / "o").exists()


def _assignment(folder: Path, num_nodes: int, k: int, meta: dict[str, object] | None) -> Path:
    folder.mkdir()
    np.savetxt(folder / "_N.txt", np.arange(num_nodes) % k, fmt="%d")
    if meta is not None:
        (folder / "partition_meta.json").write_text(json.dumps(meta))
    return folder


def test_num_parts_checked_against_partition_meta(cora_npy: Path, tmp_path: Path) -> None:
    """A 2-way assignment (DGL's random_partition.py writes ``partition_meta.json``) with
    ``--num-parts 4`` is one error line, exit 2, nothing written (before: 2 empty partitions)."""
    meta = {"version": "1.0.0", "num_parts": 2, "algo_name": "random"}
    asg = _assignment(tmp_path / "asg", 2708, 2, meta)
    one_error(cli(cora_npy, tmp_path / "o", "--assignment", str(asg), "--workers", "1", parts=4),
              r"partition_meta\.json says num_parts 2 but --num-parts is 4")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["asg"]
    ok = cli(cora_npy, tmp_path / "o", "--assignment", str(asg), "--workers", "1", parts=2)
    assert ok.returncode == 0, ok.stderr
    (asg / "partition_meta.json").write_text('{"num_parts": "two"}')
    one_error(cli(cora_npy, tmp_path / "o2", "--assignment", str(asg), "--workers", "1"),
              r"partition_meta\.json: num_parts is not a positive integer")  # fmt: skip


def test_assignment_without_meta_using_fewer_parts_is_refused(cora_npy: Path, tmp_path: Path) -> None:
    """No ``partition_meta.json`` (ParMETIS' output): part IDs that stop short of ``--num-parts``
    would leave the last parts empty; refused, naming both counts."""
    asg = _assignment(tmp_path / "asg", 2708, 2, None)
    one_error(cli(cora_npy, tmp_path / "o", "--assignment", str(asg), "--workers", "1", parts=4),
              r"part IDs 0\.\.1 \(2 parts\) but --num-parts is 4")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["asg"]


def test_dask_peak_includes_the_workers(cora_npy: Path, tmp_path: Path) -> None:
    """The printed peak of a ``--dask-scheduler`` run adds each Dask worker's sampled peak."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cluster:  # fmt: skip
        address = cluster.scheduler_address
        res = cli(cora_npy, tmp_path / "o", "--method", "random", "--dask-scheduler", address)
    assert res.returncode == 0, res.stderr
    m = re.search(r"peak memory ([0-9.]+) (MiB|GiB) \(this process ([0-9.]+) MiB \+ 2 Dask workers "
                  r"([0-9.]+) MiB\)", res.stderr)  # fmt: skip
    assert m, res.stderr
    total = float(m[1]) * (1024 if m[2] == "GiB" else 1)
    main, workers = float(m[3]), float(m[4])
    assert workers > 2 * 30  # two Python processes with numpy and distributed loaded
    assert abs(total - (main + workers)) < 0.02


# --- per-type ID maps (item 4) ------------------------------------------------------------------
@pytest.fixture(scope="module")
def acm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """ACM (3 node types, 4 edge types) as chunked input partitioned 2 ways; ``(graph, config)``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from hetero_node_classification import load_acm

    from asyncgraph.partition.stream import partition_chunked

    g = load_acm(words=16)
    root = tmp_path_factory.mktemp("acm")
    meta = write_chunked(g, root / "in", 2, "numpy", "acm")
    partition_chunked(meta, 2, root / "out", part_method="random", workers=1)
    return g, root / "out" / "acm.json"


def test_per_type_orig_ids_of_a_heterogeneous_chunked_graph(acm: tuple[Any, Path]) -> None:
    """``load_orig_ids(cfg, per_type=True)``: ``{ntype: ids}`` and ``{canonical etype: ids}`` where
    ``ids[new per-type ID] == input per-type ID``, checked against the served rows and edges."""
    from asyncgraph.names import ETYPE, TYPE_EID
    from asyncgraph.partition import load_orig_ids, load_partition

    g, cfg = acm
    nmap, emap = load_orig_ids(cfg, per_type=True)
    assert list(nmap) == ["author", "paper", "subject"]  # the homogeneous order: types sorted
    assert list(emap) == g.canonical_etypes
    for t, ids in nmap.items():
        assert ids.dtype == np.int64 and np.array_equal(np.sort(ids), np.arange(g.num_nodes(t)))
    parts = [load_partition(cfg, p) for p in range(2)]
    nt = list(nmap)
    for t in nt:  # a type's served rows (stored per type) in new-ID order are the input rows of nmap[t]
        served = np.concatenate([np.asarray(p.node_feats[f"{t}/feat"]) for p in parts])
        assert np.array_equal(served, g.nodes[t].data["feat"][nmap[t]])
    homo_n, _ = load_orig_ids(cfg)
    noff = np.cumsum([0] + [g.num_nodes(t) for t in nt])
    for p in parts:
        indptr = np.asarray(p.indptr)
        dst = p.node_range[0] + np.repeat(np.arange(p.num_owned_nodes), np.diff(indptr))
        src = np.asarray(p.indices)
        et, rank = np.asarray(p.edge_feats[ETYPE]), np.asarray(p.edge_feats[TYPE_EID])
        for r, c in enumerate(emap):
            sel = et == r
            want_src, want_dst = g.edges(etype=c)
            orig = emap[c][rank[sel]]
            assert np.array_equal(homo_n[src[sel]] - noff[nt.index(c[0])], want_src[orig])
            assert np.array_equal(homo_n[dst[sel]] - noff[nt.index(c[2])], want_dst[orig])
    for c, ids in emap.items():
        assert np.array_equal(np.sort(ids), np.arange(g.num_edges(c)))


def test_per_type_orig_ids_homogeneous_and_default_unchanged(cora_npy: Path, tmp_path: Path) -> None:
    from asyncgraph.partition import load_orig_ids
    from asyncgraph.partition.stream import partition_chunked

    partition_chunked(cora_npy, 2, tmp_path / "o", part_method="random", workers=1)
    nids, eids = load_orig_ids(tmp_path / "o" / "cora.json")
    assert isinstance(nids, np.ndarray) and nids.shape == (2708,)
    nmap, emap = load_orig_ids(tmp_path / "o" / "cora.json", per_type=True)
    assert list(nmap) == ["_N"] and list(emap) == [("_N", "_E", "_N")]
    assert np.array_equal(nmap["_N"], nids) and np.array_equal(emap[("_N", "_E", "_N")], eids)


# --- DGL's partition format: recognised, refused in one line (item 3) ---------------------------
def _dgl_partition(folder: Path) -> Path:
    """A DGL partition config as ``dgl.distributed.partition_graph`` writes it (2 parts of cora)."""
    folder.mkdir()
    doc: dict[str, Any] = {
        "graph_name": "cora", "num_nodes": 2708, "num_edges": 10556, "part_method": "metis",
        "num_parts": 2, "halo_hops": 1, "node_map": {"_N": [[0, 1354], [1354, 2708]]},
        "edge_map": {"_N:_E:_N": [[0, 5278], [5278, 10556]]}, "ntypes": {"_N": 0},
        "etypes": {"_N:_E:_N": 0},
    }  # fmt: skip
    for p in range(2):
        doc[f"part-{p}"] = {"node_feats": f"part{p}/node_feat.dgl", "edge_feats": f"part{p}/edge_feat.dgl",
                            "part_graph": f"part{p}/graph.dgl"}  # fmt: skip
        (folder / f"part{p}").mkdir()
    (folder / "metadata.json").write_text(json.dumps(doc, indent=4))
    return folder / "metadata.json"


DGL_LINE = r"is a DGL partition \(dgl\.distributed\.partition_graph output\); asyncgraph cannot serve it: "


def test_dgl_partition_config_is_named_in_one_typed_line(tmp_path: Path) -> None:
    """``load_partition``, the partition book, the server, the launcher and the partitioner's
    ``--input`` each say in one line that this is DGL's partition format and what to run instead
    (before: a pydantic dump)."""
    from asyncgraph.errors import ForeignPartitionError
    from asyncgraph.partition import load_partition, load_partition_book

    meta = _dgl_partition(tmp_path / "dglparts")
    for call in (lambda: load_partition(meta, 0), lambda: load_partition_book(meta, 0)):
        with pytest.raises(ForeignPartitionError, match=DGL_LINE + r".*python -m asyncgraph\.partition"):
            call()
    runs = {
        "asyncgraph.server": ["--part-config", str(meta), "--part-id", "0"],
        "asyncgraph.launch": ["--part-config", str(meta), "--num-trainers", "1", "--", "python", "-c", "0"],
        "asyncgraph.partition": ["--input", str(meta), "--num-parts", "2", "--out", str(tmp_path / "o")],
    }
    for module, argv in runs.items():
        res = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                             timeout=60, env=subprocess_env(), check=False)  # fmt: skip
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, (module, res.stderr)
        assert re.search(DGL_LINE, lines[0]) and "validation error" not in lines[0], (module, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dglparts"]
