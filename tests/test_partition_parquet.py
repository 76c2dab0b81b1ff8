"""Parquet chunks in DGL's chunked layout (issue 33, item 1): edges and node/edge data written
as DGL's array parser writes them (a column per element, the shape in the schema metadata; one
vector a row; multi-row-group files), partitioned by the CLI: the same bytes as the numpy-chunk run.
"""

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

from asyncgraph.partition.chunked import iter_edges, read_metadata, read_rows
from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.graph import Graph
from asyncgraph.testing import subprocess_env

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROW_GROUP = 300  # rows per row group: every chunk has several, and reads cross their bounds


def write_dgl_parquet(
    arr: np.ndarray[Any, Any],
    path: Path,
    vector: bool = False,
    shape: bool = True,
    row_group: int = ROW_GROUP,
) -> None:
    """An array as DGL's ``ParquetArrayParser.write`` lays it out (``vector``: one list a row)."""
    rows = arr.shape[0]
    flat = arr.reshape(rows, -1) if arr.ndim > 1 else arr.reshape(rows, 1)
    if vector:
        table = pa.table([pa.array(flat.tolist(), type=pa.list_(pa.from_numpy_dtype(arr.dtype)))],
                         names=["vector"])  # fmt: skip
    else:  # pandas.DataFrame(arr): columns "0", "1", ...
        table = pa.table({str(i): flat[:, i] for i in range(flat.shape[1])})
        if shape:
            table = table.replace_schema_metadata({"shape": str(arr.shape)})
    pq.write_table(table, path, row_group_size=row_group)


def to_parquet(meta: Path, out: Path, vector: set[str] = frozenset(), bare: set[str] = frozenset(),
               row_group: int = ROW_GROUP) -> Path:  # fmt: skip
    """A copy of a numpy-chunked graph with every chunk (edges included) in DGL's parquet layout."""
    doc = json.loads(meta.read_text())
    out.mkdir()

    def convert(spec: dict[str, Any], name: str) -> None:
        files = []
        for i, f in enumerate(spec["data"]):
            arr = np.load(meta.parent / f)
            dst = out / f"{name.replace(':', '_').replace('/', '_')}-{i}.parquet"
            write_dgl_parquet(arr, dst, vector=name in vector, shape=name not in bare, row_group=row_group)
            files.append(dst.name)
        spec["format"], spec["data"] = {"name": "parquet"}, files

    for e, spec in doc["edges"].items():
        convert(spec, f"edges/{e}")
    for section in ("node_data", "edge_data"):
        for feats in (doc.get(section) or {}).values():
            for name, spec in feats.items():
                convert(spec, name)
    (out / "metadata.json").write_text(json.dumps(doc))
    return out / "metadata.json"


