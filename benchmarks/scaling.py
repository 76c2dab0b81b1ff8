"""Scaling study: how pull and sample cost grows with batch size, partitions and graph size.

Closed-loop runs of ``benchmarks.loadgen`` (our own servers, TCP only) with a pull-only and a
sample-only mix, each next to its in-process ceiling measured in the same run (numpy gather of the
same number of rows; ``sample_csc`` on the same partition):

* batch: rows per request 100 -> 100k on one partition of ``--graph``;
* partitions: 1, 2, 4 servers over the same graph (fixed total data), rows ``--rows``;
* graph size: synthetic scale 2^17 -> 2^21 nodes (generated once into ``benchmarks/data``), one
  partition, rows ``--rows``.

The server CPU seconds per request in the batch study are fitted as ``a + b * rows`` (per-request
and per-row cost), the inputs of the capacity estimate in ``benchmarks/README.md``.

``python -m benchmarks.scaling [--studies batch,partitions,graph] [--duration 3]`` writes
``benchmarks/results/scaling.json`` and ``scaling-{batch,partitions,graph}.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, add_graph_options, graph_npz, loopback_ceiling, synthetic_npz
from benchmarks.loadgen import (
    LoadConfig,
    ensure_partitions,
    gather_ceiling,
    own_servers,
    run_load,
    sample_ceiling,
)

MIXES = {"pull": {"pull": 1.0}, "sample": {"sample": 1.0}}


def measure(
    part_config: Path, parts: int, rows_list: list[int], args: argparse.Namespace, label: dict[str, Any]
) -> list[dict[str, Any]]:
    """Pull-only and sample-only points for each row count on one set of servers."""
    points = []
    extra = ["--log-level", "WARNING"]
    with own_servers(part_config, parts, extra) as cluster:
        for rows in rows_list:
            gather = gather_ceiling(part_config, rows)
            kernel = sample_ceiling(part_config, rows, args.fanout)
            for op, mix in MIXES.items():
                cfg = LoadConfig(
                    mix=mix,
                    rows=rows,
                    fanout=args.fanout,
                    clients=args.clients,
                    processes=args.processes,
                    duration=args.duration,
                    timeout=30.0,
                    progress=False,
                )
                result = run_load(cfg, cluster)
                r = result["ops"][op]
                srv = result["servers"]
                cpu_s_per_req = sum(srv["cpu_percent"]) / 100.0 / max(r["requests_per_s"], 1e-9)
                point = {
                    **label,
                    "op": op,
                    "rows": rows,
                    "requests_per_s": r["requests_per_s"],
                    "rows_per_s": r["rows_per_s"],
                    "MB_per_s": r["MB_per_s"],
                    "edges_per_s": r["edges_per_s"],
                    "p50_ms": r["p50_ms"],
                    "p99_ms": r["p99_ms"],
                    "errors": r["errors"],
                    "server_cpu_percent": srv["cpu_percent"],
                    "server_cpu_s_per_request": cpu_s_per_req,
                    "ceiling_rows_per_s": gather["rows_per_s"] if op == "pull" else kernel["seeds_per_s"],
                    "ceiling": gather if op == "pull" else kernel,
                }
                points.append(point)
                print(
                    f"{label} {op:>6} rows {rows:>6}: {r['requests_per_s']:>8,.0f} req/s "
                    f"{r['rows_per_s']:>11,.0f} rows/s {r['MB_per_s']:>7,.0f} MB/s "
                    f"p99 {r['p99_ms']:>8.1f} ms | "
                    f"server CPU {sum(srv['cpu_percent']):.0f}% = {cpu_s_per_req * 1e6:,.0f} µs/req | "
                    f"ceiling {point['ceiling_rows_per_s']:,.0f} rows/s in-process",
                    flush=True,
                )
    return points


def fit_costs(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares ``server CPU s/request = a + b * rows`` per op (batch study)."""
    out = {}
    for op in MIXES:
        pts = [p for p in points if p["op"] == op]
        if len(pts) < 2:
            continue
        x = np.array([p["rows"] for p in pts], dtype=np.float64)
        y = np.array([p["server_cpu_s_per_request"] for p in pts])
        b, a = np.polyfit(x, y, 1, w=1.0 / y)  # relative error, so small batches count
        out[op] = {"per_request_s": float(max(a, 0.0)), "per_row_s": float(b)}
    return out


