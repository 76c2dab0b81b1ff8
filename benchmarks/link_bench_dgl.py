"""DGL 2.1 launched over ssh on the namespace hosts of ``link_bench``, links shaped by ``tc tbf``.

Issue 24 §5's comparison: the same 2 namespace hosts (``tests/nethosts.py``: own network stack,
``/dev/shm`` and sshd each), every host's egress shaped to the rate, PubMed partitioned by DGL
into 2 parts (``dgl_link_worker.py partition``). From host 1, ``dgl_link_worker.py launch``
(a minimal ``tools/launch.py``: ssh to each host, ``--ssh_port`` 22) starts one DGL server and
one trainer per host. DGL's trainer on host 1 pulls rows of host 2's partition only (1k, 10k,
100k rows, sequential calls: every byte crosses host 2's shaped link, as every pull of
``link_bench``'s client crosses it) and samples 1,024 seeds of that partition, fanout 10; then
both trainers train GraphSAGE with ``examples/train_dist.py``'s set-up for ``--epochs``.

Printed beside each figure, measured in the same run: the link limit (rate / 8) and a raw TCP
stream over the same shaped path (``link_bench.tcp_ceiling``). Run ours right before or after
(``ops/run_side_by_side.sh --links``), never at the same time.

``python -m benchmarks.link_bench_dgl [--rates 1gbit] [--seconds 4] [--epochs 5]`` (root; DGL's
venv at ``$DGLBENCH_ROOT/venv``, default ``~/.cache/dglbench``) writes
``benchmarks/results/link_bench_dgl.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.link_bench import ROOT, SIZES, _rate_bytes, tcp_ceiling

RESULTS = ROOT / "benchmarks" / "results"
WORKER = ROOT / "benchmarks" / "dgl_link_worker.py"
SERVER_PORT = 30050  # dgl_link_worker.SERVER_PORT


def _dgl_python() -> Path:
    root = Path(os.environ.get("DGLBENCH_ROOT", Path.home() / ".cache" / "dglbench"))
    return root / "venv" / "bin" / "python"


def _case(rate: str, part_config: Path, py: Path, seconds: float, epochs: int, batch: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from nethosts import NetHosts  # type: ignore[import-not-found]

    with NetHosts(2) as nh:
        if rate != "none":
            bits = _rate_bytes(rate) or 0.0
            for i in range(2):
                nh.shape(i, rate, burst=f"{max(64 << 10, int(bits / 100))}b", latency="100ms")
        ceiling = tcp_ceiling([nh[1]], [nh[0]])
        ip_config = nh.tmp / "ip_config.txt"
        ip_config.write_text("".join(f"{h.addr} {SERVER_PORT}\n" for h in nh.hosts))
        t0 = time.perf_counter()
        argv = [str(py), str(WORKER), "launch", str(ip_config), str(part_config), "22",
                str(seconds), str(epochs), str(batch)]  # fmt: skip
        done = nh[0].run(argv, timeout=900, cwd=ROOT)
        wall = time.perf_counter() - t0
        left = {h.name: h.job_pids() for h in nh.hosts}
    if done.returncode != 0 or not any(x.startswith("RESULT ") for x in done.stdout.splitlines()):
        tail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise RuntimeError(f"DGL launch failed ({done.returncode}):\n{tail}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.split(" ", 1)[1])
    link = _rate_bytes(rate)
    for fig in result["pull"].values():
        fig["of_link"] = fig["bytes_s"] / link if link else None
        fig["of_tcp"] = fig["bytes_s"] / ceiling if ceiling else None
    return {"rate": rate, "hosts": 2, "link_limit_bytes_s": link, "tcp_ceiling_bytes_s": ceiling,
            "pull": result["pull"], "sample_req_s": result["sample_req_s"], "epochs": epochs,
            "batch_size": batch, "epoch_s": max(result["epoch_s_per_rank"]),
            "compute_s": max(result["compute_s_per_rank"]), "launch_wall_s": wall,
            "processes_left": left}  # fmt: skip


def _show(case: dict[str, Any]) -> None:
    limit = case["link_limit_bytes_s"]
    print(f"DGL 2.1, 2 hosts, {case['rate']}: link limit {limit / 1e6:.0f} MB/s, raw TCP "
          f"{case['tcp_ceiling_bytes_s'] / 1e6:.0f} MB/s (same run)")  # fmt: skip
    for size in SIZES:
        fig = case["pull"][str(size)]
        ratio = f"{fig['of_link']:.2f}x link, " if fig["of_link"] is not None else ""
        print(f"  pull {size:>7,} rows: {fig['rows_s'] / 1e3:8.0f}k rows/s {fig['bytes_s'] / 1e6:7.0f} MB/s "
              f"({ratio}{fig['of_tcp']:.2f}x raw TCP), p50 {fig['p50_ms']:.1f} ms")  # fmt: skip
    print(f"  sample_neighbors 1,024 seeds fanout 10: {case['sample_req_s']:.0f} req/s")
    print(f"  epoch (2 x 1 trainers, batch {case['batch_size']}): {case['epoch_s']:.2f} s, compute "
          f"{case['compute_s']:.2f} s; launch to end {case['launch_wall_s']:.1f} s; processes left: "
          f"{sum(len(v) for v in case['processes_left'].values())}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.link_bench_dgl", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rates", nargs="+", default=["1gbit"])
    parser.add_argument("--seconds", type=float, default=4.0, help="time per pull/sample figure")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=10, help="as link_bench's epoch case")
    ns = parser.parse_args()
    py = _dgl_python()
    if not py.exists():
        parser.error(f"no DGL venv at {py} (../shared/peers/dgl/README.md; set DGLBENCH_ROOT)")
    for rate in ns.rates:
        _rate_bytes(rate)
    cases = []
    with tempfile.TemporaryDirectory(prefix="link-bench-dgl-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        subprocess.run([str(py), str(WORKER), "partition", str(ROOT / "examples/data/pubmed.npz"),
                        str(work / "pubmed2")], check=True, capture_output=True)  # fmt: skip
        for rate in ns.rates:
            case = _case(rate, work / "pubmed2" / "pubmed.json", py, ns.seconds, ns.epochs, ns.batch_size)
            _show(case)
            cases.append(case)
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0], "command": " ".join(sys.argv),
            "system": "DGL 2.1"}  # fmt: skip
    out = RESULTS / "link_bench_dgl.json"
    out.write_text(json.dumps({**meta, "cases": cases}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
