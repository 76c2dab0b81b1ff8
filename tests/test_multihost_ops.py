"""Real cluster software against namespace hosts (tests/nethosts.py): Prometheus scraping every
server across hosts with ``ops/prometheus/prometheus.yml``; Slurm (``slurmctld``, one ``slurmd``
per host, ``munged``) running ``ops/slurm/asyncgraph.sbatch`` on two nodes. Each skips with its
reason where root, ``ip`` or the Debian packages (``ops/ci/system-deps.sh``) are missing.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nethosts import NetHosts, SlurmCluster, skip_reason, slurm_skip_reason
from test_multihost import TRAIN, Launched, launch_argv, wait_no_leftovers

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture
def hosts() -> Iterator[NetHosts]:
    with NetHosts(2) as nh:
        yield nh


QUERY = """
import json, sys, urllib.parse, urllib.request
url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[1]})
try:
    print(urllib.request.urlopen(url, timeout=5).read().decode())
except OSError as exc:
    print(json.dumps({"status": "down", "error": str(exc)}))
"""


def prometheus_query(nh: NetHosts, query: str) -> list[dict]:  # type: ignore[type-arg]
    """A PromQL instant query to the Prometheus in the bridge namespace; its result vector."""
    done = subprocess.run(
        nh.bridge_argv([sys.executable, "-c", QUERY, query]), capture_output=True, text=True, timeout=30
    )
    answer = json.loads(done.stdout or "{}")
    return list(answer.get("data", {}).get("result", [])) if answer.get("status") == "success" else []


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus is not installed (ops/ci/system-deps.sh)"
)
def test_prometheus_scrapes_every_server_across_hosts(hosts: NetHosts, pubmed2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ops/prometheus/prometheus.yml, run by Debian's prometheus on the hosts' network, scrapes
    both servers and sees the rows-pulled counter grow while the job trains."""
    conf = tmp_path / "prometheus.yml"
    text = (ROOT / "ops" / "prometheus" / "prometheus.yml").read_text()
    faster = (("scrape_interval: 15s", "scrape_interval: 1s"), ("scrape_timeout: 10s", "scrape_timeout: 1s"),
              ("refresh_interval: 30s", "refresh_interval: 1s"))  # fmt: skip
    for slow, fast in faster:
        assert slow in text
        text = text.replace(slow, fast)
    conf.write_text(text)
    targets = [f"{h.addr}:9400" for h in hosts.hosts]
    (tmp_path / "asyncgraph-targets.json").write_text(json.dumps([{"targets": targets}]))
    with open(tmp_path / "prometheus.log", "wb") as log:
        hosts.bridge_popen(
            ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             "--web.listen-address=127.0.0.1:9090", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    argv = launch_argv(
        hosts, pubmed2.part_config, "--server-arg=--metrics-port=9400", "--", *TRAIN, "--epochs", "500"
    )
    run = Launched(hosts, argv)
    try:
        run.wait_for(r"\[trainer 0\] epoch +0 ", 120)
        pulled = 'sum(asyncgraph_rows_total{direction="out"})'
        seen: list[float] = []
        deadline = time.monotonic() + 30  # the first scrape comes ~5 s after start, whatever the interval
        while time.monotonic() < deadline:
            up = prometheus_query(hosts, 'up{job="asyncgraph"} == 1')
            value = prometheus_query(hosts, pulled)
            if len(up) == 2 and value:
                seen.append(float(value[0]["value"][1]))
                if len(seen) >= 2 and seen[-1] > seen[0] > 0:
                    break
            time.sleep(1)
        log_text = (tmp_path / "prometheus.log").read_text(errors="replace")
        assert len(seen) >= 2 and seen[-1] > seen[0] > 0, f"{seen}\n{log_text}\n{run.text[-3000:]}"
        instances = {r["metric"]["instance"] for r in prometheus_query(hosts, "asyncgraph_partition")}
        assert instances == set(targets)
    finally:
        run.proc.send_signal(signal.SIGTERM)
        assert run.finish(30) == 128 + signal.SIGTERM
    wait_no_leftovers(hosts, 10)


@pytest.mark.skipif(slurm_skip_reason() is not None, reason=slurm_skip_reason() or "")
def test_sbatch_runs_a_two_node_job_that_trains(pubmed2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ops/slurm/asyncgraph.sbatch on a real 2-node Slurm (slurmctld, slurmd per host, munge):
    partitions staged to each node's own disk, servers and trainers by srun, PubMed trains, and
    nothing of the job is left on either node afterwards."""
    with NetHosts(2, private_data=True) as nh, SlurmCluster(nh) as slurm:
        env = {"PART_CONFIG": str(pubmed2.part_config), "PYTHON": sys.executable, "SERVER_PORT": "0",
               "LOCAL_ROOT": str(nh.data_dir), "READY_TIMEOUT": "120"}  # fmt: skip
        train = [
            sys.executable,
            str(ROOT / "examples" / "train_dist.py"),
            "--no-progress",
            "--eval-every",
            "0",
        ]
        argv = ["env", *(f"{k}={v}" for k, v in env.items()),
                "sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--output={tmp_path}/job-%j.out",
                str(ROOT / "ops" / "slurm" / "asyncgraph.sbatch"), "--", *train, "--epochs", "1"]  # fmt: skip
        done = slurm.run(0, argv, timeout=60, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        state = slurm.wait_job(done.stdout.strip().split(";")[0], timeout=240)
        out = "\n".join(f.read_text(errors="replace") for f in tmp_path.glob("job-*.out"))
        assert state == ("COMPLETED", "0:0"), f"{state}\n{out}"
        assert "RESULT" in out and '"world_size": 2' in out, out
        assert "servers ready:" in out and nh[0].name in out and nh[1].name in out, out
        assert nh.leftovers() == {}
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".asyncgraph-")] == []
