"""``--part-worker P=ADDRESS``: every task writing partition P runs on that Dask worker only.

A real ``LocalCluster`` of two worker processes stands in for two serving hosts. The proof is
threefold: the scheduler's task stream shows every task whose key names part ``p`` ran on
``p``'s worker (and that every stage writing ``p`` has such tasks); an audit hook in this (the
client) process sees no write under the parts' folders; the bytes equal the process pool's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _partition_helpers import ROOT, make_graph
from test_partition_chunked import same_tree

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.__main__ import main
from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.stream import partition_chunked

sys.path.insert(0, str(ROOT / "examples"))
from hetero_node_classification import load_acm

distributed = pytest.importorskip("distributed")

_WATCH: list[str] = []  # folders this process must not write under while a run is watched
_SEEN: list[tuple[str, str]] = []
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Records writes (open for writing, mkdir, rename, remove, rmtree) under ``_WATCH``."""
    if not _WATCH:
        return
    paths: list[Any] = []
    if event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        ):
            paths = [args[0]]
    elif event in ("os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate"):
        paths = [args[0]]
    elif event in ("os.rename", "os.replace", "shutil.move"):
        paths = [args[0], args[1]]
    for p in paths:
        if isinstance(p, (str, bytes, os.PathLike)):
            s = os.fsdecode(p)
            if any(s.startswith(w) for w in _WATCH):
                _SEEN.append((event, s))


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Any, list[str]]]:
    """A client of a two-process LocalCluster and its worker addresses (sorted by name)."""
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as c,
        distributed.Client(c) as client,
    ):
        info = client.scheduler_info(n_workers=-1)["workers"]
        yield client, [a for a, _ in sorted(info.items(), key=lambda kv: str(kv[1]["name"]))]


@pytest.fixture(scope="module")
def cora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chunked(make_graph("cora"), tmp_path_factory.mktemp("cora"), 2, "numpy", "cora")


def _ran_on(ts: Any) -> dict[str, str]:
    """Task key -> the worker that ran it, from the scheduler's task stream."""
    return {str(r["key"]): str(r["worker"]) for r in ts.data}


def _check_pinned(ran: dict[str, str], pins: dict[int, str], stages: set[str]) -> None:
    """Every task keyed with part ``p`` ran on ``pins[p]``; each of ``stages`` had such tasks."""
    seen: dict[int, set[str]] = {p: set() for p in pins}
    for key, worker in ran.items():
        m = re.match(r"(\w+)-p(\d+)-\d+-", key)
        if m and int(m.group(2)) in pins:
            p = int(m.group(2))
            assert worker == pins[p], f"{key} ran on {worker}, not on part {p}'s worker {pins[p]}"
            seen[p].add(m.group(1))
    for p in pins:
        assert seen[p] >= stages, f"part {p}: no pinned task for {sorted(stages - seen[p])}"


def test_each_part_written_on_its_worker_same_bytes_as_pool(
    cora: Path, tmp_path: Path, cluster: tuple[Any, list[str]]
) -> None:
    client, (wa, wb) = cluster
    partition_chunked(cora, 2, tmp_path / "pool", part_method="random", workers=2, memory_limit="1GiB")
    host_a, host_b = tmp_path / "hostA", tmp_path / "hostB"
    _SEEN.clear()
    _WATCH[:] = [str(host_a), str(host_b)]
    try:
        with distributed.get_task_stream(client) as ts:
            partition_chunked(cora, 2, tmp_path / "dask", part_method="random", dask_scheduler=client,
                              memory_limit="1GiB", part_dirs={0: host_a, 1: host_b},
                              part_workers={0: wa, 1: wb})  # fmt: skip
    finally:
        _WATCH.clear()
    assert _SEEN == [], f"the client process wrote under a part's folder: {_SEEN[:5]}"
    stages = {"prepare", "sort", "node_files", "node_data", "edge_files", "edge_data", "place_parts"}
    _check_pinned(_ran_on(ts), {0: wa, 1: wb}, stages)
    same_tree(tmp_path / "pool" / "part0", host_a / "cora-part0")
    same_tree(tmp_path / "pool" / "part1", host_b / "cora-part1")
    for f in ("orig_nids.npy", "orig_eids.npy"):
        assert (tmp_path / "pool" / f).read_bytes() == (tmp_path / "dask" / f).read_bytes()
    cfg = json.loads((tmp_path / "dask" / "cora.json").read_text())
    assert [p["path"] for p in cfg["parts"]] == [str(host_a / "cora-part0"), str(host_b / "cora-part1")]
    assert sorted(x.name for x in host_a.iterdir()) == ["cora-part0"]  # no build folder left