def plot(points: list[dict[str, Any]], key: str, path: Path, xlabel: str, title: str) -> None:
    """Rows/s (pull) and seeds/s (sample) against ``key``, with the in-process ceilings dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for op, color in (("pull", "C0"), ("sample", "C1")):
        pts = sorted((p for p in points if p["op"] == op), key=lambda p: p[key])
        xs = [p[key] for p in pts]
        unit = "rows/s" if op == "pull" else "seeds/s"
        ax.plot(xs, [p["rows_per_s"] for p in pts], "o-", color=color, label=f"{op} via servers ({unit})")
        ax.plot(
            xs,
            [p["ceiling_rows_per_s"] for p in pts],
            "--",
            color=color,
            alpha=0.6,
            label="numpy gather, 1 core" if op == "pull" else "sample_csc kernel, 1 core",
        )
    ax.set_xscale("log", base=2 if key != "rows" else 10)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rows (seeds) per second, log")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    """Run the chosen studies and write JSON + plots."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_graph_options(ap, default_scale=17)
    ap.add_argument("--studies", default="batch,partitions,graph")
    ap.add_argument("--batch-rows", default="100,1000,10000,100000")
    ap.add_argument("--partitions", default="1,2,4")
    ap.add_argument("--scales", default="17,18,19,20,21")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--fanout", type=int, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "scaling.json")
    args = ap.parse_args()
    graph = graph_npz(args)
    studies = args.studies.split(",")
    data: dict[str, Any] = {}
    if args.out.exists():
        data = json.loads(args.out.read_text())  # keep studies not re-run
    loopback = loopback_ceiling()
    data["loopback_MB_per_s"] = loopback["MB_per_s"]
    data["loopback_round_trip_us"] = loopback["round_trip_us"]
    data["config"] = {k: str(v) for k, v in vars(args).items()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    if "batch" in studies:
        rows = [int(r) for r in args.batch_rows.split(",")]
        points = measure(ensure_partitions(graph, 1), 1, rows, args, {"partitions": 1})
        data["batch"] = {"points": points, "cost_fit": fit_costs(points)}
        plot(
            points,
            "rows",
            RESULTS / "scaling-batch.png",
            "rows (seeds) per request",
            f"batch size, 1 server, {graph.stem}, {args.clients} clients",
        )
        print("cost fit:", data["batch"]["cost_fit"])
    if "partitions" in studies:
        points = []
        for parts in (int(p) for p in args.partitions.split(",")):
            points += measure(
                ensure_partitions(graph, parts), parts, [args.rows], args, {"partitions": parts}
            )
        data["partitions"] = {"points": points}
        plot(
            points,
            "partitions",
            RESULTS / "scaling-partitions.png",
            "partitions (servers)",
            f"partitions at fixed data, {graph.stem}, rows {args.rows}, {args.clients} clients",
        )
    if "graph" in studies:
        points = []
        for scale in (int(s) for s in args.scales.split(",")):
            config = ensure_partitions(synthetic_npz(scale), 1)
            points += measure(config, 1, [args.rows], args, {"scale": scale, "num_nodes": 1 << scale})
        data["graph"] = {"points": points}
        plot(
            points,
            "num_nodes",
            RESULTS / "scaling-graph.png",
            "nodes (synthetic graph, log2)",
            f"graph size, 1 server, rows {args.rows}, {args.clients} clients",
        )
    args.out.write_text(json.dumps(data, indent=1, default=float))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
