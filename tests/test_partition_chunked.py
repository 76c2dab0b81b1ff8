"""Chunked input (DGL's format) partitioned out of core: same bytes as the in-memory path,
a memory limit that holds, one-line errors for bad input, resume after a kill, the Dask path."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _partition_helpers import ROOT, categories, check_partitioning, make_graph, raw_graph

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition import partition_graph
from asyncgraph.partition.__main__ import main
from asyncgraph.partition.chunked import load_chunked, read_metadata
from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.memory import PeakSampler, parse_size
from asyncgraph.partition.reader import summarize_partitions
from asyncgraph.partition.stream import partition_chunked, plan_run

sys.path.insert(0, str(ROOT / "examples"))
from hetero_node_classification import load_acm


def same_tree(a: Path, b: Path, skip_config: bool = False) -> None:
    """Every file of ``a`` and ``b`` exists in both with the same bytes."""
    fa = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    fb = sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert fa == fb
    differ = [f for f in fa if (a / f).read_bytes() != (b / f).read_bytes()]
    if skip_config:
        differ = [f for f in differ if not f.endswith(".json")]
    assert differ == []


@pytest.fixture(scope="module")
def pubmed_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chunked(make_graph("pubmed"), tmp_path_factory.mktemp("pubmed_csv"), 3, "csv", "pubmed")


@pytest.fixture(scope="module")
def acm_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chunked(load_acm(words=16), tmp_path_factory.mktemp("acm"), 2, "numpy", "acm")


@pytest.fixture(scope="module")
def cora_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chunked(make_graph("cora"), tmp_path_factory.mktemp("cora"), 2, "numpy", "cora")


def test_reader_matches_the_graph(pubmed_csv: Path, acm_npy: Path) -> None:
    g = load_chunked(pubmed_csv)
    a = raw_graph("pubmed")
    assert np.array_equal(g.src, a["src"]) and np.array_equal(g.dst, a["dst"])
    assert np.array_equal(g.ndata["feat"], a["feat"]) and np.array_equal(g.edata["w"], a["w"])
    meta = read_metadata(acm_npy)
    assert meta.ntypes == ["author", "paper", "subject"] and len(meta.canonical_etypes) == 4


def test_homogeneous_random_csv_same_bytes_as_in_memory(pubmed_csv: Path, tmp_path: Path) -> None:
    partition_graph(load_chunked(pubmed_csv), "pubmed", 3, tmp_path / "mem", part_method="random", seed=3)
    report = partition_chunked(
        pubmed_csv, 3, tmp_path / "st", part_method="random", seed=3, workers=1, memory_limit="1GiB"
    )
    same_tree(tmp_path / "mem", tmp_path / "st")
    assert report.bytes_read > 0 and set(report.seconds) >= {"assign", "shuffle", "sort", "node data"}
    assert not list(tmp_path.glob(".st.*"))  # the work folder is gone


def test_partition_graph_takes_a_metadata_path(cora_npy: Path, tmp_path: Path) -> None:
    nids, eids = partition_graph(str(cora_npy), "cora", 2, tmp_path / "p", part_method="random",
                                 return_mapping=True)  # fmt: skip
    partition_graph(load_chunked(cora_npy), "cora", 2, tmp_path / "mem", part_method="random")
    same_tree(tmp_path / "mem", tmp_path / "p")
    assert np.array_equal(nids, np.load(tmp_path / "mem" / "orig_nids.npy")) and eids.size == 10556
    with pytest.raises(InvalidRequestError, match="balance_ntypes cannot be given with chunked input"):
        partition_graph(cora_npy, "cora", 2, tmp_path / "q", balance_ntypes=np.zeros(2708, np.int64))


def test_balance_train_same_as_cli_npz_path(pubmed_csv: Path, tmp_path: Path) -> None:
    a = raw_graph("pubmed")
    partition_graph(
        make_graph("pubmed"),
        "pubmed",
        2,
        tmp_path / "mem",
        part_method="random",
        balance_ntypes=categories(a),
    )
    partition_chunked(pubmed_csv, 2, tmp_path / "st", part_method="random", balance_train=True, workers=1)
    same_tree(tmp_path / "mem", tmp_path / "st")


def test_heterogeneous_metis_on_a_pool_same_bytes(acm_npy: Path, tmp_path: Path) -> None:
    partition_graph(load_chunked(acm_npy), "acm", 3, tmp_path / "mem", part_method="metis")
    partition_chunked(acm_npy, 3, tmp_path / "st", part_method="metis", workers=2, memory_limit="1GiB")
    same_tree(tmp_path / "mem", tmp_path / "st")


def test_tight_limit_external_sort_peak_measured(pubmed_csv: Path, tmp_path: Path) -> None:
    """A limit that leaves a worker ~1 MiB: parts are sorted in destination buckets; peak <= limit."""
    limit = "161MiB"
    plan = plan_run(read_metadata(pubmed_csv), "random", parse_size(limit), 1, False)
    assert plan.sort_edges < 88648 // 2 / 2  # each part's edges span several buckets
    partition_graph(load_chunked(pubmed_csv), "pubmed", 2, tmp_path / "mem", part_method="random")
    cmd = [
        sys.executable,
        "-m",
        "asyncgraph.partition",
        "--input",
        str(pubmed_csv),
        "--num-parts",
        "2",
        "--method",
        "random",
        "--out",
        str(tmp_path / "st"),
        "--memory-limit",
        limit,
        "--workers",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakSampler(root=proc.pid, interval=0.005) as sampler:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    same_tree(tmp_path / "mem", tmp_path / "st", skip_config=False)
    own = re.search(r"peak memory ([0-9.]+) MiB of the 161.00 MiB limit", err)
    assert own is not None, err
    assert float(own[1]) <= 161 and sampler.peak <= parse_size(limit), (own[1], sampler.peak)


def test_external_sort_on_a_pool(pubmed_csv: Path, tmp_path: Path) -> None:
    """Two workers, ~1 MiB each: every part takes the bucketed sort inside a pool worker."""
    plan = plan_run(read_metadata(pubmed_csv), "random", parse_size("226MiB"), 2, False)
    assert plan.sort_edges < 88648 // 2 / 2
    partition_graph(load_chunked(pubmed_csv), "pubmed", 2, tmp_path / "mem", part_method="random")
    partition_chunked(pubmed_csv, 2, tmp_path / "st", part_method="random", workers=2, memory_limit="226MiB")
    same_tree(tmp_path / "mem", tmp_path / "st")


def test_limit_too_small_fails_before_writing(pubmed_csv: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"method 'random'.*memory limit is 100.00 MiB"):
        partition_chunked(pubmed_csv, 2, tmp_path / "o", part_method="random", memory_limit="100MiB")
    with pytest.raises(InvalidRequestError, match=r"method 'metis' needs about .* limit is 97.00 MiB"):
        partition_chunked(pubmed_csv, 2, tmp_path / "o", part_method="metis", memory_limit="97MiB", workers=1)
    assert list(tmp_path.iterdir()) == []


def test_assignment_files_reproduce_a_partitioning(cora_npy: Path, tmp_path: Path) -> None:
    partition_chunked(cora_npy, 2, tmp_path / "rand", part_method="random", workers=1)
    orig = np.load(tmp_path / "rand" / "orig_nids.npy")
    cfgs = json.loads((tmp_path / "rand" / "cora.json").read_text())
    parts = np.empty(orig.size, dtype=np.int64)
    for p in cfgs["parts"]:
        n0, n1 = p["node_range"]
        parts[orig[n0:n1]] = p["part_id"]
    (tmp_path / "asg").mkdir()
    np.savetxt(tmp_path / "asg" / "_N.txt", parts, fmt="%d")
    partition_chunked(cora_npy, 2, tmp_path / "file", assignment=tmp_path / "asg", workers=1)
    same_tree(tmp_path / "rand", tmp_path / "file", skip_config=True)
    assert json.loads((tmp_path / "file" / "cora.json").read_text())["part_method"] == "assignment"
    np.savetxt(tmp_path / "asg" / "_N.txt", parts[:-1], fmt="%d")
    with pytest.raises(InvalidRequestError, match=r"_N.txt: holds 2707 part IDs but node type '_N' has 2708"):
        partition_chunked(cora_npy, 2, tmp_path / "bad", assignment=tmp_path / "asg", workers=1)
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("method", ["fennel", "kaminpar"])
def test_fennel_and_kaminpar_valid_balanced_lower_cut(method: str, cora_npy: Path, tmp_path: Path) -> None:
    if method == "kaminpar":
        pytest.importorskip("kaminpar")
    cuts = {}
    for m in ("random", method):
        partition_chunked(cora_npy, 4, tmp_path / m, part_method=m, workers=1, memory_limit="1GiB")
        rows = summarize_partitions(tmp_path / m / "cora.json")
        cuts[m] = sum(r["remote_src_edges"] for r in rows) / sum(r["in_edges"] for r in rows)
        sizes = np.array([r["owned_nodes"] for r in rows])
        assert sizes.max() <= np.ceil(1.03 * sizes.sum() / 4)
    out = tmp_path / method
    a = raw_graph("cora")
    check_partitioning(out / "cora.json", a, np.load(out / "orig_nids.npy"), np.load(out / "orig_eids.npy"))
    assert cuts[method] < 0.4 * cuts["random"], cuts
    assert json.loads((out / "cora.json").read_text())["part_method"] == method


# --- bad input: one line naming the file and the problem, exit 2, nothing written ---------------
def _edit(src: Path, dst: Path, fn: Any) -> Path:
    shutil.copytree(src.parent, dst)
    meta = json.loads((dst / "metadata.json").read_text())
    fn(meta, dst)
    (dst / "metadata.json").write_text(json.dumps(meta))
    return dst / "metadata.json"


def _truncate_npy(meta: dict[str, Any], d: Path) -> None:
    f = d / meta["node_data"]["_N"]["feat"]["data"][1]
    f.write_bytes(f.read_bytes()[:-100])


def _truncate_csv(meta: dict[str, Any], d: Path) -> None:
    f = d / meta["edges"]["_N:_E:_N"]["data"][0]
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:-5]))


def _out_of_range(meta: dict[str, Any], d: Path) -> None:
    f = d / meta["edges"]["_N:_E:_N"]["data"][2]
    f.write_text("19717 0\n" + "".join(f.read_text().splitlines(keepends=True)[1:]))  # first line replaced


def _wrong_rows(meta: dict[str, Any], d: Path) -> None:
    f = d / meta["node_data"]["_N"]["label"]["data"][0]
    np.save(f, np.load(f)[:-1])


def _wrong_dtype(meta: dict[str, Any], d: Path) -> None:
    f = d / meta["node_data"]["_N"]["feat"]["data"][0]
    np.save(f, np.load(f).astype(np.float64))


BAD: dict[str, tuple[Any, str]] = {
    "missing chunk": (
        lambda m, d: (d / m["edges"]["_N:_E:_N"]["data"][1]).unlink(),
        r"_N-_E-_N-1.csv: missing chunk file",
    ),
    "truncated npy": (_truncate_npy, r"feat-1.npy: truncated"),
    "truncated csv": (_truncate_csv, r"_N-_E-_N-0.csv: holds \d+ lines but metadata.json says \d+"),
    "counts disagree": (
        lambda m, d: m["num_nodes_per_chunk"][0].__setitem__(0, 10),
        r"feat-2.npy: node_data _N/feat: chunks hold 19717 rows, the type has 13154",
    ),
    "id out of range": (_out_of_range, r"_N-_E-_N-2.csv: source \(_N\) ID 19717 is outside \[0, 19717\)"),
    "wrong row count": (_wrong_rows, r"label: chunks hold 19716 rows, the type has 19717"),
    "wrong dtype": (_wrong_dtype, r"feat: chunks disagree in dtype or row shape"),
    "unknown format": (
        lambda m, d: m["edges"]["_N:_E:_N"]["format"].__setitem__("name", "hdf5"),
        r"unknown format 'hdf5'",
    ),
    "npy called parquet": (
        lambda m, d: m["node_data"]["_N"]["feat"]["format"].__setitem__("name", "parquet"),
        r"feat-0\.npy: not a readable parquet file \(ArrowInvalid in its footer\)",
    ),
    "not json": (lambda m, d: m.clear(), r"missing key 'node_type'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_one_line_exit_2_nothing_written(
    case: str, pubmed_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, pattern = BAD[case]
    meta = _edit(pubmed_csv, tmp_path / "in", edit)
    rc = main(
        [
            "--input",
            str(meta),
            "--num-parts",
            "2",
            "--method",
            "random",
            "--out",
            str(tmp_path / "o"),
            "--workers",
            "1",
            "--memory-limit",
            "1GiB",
        ]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    err = [x for x in lines if "error" in x]  # the rest: progress bars of the stages that ran
    assert len(err) == 1 and err[0] == lines[-1] and re.search(pattern, err[0]), lines
    assert err[0].startswith("python -m asyncgraph.partition: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no output, no work folder


@pytest.mark.parametrize(
    ("stage", "skipped"), [("sort", "assign, shuffle, sort"), ("shuffle", "assign, shuffle")]
)
def test_resume_after_kill(stage: str, skipped: str, cora_npy: Path, tmp_path: Path) -> None:
    """Killed right after a stage: --resume skips what was done; the output equals a fresh run's."""
    cmd = [
        sys.executable,
        "-m",
        "asyncgraph.partition",
        "--input",
        str(cora_npy),
        "--num-parts",
        "2",
        "--method",
        "random",
        "--out",
        str(tmp_path / "o"),
        "--workers",
        "1",
        "--memory-limit",
        "1GiB",
    ]
    env = {**os.environ, "ASYNCGRAPH_PARTITION_KILL_AFTER": stage}
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    assert not (tmp_path / "o").exists() and (tmp_path / ".o.work").is_dir()
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"resumed after {skipped}\n" in done.stderr
    assert "assign: done by an earlier run, skipped" in done.stderr
    partition_chunked(cora_npy, 2, tmp_path / "fresh", part_method="random", workers=1)
    same_tree(tmp_path / "o", tmp_path / "fresh", skip_config=False)
    assert not (tmp_path / ".o.work").exists()


def test_dask_local_cluster_same_as_pool(cora_npy: Path, tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    partition_chunked(cora_npy, 2, tmp_path / "pool", part_method="random", workers=2, memory_limit="1GiB")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        partition_chunked(
            cora_npy, 2, tmp_path / "dask", part_method="random", dask_scheduler=client, memory_limit="1GiB"
        )
    same_tree(tmp_path / "pool", tmp_path / "dask")
