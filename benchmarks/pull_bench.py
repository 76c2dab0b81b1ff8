"""Pull/push throughput and latency against 2 real servers and 2 trainer processes.

Set-up (issue 3 §7): the synthetic scale-20 graph (2^20 nodes, ~10.6M edges, 128-d float32
``feat``) partitioned with metis into 2 parts, one server per partition, and 2 trainer processes
(``benchmarks.pull_worker``), trainer r treating partition r as its local (shared-memory) one.
Each trainer pulls (and pushes, acknowledged) uniform random global IDs, in three cases:

- ``mixed``: IDs over the whole graph (about half remote, half shared memory);
- ``remote``: IDs of the other partition only (all over the socket);
- ``local``: IDs of the trainer's own partition only (all through shared memory).

For 1k, 10k and 100k rows it prints aggregate rows/s and GB/s and p50/p99 latency beside two
ceilings measured in the same run: a raw loopback TCP stream between two processes (sendall /
recv_into of 64 MiB) and a numpy gather (``np.take`` of the same number of random rows from a
partition-sized array, in both trainers at once). Every measurement runs a fixed number of calls
under a time cap. Start-up is timed from launching the 2 servers until both (already running)
trainers are connected and ready to pull.

``python -m benchmarks.pull_bench`` (writes benchmarks/results/pull_bench.json and .png; needs
benchmarks/data/synth20.npz, and partitions it into benchmarks/data/synth20_metis2/ once).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
RESULTS = ROOT / "benchmarks" / "results"
ROW_BYTES = 128 * 4
SIZES = (1_000, 10_000, 100_000)
CASES = ("mixed", "remote", "local")
ITERS = {1_000: 400, 10_000: 150, 100_000: 30}
DGL_MIXED = {  # DGL 2.1, same set-up, same kind of machine; pushes are never acknowledged
    1_000: {"rows_s": 3.09e6, "p99_ms": 1.4},
    10_000: {"rows_s": 5.73e6, "p99_ms": 5.7},
    100_000: {"rows_s": 3.78e6, "p99_ms": 73.0},
}
DGL_STARTUP_S = 9.0


def ensure_partitioned(scale: int) -> Path:
    out = DATA / f"synth{scale}_metis2"
    config = out / f"synth{scale}.json"
    if config.is_file():
        return config
    npz = DATA / f"synth{scale}.npz"
    if not npz.is_file():
        subprocess.run(
            [sys.executable, "-m", "benchmarks.synthetic", "--scale", str(scale), "--out", str(npz)],
            check=True,
            cwd=ROOT,
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncgraph.partition",
            "--input",
            str(npz),
            "--graph-name",
            f"synth{scale}",
            "--num-parts",
            "2",
            "--method",
            "metis",
            "--out",
            str(out),
        ],
        check=True,
        cwd=ROOT,
    )
    return config


class Worker:
    """One trainer subprocess speaking JSON lines."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.pull_worker"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
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


