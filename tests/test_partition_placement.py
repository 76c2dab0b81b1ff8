"""Out-of-core partitioning: each partition written where asked (``--part-dir``, on a Dask
``LocalCluster`` too), and progress bars that count bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _partition_helpers import make_graph
from test_partition_chunked import same_tree

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.reader import summarize_partitions
from asyncgraph.partition.stream import partition_chunked


@pytest.fixture(scope="module")
def cora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chunked(make_graph("cora"), tmp_path_factory.mktemp("cora"), 2, "numpy", "cora")


def test_part_dir_on_a_local_cluster(cora: Path, tmp_path: Path) -> None:
    """Part 1 goes to its own folder (the stand-in for the serving host's disk) from Dask
    workers; its bytes equal the pool run's part1 and the config points at it."""
    distributed = pytest.importorskip("distributed")
    partition_chunked(cora, 2, tmp_path / "pool", part_method="random", workers=2, memory_limit="1GiB")
    host_b = tmp_path / "hostB"
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        partition_chunked(cora, 2, tmp_path / "dask", part_method="random", dask_scheduler=client,
                          memory_limit="1GiB", part_dirs={1: host_b})  # fmt: skip
    assert not (tmp_path / "dask" / "part1").exists()
    assert sorted(x.name for x in host_b.iterdir()) == ["cora-part1"]  # no build folder left
    same_tree(tmp_path / "pool" / "part1", host_b / "cora-part1")
    same_tree(tmp_path / "pool" / "part0", tmp_path / "dask" / "part0")
    cfg = json.loads((tmp_path / "dask" / "cora.json").read_text())
    assert cfg["parts"][1]["path"] == str(host_b / "cora-part1")
    rows = summarize_partitions(tmp_path / "dask" / "cora.json")  # reads part1 from host_b
    assert sum(r["owned_nodes"] for r in rows) == 2708


def test_part_dir_bad_input_nothing_written(cora: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"part 2 is not a part ID in \[0, 2\)"):
        partition_chunked(cora, 2, tmp_path / "o", part_dirs={2: tmp_path / "x"})
    (tmp_path / "x" / "cora-part0").mkdir(parents=True)
    with pytest.raises(InvalidRequestError, match=r"cora-part0 exists; pass overwrite"):
        partition_chunked(cora, 2, tmp_path / "o", part_dirs={0: tmp_path / "x"})
    assert sorted(x.name for x in tmp_path.iterdir()) == ["x"]
    assert [x.name for x in (tmp_path / "x").iterdir()] == ["cora-part0"]
    cmd = [sys.executable, "-m", "asyncgraph.partition", "--input", str(cora), "--num-parts", "2",
           "--out", str(tmp_path / "o"), "--method", "random", "--part-dir", "1:/tmp/y"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--part-dir '1:/tmp/y': expected P=DIR" in res.stderr
    assert not (tmp_path / "o").exists()


def test_progress_bars_count_bytes(cora: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    partition_chunked(cora, 2, tmp_path / "o", part_method="random", workers=1, progress=True)
    err = capsys.readouterr().err
    for stage in ("shuffle", "sort", "node data"):
        line = [x for x in err.replace("\r", "\n").splitlines() if x.startswith(f"{stage}: 100%")][-1]
        assert "B/s" in line and "read " in line, line  # bytes, a byte rate (the ETA's basis)