def test_hetero_one_part_pinned_by_worker_name(tmp_path: Path, cluster: tuple[Any, list[str]]) -> None:
    """Part 1 pinned by worker *name* (``dask worker --name``), part 0 not pinned: the type
    tensors of part 1 are written on its worker too, and the output equals the pool's."""
    client, (_, wb) = cluster
    acm = write_chunked(load_acm(words=16), tmp_path / "acm", 2, "numpy", "acm")
    partition_chunked(acm, 2, tmp_path / "pool", part_method="random", workers=2, memory_limit="1GiB")
    name_b = str(client.scheduler_info(n_workers=-1)["workers"][wb]["name"])
    host_b = tmp_path / "hostB"
    _SEEN.clear()
    _WATCH[:] = [str(host_b)]
    try:
        with distributed.get_task_stream(client) as ts:
            partition_chunked(acm, 2, tmp_path / "dask", part_method="random", dask_scheduler=client,
                              memory_limit="1GiB", part_dirs={1: host_b},
                              part_workers={1: name_b})  # fmt: skip
    finally:
        _WATCH.clear()
    assert _SEEN == [], f"the client process wrote under part 1's folder: {_SEEN[:5]}"
    ran = _ran_on(ts)
    _check_pinned(ran, {1: wb}, {"prepare", "sort", "node_files", "node_data", "node_types", "edge_types"})
    # part 0 unpinned: set up in this process as before, not as tasks
    assert not [k for k in ran if re.match(r"(prepare|node_files|edge_files|node_types)-p0-", k)]
    same_tree(tmp_path / "pool" / "part1", host_b / "acm-part1")
    same_tree(tmp_path / "pool" / "part0", tmp_path / "dask" / "part0")


def test_bad_part_workers_nothing_written(
    cora: Path, tmp_path: Path, cluster: tuple[Any, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    client, (wa, _) = cluster
    out = tmp_path / "o"
    with pytest.raises(InvalidRequestError, match="--part-worker needs --dask-scheduler"):
        partition_chunked(cora, 2, out, part_workers={0: wa})
    with pytest.raises(InvalidRequestError, match=r"--part-worker 1=tcp://127\.0\.0\.1:9: not a worker"):
        partition_chunked(cora, 2, out, dask_scheduler=client, part_workers={1: "tcp://127.0.0.1:9"},
                          part_dirs={1: tmp_path / "hostB"})  # fmt: skip
    with pytest.raises(InvalidRequestError, match=r"part 2 is not a part ID in \[0, 2\)"):
        partition_chunked(cora, 2, out, dask_scheduler=client, part_workers={2: wa})
    assert list(tmp_path.iterdir()) == []
    sched = client.scheduler.address
    base = ["--input", str(cora), "--num-parts", "2", "--out", str(out), "--method", "random"]
    cases = [
        ([f"--part-worker=0={wa}"], "--part-worker needs --dask-scheduler"),
        (["--dask-scheduler", sched, f"--part-worker=2={wa}"], "part 2 is not in [0, 2)"),
        (["--dask-scheduler", sched, f"--part-worker=0={wa}", f"--part-worker=0={wa}"],
         "part 0 is given twice"),
        (["--dask-scheduler", sched, f"--part-worker={wa}"], "expected P=ADDRESS"),
        (["--dask-scheduler", sched, "--part-worker=1=nosuchworker", "--part-dir", f"1={tmp_path / 'h'}"],
         "--part-worker 1=nosuchworker: not a worker of the Dask cluster"),
    ]  # fmt: skip
    for extra, message in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)
        assert list(tmp_path.iterdir()) == [], extra


def test_resume_after_a_kill_with_pinned_parts(
    cora: Path, tmp_path: Path, cluster: tuple[Any, list[str]]
) -> None:
    """The CLI killed after the sort stage, then ``--resume``d with the same pins: the pinned
    parts' half-built folders are picked up where they are, and the bytes equal the pool's."""
    client, (wa, wb) = cluster
    partition_chunked(cora, 2, tmp_path / "pool", part_method="random", workers=2, memory_limit="1GiB")
    cmd = [sys.executable, "-m", "asyncgraph.partition", "--input", str(cora), "--num-parts", "2",
           "--out", str(tmp_path / "dask"), "--method", "random", "--memory-limit", "1GiB",
           "--dask-scheduler", client.scheduler.address, "--part-dir", f"0={tmp_path / 'hostA'}",
           "--part-dir", f"1={tmp_path / 'hostB'}", "--part-worker", f"0={wa}",
           "--part-worker", f"1={wb}"]  # fmt: skip
    env = {**os.environ, "ASYNCGRAPH_PARTITION_KILL_AFTER": "sort"}
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (tmp_path / "hostB" / ".cora-part1.work" / "indices.npy").is_file()  # left for --resume
    res = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed after assign, shuffle, sort" in res.stderr
    same_tree(tmp_path / "pool" / "part0", tmp_path / "hostA" / "cora-part0")
    same_tree(tmp_path / "pool" / "part1", tmp_path / "hostB" / "cora-part1")