def socket_ceiling(mib: int = 64, iters: int = 16) -> dict[str, float]:
    """Raw loopback TCP stream: another process sendall()s ``mib`` MiB ``iters`` times to us."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        sender = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.pull_worker",
                "--sock-send",
                "127.0.0.1",
                str(port),
                str(mib),
                str(iters),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        conn, _ = srv.accept()
        buf = bytearray(mib << 20)
        view = memoryview(buf)
        total = 0
        first = True
        t0 = 0.0
        with conn:
            while True:
                n = conn.recv_into(view)
                if first:
                    t0 = time.perf_counter()  # from the first byte: excludes the sender's start-up
                    first = False
                if n == 0:
                    break
                total += n
            elapsed = time.perf_counter() - t0
            conn.sendall(b"x")
        sender.wait(timeout=60)
    gbs = total / elapsed / 1e9
    return {"bytes": total, "seconds": elapsed, "gb_s": gbs, "rows_s": total / elapsed / ROW_BYTES}


def run_all(workers: list[Worker], **msg: Any) -> list[dict[str, Any]]:
    start_at = time.time() + 0.5
    for w in workers:
        w.send(cmd="bench", start_at=start_at, **msg)
    return [w.recv() for w in workers]


def summarize(results: list[dict[str, Any]]) -> dict[str, float]:
    lat = np.concatenate([np.asarray(r["lat"]) for r in results])
    rows = sum(r["rows"] for r in results)
    wall = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    rows_s = rows / wall
    return {
        "rows_s": rows_s,
        "gb_s": rows_s * ROW_BYTES / 1e9,
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
        "calls": int(lat.size),
        "seconds": wall,
    }


def plot(report: dict[str, Any], path: Path) -> None:
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
        if op == "pull":
            ax.bar(
                x + 1.5 * width,
                [DGL_MIXED[s]["rows_s"] for s in SIZES],
                width,
                label="DGL 2.1 mixed pull",
                color="grey",
            )
        ax.axhline(sock, color="red", linestyle="--", label=f"socket ceiling ({sock / 1e6:.1f}M rows/s)")
        ax.plot(x, gather, "k^:", label="np.take gather ceiling (2 procs)")
        ax.set_xticks(x, [f"{s // 1000}k rows" for s in SIZES])
        ax.set_yscale("log")
        ax.set_ylabel("aggregate rows/s (128 x float32)")
        ax.set_title(f"{op}: 2 servers, 2 trainers")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pull_bench", description=__doc__)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--cap-s", type=float, default=3.0, help="time cap per measurement")
    ap.add_argument("--ops", default="pull,push,gather")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--out", type=Path, default=RESULTS / "pull_bench.json")
    args = ap.parse_args(argv)
    ops = args.ops.split(",")
    cases = args.cases.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    sys.path.insert(0, str(ROOT / "tests"))
    from servers import start_servers

    config = ensure_partitioned(args.scale)
    report: dict[str, Any] = {
        "scale": args.scale,
        "set_up": "2 servers (metis 2 parts), 2 trainer processes, uniform random global IDs",
        "row_bytes": ROW_BYTES,
        "dgl_reference_mixed_pull": {str(k): v for k, v in DGL_MIXED.items()},
        "pull": {c: {} for c in cases},
        "push": {c: {} for c in cases},
        "ceilings": {"gather": {}},
    }
    print("socket ceiling…", flush=True)
    report["ceilings"]["socket"] = socket_ceiling()
    sock = report["ceilings"]["socket"]
    print(f"  loopback stream: {sock['gb_s']:.2f} GB/s = {sock['rows_s'] / 1e6:.2f}M rows/s", flush=True)

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
                "servers_ready_s": t_servers - t_launch,
                "clients_ready_s": t_ready - t_launch,
                "dgl_s": DGL_STARTUP_S,
                "local_partitions": [r["local"] for r in ready],
            }
            print(
                f"start-up: servers ready {t_servers - t_launch:.2f} s, trainers ready to pull "
                f"{t_ready - t_launch:.2f} s (DGL ~{DGL_STARTUP_S:.0f} s)",
                flush=True,
            )
            workers[0].send(cmd="create", name="node:bench_push", dim=128)
            workers[0].recv()
            for size in sizes:
                if "gather" in ops:
                    res = run_all(
                        workers, op="gather", case="gather", size=size, iters=ITERS[size], cap_s=args.cap_s
                    )
                    report["ceilings"]["gather"][str(size)] = summarize(res)
                for op in ("pull", "push"):
                    if op not in ops:
                        continue
                    for case in cases:
                        res = run_all(
                            workers, op=op, case=case, size=size, iters=ITERS[size], cap_s=args.cap_s
                        )
                        s = report[op][case][str(size)] = summarize(res)
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
    if "gather" in ops and "pull" in ops and set(cases) == set(CASES) and sizes == list(SIZES):
        print_table(report)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        if "push" in ops:
            plot(report, args.out.with_suffix(".png"))
        print(f"wrote {args.out}")
    return 0


def print_table(report: dict[str, Any]) -> None:
    sock = report["ceilings"]["socket"]
    print()
    print(f"socket ceiling: {sock['gb_s']:.2f} GB/s ({sock['rows_s'] / 1e6:.2f}M rows/s)")
    head = (
        f"{'op':4} {'case':6} {'rows':>7} {'Mrows/s':>8} {'GB/s':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'ceiling':>8} {'%ceil':>6} {'vs DGL':>7}"
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
                dgl = DGL_MIXED[size]["rows_s"] if (op, case) == ("pull", "mixed") else None
                vs = ""
                if dgl:
                    s["vs_dgl"] = s["rows_s"] / dgl
                    vs = f"{s['vs_dgl']:.2f}x"
                print(
                    f"{op:4} {case:6} {size:>7,} {s['rows_s'] / 1e6:8.2f} {s['gb_s']:6.2f} "
                    f"{s['p50_ms']:7.2f} {s['p99_ms']:7.2f} {ceil_name:>8} {s['pct_of_ceiling']:5.0f}% "
                    f"{vs:>7}"
                )
    for size in SIZES:
        g = report["ceilings"]["gather"][str(size)]
        print(f"gather ceiling {size:>7,} rows: {g['rows_s'] / 1e6:.2f}M rows/s ({g['gb_s']:.2f} GB/s)")
    st = report["startup"]
    print(f"start-up: {st['clients_ready_s']:.2f} s to trainers ready (DGL ~{st['dgl_s']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
