"""Pull/push throughput and latency against 2 real servers and 2 trainer processes.

Set-up: by default the synthetic scale-20 graph (2^20 nodes, ~10.6M edges, 128-d float32
``feat``) partitioned with metis into 2 parts, one server per partition, and 2 trainer processes
(``benchmarks.pull_worker``), trainer r treating partition r as its local (shared-memory) one.
Each trainer pulls (and pushes, acknowledged) uniform random global IDs, in three cases:

- ``mixed``: IDs over the whole graph (about half remote, half shared memory);
- ``remote``: IDs of the other partition only (all over the socket);
- ``local``: IDs of the trainer's own partition only (all through shared memory).

For 1k, 10k and 100k rows it prints aggregate rows/s and GB/s and p50/p99 latency beside two
ceilings measured in the same run: a raw loopback TCP stream between two processes
(``benchmarks.common.loopback_ceiling``, which also reports the ping round trip) and a numpy
gather (``np.take`` of the same number of random rows from a partition-sized array, in both
trainers at once). Every measurement runs a fixed number of calls under a time cap. Start-up
(``STARTUP_MEASURES``) is timed from starting the 2 server processes until both already running
trainers are connected and ready to pull; it is not the launcher's figure, which also starts
the trainers.

``python -m benchmarks.pull_bench [--scale 20 | --graph PATH.npz] [--dgl-results R.json]`` writes
benchmarks/results/pull_bench.json and .png; the graph is partitioned into
``benchmarks/data/<name>_metis2/`` once. Ratios to another system are printed only with
``--dgl-results`` from a same-day run (``"pull_mixed"``/``"push_mixed": {"1000": {"rows_s": ...}}``,
``"startup_s"``; ``benchmarks.dgl_reference`` writes it from DGL's harness).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.testing import start_servers
from benchmarks.common import (
    RESULTS,
    ROOT,
    add_graph_options,
    add_reference_option,
    graph_npz,
    load_reference,
    loopback_ceiling,
    partitioned,
    provenance,
    subprocess_env,
    wait_for_sampler,
)

SIZES = (1_000, 10_000, 100_000)
CASES = ("mixed", "remote", "local")
ITERS = {1_000: 400, 10_000: 150, 100_000: 30}


STARTUP_MEASURES = (
    "from starting 2 server processes (asyncgraph.testing.start_servers: the launcher's server "
    "command line and ready-file wait) until 2 already running, already imported trainer "
    "processes are connected and have attached their local partition"
)


def feature_row_bytes(config: Path) -> int:
    """Bytes of one row of ``feat`` in partition 0."""
    from asyncgraph.partition import load_partition

    return int(load_partition(config, 0).node_feats["feat"][0].nbytes)


class Worker:
    """One trainer subprocess speaking JSON lines."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.pull_worker"],
            cwd=ROOT,
            env=subprocess_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, **msg: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"trainer exited with {self.proc.wait()}")
        out: dict[str, Any] = json.loads(line)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(cmd="quit")
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def run_all(workers: list[Worker], **msg: Any) -> list[dict[str, Any]]:
    start_at = time.time() + 0.5
    for w in workers:
        w.send(cmd="bench", start_at=start_at, **msg)
    return [w.recv() for w in workers]


def summarize(results: list[dict[str, Any]], row_bytes: int) -> dict[str, float]:
    lat = np.concatenate([np.asarray(r["lat"]) for r in results])
    rows = sum(r["rows"] for r in results)
    wall = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    rows_s = rows / wall
    return {
        "rows_s": rows_s,
        "gb_s": rows_s * row_bytes / 1e9,
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
        "calls": int(lat.size),
        "seconds": wall,
    }


def standalone_pulls(config: Path, sizes: list[int], row_bytes: int, cap_s: float) -> dict[str, Any]:
    """Sequential pulls through the blocking API (``Client.pull``: what ``g.ndata[...][ids]``
    runs) of a standalone client of a one-partition config; DGL's harness measures its standalone
    mode the same way (one trainer, a random 1-way partition, uniform random IDs)."""
    from asyncgraph.client import Client

    client = Client.standalone(config)
    out: dict[str, Any] = {}
    try:
        rng = np.random.default_rng(7)
        n = client.book.num_nodes
        for size in sizes:
            pool = [rng.integers(0, n, size, dtype=np.int64) for _ in range(8)]
            for i in range(2):
                client.pull("node:feat", pool[i])
            lat = []
            t0 = time.perf_counter()
            deadline = t0 + cap_s
            for i in range(ITERS[size]):
                s = time.perf_counter()
                client.pull("node:feat", pool[i % 8])
                e = time.perf_counter()
                lat.append(e - s)
                if e > deadline:
                    break
            wall = time.perf_counter() - t0
            rows_s = size * len(lat) / wall
            out[str(size)] = {
                "rows_s": rows_s,
                "gb_s": rows_s * row_bytes / 1e9,
                "p50_ms": float(np.percentile(lat, 50) * 1e3),
                "p99_ms": float(np.percentile(lat, 99) * 1e3),
                "calls": len(lat),
                "seconds": wall,
            }
            print(
                f"pull standalone {size:>7,} rows: {rows_s / 1e6:7.2f}M rows/s  "
                f"p50 {out[str(size)]['p50_ms']:7.2f} ms",
                flush=True,
            )
    finally:
        client.close()
    return out


