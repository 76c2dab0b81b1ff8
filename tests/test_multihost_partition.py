"""``--part-worker`` across two hosts made from namespaces (tests/nethosts.py) that share no data
folder: each partition is written onto the private disk of the host whose worker it is pinned to.

Host 1 runs the Dask scheduler, worker ``hostA`` and the partitioner's CLI; host 2 runs worker
``hostB``. The input and the output's JSON live in the shared working area (as on NFS);
``data_dir`` is a different folder on each host, so ``--part-dir 1=<data_dir>/p`` exists only on
host 2: the run can only succeed if every task writing part 1 (its folders and preallocated
files included) runs there. Skipped where these hosts cannot be made (not root, no ``ip``/``sshd``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _partition_helpers import make_graph
from nethosts import NetHosts, skip_reason
from test_partition_chunked import same_tree

from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.stream import partition_chunked

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


class Logged:
    """A process started on a host, its stderr collected line by line (Dask logs there)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace"))

    def wait_for(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in x for x in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} from {self.proc.args}: {''.join(self.lines)[-2000:]}")
            time.sleep(0.05)


@pytest.fixture
def apart() -> Iterator[NetHosts]:
    """Two hosts without a shared data folder; what the test started there is killed (by PID)."""
    with NetHosts(2, private_data=True) as nh:
        try:
            yield nh
        finally:
            for host in nh.hosts:
                for proc in host.started:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(timeout=10)


def test_each_part_on_its_hosts_private_disk(apart: NetHosts, tmp_path: Path) -> None:
    meta = write_chunked(make_graph("cora"), tmp_path / "in", 2, "numpy", "cora")
    partition_chunked(meta, 2, tmp_path / "pool", part_method="random", workers=2, memory_limit="1GiB")
    sched_file = tmp_path / "scheduler.json"
    a, b = apart[0], apart[1]
    py = [sys.executable, "-m"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "cwd": ROOT}
    sched = Logged(a.popen([*py, "distributed.cli.dask_scheduler", "--host", a.addr, "--port", "0",
                            "--no-dashboard", "--scheduler-file", str(sched_file)], **quiet))  # fmt: skip
    sched.wait_for("Scheduler at:")
    workers = []
    for host, name in ((a, "hostA"), (b, "hostB")):
        scratch = tmp_path / f"scratch-{name}"
        argv = [*py, "distributed.cli.dask_worker", "--scheduler-file", str(sched_file), "--name", name,
                "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", host.addr,
                "--local-directory", str(scratch)]  # fmt: skip
        workers.append(Logged(host.popen(argv, **quiet)))
    for w in workers:
        w.wait_for("Registered to:")
    addr = json.loads(sched_file.read_text())["address"]
    disk = apart.data_dir / "p"  # the same path on both hosts, a different folder on each
    res = a.run([*py, "asyncgraph.partition", "--input", str(meta), "--num-parts", "2", "--method", "random",
                 "--out", str(tmp_path / "dask"), "--memory-limit", "1GiB", "--dask-scheduler", addr,
                 "--part-dir", f"0={disk}", "--part-dir", f"1={disk}",
                 "--part-worker", "0=hostA", "--part-worker", "1=hostB"], timeout=120, cwd=ROOT)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "total        2,708" in res.stdout  # the summary: part 1 read on host 2, where it is
    on_a, on_b = a.dir / "data" / "p", b.dir / "data" / "p"  # each host's private folder, seen from here
    assert sorted(x.name for x in on_a.iterdir()) == ["cora-part0"]
    assert sorted(x.name for x in on_b.iterdir()) == ["cora-part1"]
    same_tree(tmp_path / "pool" / "part0", on_a / "cora-part0")
    same_tree(tmp_path / "pool" / "part1", on_b / "cora-part1")
    cfg = json.loads((tmp_path / "dask" / "cora.json").read_text())
    assert [p["path"] for p in cfg["parts"]] == [str(disk / "cora-part0"), str(disk / "cora-part1")]