def cli(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    argv = ["--input", str(src), "--num-parts", "2", "--method", "random", "--out", str(out),
            "--workers", "2", "--memory-limit", "1GiB"]  # fmt: skip
    return subprocess.run([sys.executable, "-m", "asyncgraph.partition", *argv], capture_output=True,
                          text=True, timeout=180, env=subprocess_env(), check=False)  # fmt: skip


def same_tree(a: Path, b: Path) -> None:
    fa = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert fa == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert [f for f in fa if (a / f).read_bytes() != (b / f).read_bytes()] == []


def _cora_plus() -> Graph:
    """Cora with a 3-d node tensor (DGL writes it reshaped, its shape in the metadata)."""
    g = make_graph("cora")
    rng = np.random.default_rng(0)
    g.ndata["cube"] = rng.standard_normal((g.num_nodes, 2, 3)).astype(np.float32)
    g.ndata["emb"] = rng.standard_normal((g.num_nodes, 5)).astype(np.float64)
    return g


def test_parquet_chunks_in_dgl_layout_same_bytes_as_numpy(tmp_path: Path) -> None:
    """Edges, 1-d labels and masks, a 2-d feature, a 3-d tensor, a vector-per-row tensor, a tensor
    without shape metadata and an edge tensor, all parquet: the parts equal the numpy run's."""
    meta = write_chunked(_cora_plus(), tmp_path / "npy", 3, "numpy", "cora")
    pmeta = to_parquet(meta, tmp_path / "pq", vector={"emb"}, bare={"feat"})
    by_npy, by_pq = cli(meta, tmp_path / "o_npy"), cli(pmeta.parent, tmp_path / "o_pq")
    assert by_npy.returncode == 0, by_npy.stderr
    assert by_pq.returncode == 0, by_pq.stderr
    same_tree(tmp_path / "o_npy", tmp_path / "o_pq")


def test_parquet_reads_cross_row_groups_in_bounded_batches(tmp_path: Path) -> None:
    """Ranges that start and end inside row groups, read in blocks smaller than a row group."""
    meta = write_chunked(_cora_plus(), tmp_path / "npy", 2, "numpy", "cora")
    g_npy, g_pq = read_metadata(meta), read_metadata(to_parquet(meta, tmp_path / "pq", vector={"emb"}))
    for name in ("cube", "emb", "label"):
        a, b = g_npy.node_data["_N"][name][1], g_pq.node_data["_N"][name][1]
        assert (b.fmt, b.dtype, b.row_shape, b.rows) == ("parquet", a.dtype, a.row_shape, a.rows)
        for lo, hi in ((0, a.rows), (17, 611), (299, 301), (a.rows - 1, a.rows)):
            assert np.array_equal(read_rows(a, lo, hi), read_rows(b, lo, hi)), (name, lo, hi)
    c = g_npy.canonical_etypes[0]
    ea, eb = g_npy.edges[c][0], g_pq.edges[c][0]
    blocks = list(iter_edges(eb, 250, 1234, 100, "e"))
    assert all(x.shape[0] <= 100 and x.dtype == np.int64 for _, x in blocks)
    assert blocks[0][0] == 250
    assert np.array_equal(np.concatenate([x for _, x in blocks]),
                          np.concatenate([x for _, x in iter_edges(ea, 250, 1234, 1000, "e")]))  # fmt: skip


def test_parquet_without_pyarrow_is_one_error_line(tmp_path: Path) -> None:
    meta = write_chunked(make_graph("cora"), tmp_path / "npy", 2, "numpy", "cora")
    pmeta = to_parquet(meta, tmp_path / "pq")
    argv = ["--input", str(pmeta), "--num-parts", "2", "--out", str(tmp_path / "o")]
    script = ("import sys; sys.modules['pyarrow'] = None\n"
              f"from asyncgraph.partition.__main__ import main\nsys.exit(main({argv!r}))")  # fmt: skip
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env=subprocess_env(), check=False)  # fmt: skip
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "needs pyarrow: pip install 'asyncgraph[parquet]'" in lines[0] and ".parquet" in lines[0]
    assert not (tmp_path / "o").exists()


def test_bad_parquet_chunks_are_one_error_line(tmp_path: Path) -> None:
    """Strings, mixed column types, a wrong shape in the metadata, a 3-column edge chunk."""
    meta = write_chunked(make_graph("cora"), tmp_path / "npy", 1, "numpy", "cora")
    cases = {
        "strings": (pa.table({"0": pa.array(["x"] * 2708)}), r"not numeric"),
        "mixed": (pa.table({"0": np.zeros(2708, np.float32), "1": np.zeros(2708, np.int64)}),
                  r"different types"),
        "shape": (pa.table({"0": np.zeros(2708)}).replace_schema_metadata({"shape": "(2708, 4)"}),
                  r"'shape' metadata \(2708, 4\) does not match"),
    }  # fmt: skip
    for case, (table, pattern) in cases.items():
        pmeta = to_parquet(meta, tmp_path / case)
        doc = json.loads(pmeta.read_text())
        pq.write_table(table, pmeta.parent / doc["node_data"]["_N"]["label"]["data"][0])
        res = cli(pmeta, tmp_path / f"o_{case}")
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, (case, res.stderr)
        assert ".parquet" in lines[0] and re.search(pattern, lines[0]), (case, lines[0])


def test_the_memory_plan_counts_the_parquet_reader(tmp_path: Path) -> None:
    """A wide table in one big row group: its reader's pages (~1.7 MiB a column here, 64 columns)
    are counted, so a limit that fits the numpy chunks refuses the parquet ones before any read."""
    from asyncgraph.errors import InvalidRequestError
    from asyncgraph.partition.stream_plan import parquet_reader_bytes, plan_run

    n = 200_000
    feat = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)
    g = Graph(n, np.arange(10), np.arange(10), {"feat": feat})
    meta = write_chunked(g, tmp_path / "npy", 1, "numpy", "wide")
    parquet = read_metadata(to_parquet(meta, tmp_path / "pq", row_group=n))
    assert 64 * (1 << 20) < parquet_reader_bytes(parquet) < 64 * (2 << 20)
    plan_run(read_metadata(meta), "random", 200 << 20, 1, False)
    with pytest.raises(InvalidRequestError, match=r"raise --memory-limit or lower --workers"):
        plan_run(parquet, "random", 200 << 20, 1, False)