def plot(report: dict[str, Any], ref: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    x = np.arange(len(SIZES))
    width = 0.2
    sock = report["ceilings"]["socket"]["rows_s"]
    gather = [report["ceilings"]["gather"][str(s)]["rows_s"] for s in SIZES]
    for ax, op in zip(axes, ("pull", "push"), strict=True):
        for i, case in enumerate(CASES):
            vals = [report[op][case][str(s)]["rows_s"] for s in SIZES]
            ax.bar(x + (i - 1.5) * width, vals, width, label=f"{op} {case}")
        theirs = (ref or {}).get("pull_mixed", {})
        if op == "pull" and all(str(s) in theirs for s in SIZES):
            ax.bar(
                x + 1.5 * width,
                [theirs[str(s)]["rows_s"] for s in SIZES],
                width,
                label=f"{ref['system']} mixed pull ({ref['date']})" if ref else "",
                color="grey",
            )
        ax.axhline(sock, color="red", linestyle="--", label=f"socket ceiling ({sock / 1e6:.1f}M rows/s)")
        ax.plot(x, gather, "k^:", label="np.take gather ceiling (2 procs)")
        ax.set_xticks(x, [f"{s // 1000}k rows" for s in SIZES])
        ax.set_yscale("log")
        ax.set_ylabel(f"aggregate rows/s ({report['row_bytes']} bytes each)")
        ax.set_title(f"{op}: 2 servers, 2 trainers")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pull_bench", description=__doc__)
    add_graph_options(ap, default_scale=20)
    add_reference_option(ap)
    ap.add_argument("--cap-s", type=float, default=3.0, help="time cap per measurement")
    ap.add_argument("--ops", default="pull,push,gather")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--out", type=Path, default=RESULTS / "pull_bench.json")
    args = ap.parse_args(argv)
    ops = args.ops.split(",")
    cases = args.cases.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    npz = graph_npz(args)
    ref = load_reference(args.dgl_results)
    config = partitioned(npz, 2)
    row_bytes = feature_row_bytes(config)
    report: dict[str, Any] = {
        "graph": str(npz),
        "set_up": "2 servers (metis 2 parts), 2 trainer processes, uniform random global IDs",
        "row_bytes": row_bytes,
        "reference": ref,
        "pull": {c: {} for c in cases},
        "push": {c: {} for c in cases},
        "ceilings": {"gather": {}},
    }
    print("socket ceiling…", flush=True)
    loopback = loopback_ceiling(total=1 << 30)
    sock = report["ceilings"]["socket"] = {
        **loopback,
        "gb_s": loopback["bytes_per_s"] / 1e9,
        "rows_s": loopback["bytes_per_s"] / row_bytes,
    }
    print(
        f"  loopback stream: {sock['gb_s']:.2f} GB/s = {sock['rows_s'] / 1e6:.2f}M rows/s, "
        f"round trip {sock['round_trip_us']:.0f} us",
        flush=True,
    )

    workers = [Worker(), Worker()]
    group = None
    try:
        for w in workers:
            w.recv()  # imported and idle: start-up below excludes the trainer's own imports
        with tempfile.TemporaryDirectory(prefix="pull_bench") as tmp:
            t_launch = time.time()
            group = start_servers(config, Path(tmp), num_parts=2, num_clients=2)
            t_servers = time.time()
            for rank, w in enumerate(workers):
                w.send(cmd="connect", servers=group.addresses, rank=rank)
            ready = [w.recv() for w in workers]
            t_ready = max(r["ready_t"] for r in ready)
            report["startup"] = {
                "measures": STARTUP_MEASURES,
                "servers_ready_s": t_servers - t_launch,
                "clients_ready_s": t_ready - t_launch,
                "local_partitions": [r["local"] for r in ready],
            }
            print(
                f"start-up: servers ready {t_servers - t_launch:.2f} s, already running trainers "
                f"connected {t_ready - t_launch:.2f} s after the servers were started",
                flush=True,
            )
            # servers load the compiled sampler in the background after start-up (numba's
            # import holds their GIL for a second or more): time pulls once that is over
            wait_for_sampler(group.addresses)
            workers[0].send(cmd="create", name="node:bench_push", dim=128)
            workers[0].recv()
            for size in sizes:
                if "gather" in ops:
                    res = run_all(
                        workers, op="gather", case="gather", size=size, iters=ITERS[size], cap_s=args.cap_s
                    )
                    report["ceilings"]["gather"][str(size)] = summarize(res, row_bytes)
                for op in ("pull", "push"):
                    if op not in ops:
                        continue
                    for case in cases:
                        res = run_all(
                            workers, op=op, case=case, size=size, iters=ITERS[size], cap_s=args.cap_s
                        )
                        s = report[op][case][str(size)] = summarize(res, row_bytes)
                        print(
                            f"{op:4} {case:6} {size:>7,} rows: {s['rows_s'] / 1e6:7.2f}M rows/s "
                            f"{s['gb_s']:6.2f} GB/s  p50 {s['p50_ms']:7.2f} ms  p99 {s['p99_ms']:7.2f} ms",
                            flush=True,
                        )
    finally:
        for w in workers:
            w.close()
        if group is not None:
            group.stop()
    if "pull" in ops:  # one partition, as DGL's harness runs its standalone mode (part_random1)
        report["pull_standalone"] = standalone_pulls(
            partitioned(npz, 1, "random"), sizes, row_bytes, args.cap_s
        )
        ref_sa = (ref or {}).get("pull_standalone", {})
        for size, s in report["pull_standalone"].items():
            if size in ref_sa:
                s["vs_reference"] = s["rows_s"] / ref_sa[size]["rows_s"]
                ratio = s["vs_reference"]
                print(f"pull standalone {int(size):>7,} rows: {ratio:.2f}x the reference", flush=True)
    if "gather" in ops and "pull" in ops and set(cases) == set(CASES) and sizes == list(SIZES):
        print_table(report, ref)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        if "push" in ops:
            plot(report, ref, args.out.with_suffix(".png"))
        print(f"wrote {args.out}")
    return 0


def print_table(report: dict[str, Any], ref: dict[str, Any] | None) -> None:
    sock = report["ceilings"]["socket"]
    print()
    print(f"socket ceiling: {sock['gb_s']:.2f} GB/s ({sock['rows_s'] / 1e6:.2f}M rows/s)")
    head = (
        f"{'op':4} {'case':6} {'rows':>7} {'Mrows/s':>8} {'GB/s':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'ceiling':>8} {'%ceil':>6} {'vs ref':>7}"
    )
    print(head)
    print("-" * len(head))
    for op in ("pull", "push"):
        for case in CASES:
            for size in SIZES:
                s = report[op].get(case, {}).get(str(size))
                if s is None:
                    continue
                gather = report["ceilings"]["gather"][str(size)]
                if case == "local":
                    ceil_name, ceil = "gather", gather["rows_s"]
                elif case == "remote":
                    ceil_name, ceil = "socket", sock["rows_s"]
                else:
                    # half the rows over the socket, half gathered, one after the other
                    ceil_name, ceil = "blend", 1 / (0.5 / sock["rows_s"] + 0.5 / gather["rows_s"])
                s["ceiling"] = ceil_name
                s["pct_of_ceiling"] = 100 * s["rows_s"] / ceil
                theirs = (ref or {}).get(f"{op}_mixed", {}).get(str(size), {}).get("rows_s")
                vs = ""
                if theirs and case == "mixed":
                    s["vs_reference"] = s["rows_s"] / theirs
                    vs = f"{s['vs_reference']:.2f}x"
                print(
                    f"{op:4} {case:6} {size:>7,} {s['rows_s'] / 1e6:8.2f} {s['gb_s']:6.2f} "
                    f"{s['p50_ms']:7.2f} {s['p99_ms']:7.2f} {ceil_name:>8} {s['pct_of_ceiling']:5.0f}% "
                    f"{vs:>7}"
                )
    for size in SIZES:
        g = report["ceilings"]["gather"][str(size)]
        print(f"gather ceiling {size:>7,} rows: {g['rows_s'] / 1e6:.2f}M rows/s ({g['gb_s']:.2f} GB/s)")
    st = report["startup"]
    line = f"start-up: {st['clients_ready_s']:.2f} s ({STARTUP_MEASURES})"
    if ref and "startup_s" in ref:
        line += f"; {provenance(ref)}: {ref['startup_s']:.2f} s"
    print(line)
    if ref:
        print(f"ratios against {provenance(ref)}")


if __name__ == "__main__":
    sys.exit(main())
