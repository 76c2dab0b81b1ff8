"""Failures that only exist between hosts (tests/nethosts.py): the servers' host loses its link
(``ip link set ... down`` on its bridge port, so neither side sees a FIN or RST) while a client
on the other host pulls or pushes. Cora, 2 partitions, both served from host 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nethosts import NetHosts, skip_reason

from asyncgraph.launch.processes import server_argv, wait_ready_files

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "workers" / "link_faults.py"

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


class Served:
    def __init__(self, nh: NetHosts, addresses: list[tuple[str, int]], secret_file: Path) -> None:
        self.nh = nh
        self.servers = ",".join(f"{h}:{p}" for h, p in addresses)
        self.secret_file = secret_file


@pytest.fixture(scope="module")
def served(cora2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:  # type: ignore[no-untyped-def]
    work = tmp_path_factory.mktemp("link")
    secret = work / "secret"
    secret.write_text(os.urandom(16).hex())
    with NetHosts(2) as nh:
        procs, ready = [], []
        for part in range(2):
            ready.append(work / f"ready{part}.json")
            argv = server_argv(cora2.part_config, part, ready[-1], host=nh[1].addr, num_clients=1,
                               secret_file=secret, extra_args=["--log-level", "WARNING"])  # fmt: skip
            procs.append(nh[1].popen(argv, cwd=ROOT))
        addresses = wait_ready_files(procs, ready, 60)
        yield Served(nh, addresses, secret)


class Worker:
    """``tests/workers/link_faults.py`` on host 1."""

    def __init__(self, served: Served, *args: str) -> None:
        argv = [sys.executable, str(WORKER), args[0], served.servers, str(served.secret_file), *args[1:]]
        self.proc = served.nh[0].popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
        assert self.read() == {"connected": True}

    def read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"worker ended with status {self.proc.wait()}"
        return json.loads(line)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def result(self, limit: float) -> Any:
        out = self.read()
        assert self.proc.wait(timeout=limit) == 0
        return out


def test_link_down_gives_a_typed_error_within_the_call_timeout(served: Served) -> None:
    worker = Worker(served, "timeout", "1.0")
    served.nh.link(1, up=False)
    try:
        worker.go()
        out = worker.result(30)
    finally:
        served.nh.link(1, up=True)
    assert out["error"] == "RequestTimeoutError", out
    assert 0.9 < out["elapsed"] < 2.5, out
    assert served.nh[1].addr in out["message"]


def test_short_outage_is_ridden_through_without_an_error(served: Served) -> None:
    """A 2 s outage under a 10 s call timeout: TCP retransmits; every push lands, none fails."""
    worker = Worker(served, "storm", "10", "4")
    worker.go()
    time.sleep(0.5)
    served.nh.link(1, up=False)
    time.sleep(2)
    served.nh.link(1, up=True)
    out = worker.result(60)
    assert out["failed_calls"] == 0 and out["lost_rows"] == 0 and out["unexplained_rows"] == 0, out
    assert out["max_call_s"] > 1.5, out  # the outage was felt, and ridden through
    assert out["acked"] > 0


def test_network_partition_heals_and_no_acknowledged_push_is_lost(served: Served) -> None:
    """A 3 s partition under a 0.5 s call timeout: calls fail with typed errors while it lasts,
    work again once it heals, and every acknowledged push-add is in the tensor afterwards."""
    worker = Worker(served, "storm", "0.5", "6")
    worker.go()
    time.sleep(0.5)
    served.nh.link(1, up=False)
    time.sleep(3)
    served.nh.link(1, up=True)
    out = worker.result(60)
    assert out["failed_calls"] > 0 and set(out["errors"]) <= {
        "RequestTimeoutError",
        "ServerUnavailableError",
    }, out
    assert out["lost_rows"] == 0 and out["unexplained_rows"] == 0, out
    assert out["acked"] > 0


def test_large_pull_goes_in_chunks_across_hosts(served: Served) -> None:
    """Across hosts a pull over twice ``chunk_bytes`` is split into pipelined chunks (issue 24:
    the wire is not idle while a reply is gathered and assembled); the rows are the same as one
    request per owner gives. Over loopback it is not (``tests/test_pull_path.py``)."""
    worker = Worker(served, "chunks", "30")
    worker.go()
    out = worker.result(60)
    assert out["same_host"] == [False, False], out
    assert out["equal"], out
    rows_per_chunk = (1 << 20) // out["row_bytes"]
    # 5,416 rows split over 2 owners, each owner's share in chunks of 182 rows
    assert out["requests"][0] >= 2 * 5416 // (2 * rows_per_chunk), out
    assert out["requests"][1] == 2, out
