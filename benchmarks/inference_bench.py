"""Layer-wise inference throughput: nodes per second for every node of a graph, 1 and 2 trainers.

Same set-up as DGL's distributed GraphSAGE ``inference()`` (its examples): a 2-layer GraphSAGE
(128 -> ``--hidden`` -> 50, mean), full neighbourhoods, batches of ``--batch-size`` nodes, on the
synthetic graph of ``--scale`` (default 20: 2**20 nodes, ~10.6M edges, DGL's benchmark graph) in 2
METIS partitions, one server per partition. Each trainer runs
``asyncgraph.inference.layerwise_inference`` over its ``node_split`` share; the figure is
``num_nodes / slowest trainer's wall time``.

Ceiling, measured in the same run by the same trainers: the time each spends inside the layers
(``layer_fn`` timed with ``perf_counter``); ``num_nodes / slowest trainer's compute time`` is the
rate if building blocks and pulling rows cost nothing (the prefetching loader overlaps them with
compute, so the gap is what it fails to hide). Both figures suffer the same machine load.

Run: ``python -m benchmarks.inference_bench [--scale 20] [--trainers 1 2]``; writes
``benchmarks/results/inference_bench.json``.
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

import torch

from benchmarks.common import RESULTS, ROOT, add_graph_options, graph_npz, partitioned, subprocess_env

HIDDEN = 256
CLASSES = 50


def _model(in_feats: int, hidden: int) -> torch.nn.Module:
    from asyncgraph.nn import GraphSAGE

    torch.manual_seed(0)
    return GraphSAGE(in_feats, hidden, CLASSES, n_layers=2, dropout=0.0).eval()


def worker(args: argparse.Namespace) -> None:
    """One trainer: connect, layer-wise inference of its share, print its time as JSON."""
    import asyncgraph
    from asyncgraph.inference import layerwise_inference

    torch.set_num_threads(args.threads)
    asyncgraph.initialize()
    g = asyncgraph.DistGraph(args.graph_name)
    model = _model(int(g.ndata["feat"].shape[1]), args.hidden)
    if not args.no_direct:
        from asyncgraph.inference_kernel import wait_ready

        wait_ready(120.0)  # the kernel's load is not part of the figure
    stats: dict[str, float] = {}
    g.barrier("bench.start")
    t0 = time.perf_counter()
    out = layerwise_inference(
        g, model, "feat", batch_size=args.batch_size, name="bench", direct=not args.no_direct, stats=stats
    )
    seconds = time.perf_counter() - t0
    compute = stats["layers"]
    rank = g.rank()
    g.barrier("bench.end")
    if rank == 0:
        out.delete()
        g.ndata["bench.done"].delete()
    row = {"rank": rank, "seconds": seconds, "compute": compute, "direct_nodes": stats["direct"]}
    print("RESULT " + json.dumps(row), flush=True)
    asyncgraph.finalize()


def run_trainers(
    part_config: Path, graph_name: str, trainers: int, args: argparse.Namespace
) -> tuple[float, float]:
    """One server per partition and ``trainers`` worker processes; the slowest trainer's
    ``(seconds, compute seconds)``."""
    from asyncgraph.testing import start_servers

    parts = int(json.loads(part_config.read_text())["num_parts"])
    with tempfile.TemporaryDirectory(prefix="inference-bench-") as tmp:
        group = start_servers(part_config, Path(tmp), num_parts=parts, num_clients=trainers)
        try:
            procs = []
            for rank in range(trainers):
                env = {
                    **subprocess_env(),
                    "ASYNCGRAPH_IP_CONFIG": str(group.ip_config()),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(trainers),
                    "OMP_NUM_THREADS": str(args.threads),
                    "NUMBA_NUM_THREADS": str(args.threads),
                }
                cmd = [
                    sys.executable, "-m", "benchmarks.inference_bench", "--worker",
                    "--graph-name", graph_name, "--batch-size", str(args.batch_size),
                    "--hidden", str(args.hidden), "--threads", str(args.threads),
                    *(["--no-direct"] if args.no_direct else []),
                ]  # fmt: skip
                procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True))
            seconds, compute, direct = [], [], []
            for p in procs:
                out, _ = p.communicate(timeout=args.timeout)
                if p.returncode != 0:
                    raise SystemExit(f"a trainer failed (status {p.returncode})")
                line = json.loads([x for x in out.splitlines() if x.startswith("RESULT ")][-1][7:])
                seconds.append(float(line["seconds"]))
                compute.append(float(line["compute"]))
                direct.append(float(line["direct_nodes"]))
            each = zip(seconds, compute, direct, strict=True)
            print(
                "  per trainer: "
                + ", ".join(
                    f"{s:.2f} s ({c:.2f} s in layers; {d:,.0f} node-layers direct)" for s, c, d in each
                )
            )
            return max(seconds), max(compute)
        finally:
            group.stop()


PROBE = """
import time, numpy as np, torch
torch.set_num_threads(1)
rng = np.random.default_rng(0)
rows = np.full((1 << 18, 128), 0.5, dtype=np.float32)
ids = rng.integers(0, rows.shape[0], 40_000)
w = torch.randn(128, 256)
t = time.perf_counter()
for _ in range(ITERS):
    h = torch.from_numpy(rows.take(ids[:4096], axis=0))
    np.add.reduceat(rows.take(ids, axis=0), np.arange(0, ids.size, 10), axis=0)
    torch.mm(h, w)
print(time.perf_counter() - t)
"""


def cpu_probe(procs: int, iters: int = 30) -> float:
    """Seconds for ``procs`` processes, at once, each doing the same fixed CPU work (a layer's
    row gathers, neighbour sums and a dense map, one thread): ``2 * probe(1) / probe(2)`` is
    how much faster this machine, at this moment, does twice the work with 2 processes, the
    ceiling of 2 trainers' speed-up over one (other users' load and shared caches included)."""
    code = PROBE.replace("ITERS", str(iters))
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    ps = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    return max(float(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in ps)


def probe_pair() -> dict[str, float]:
    """1, 2, 1, 2 probe processes (the load of others varies: each count's fastest try counts):
    their seconds and the speed-up the machine offers 2 trainers."""
    tries = [(n, cpu_probe(n)) for n in (1, 2, 1, 2)]
    one = min(t for n, t in tries if n == 1)
    two = min(t for n, t in tries if n == 2)
    return {"one_s": one, "two_s": two, "speedup_2": 2 * one / two}


def _cpu_seconds() -> tuple[float, float, float]:
    """``(CPU seconds busy on the whole machine, CPU seconds of this process and its waited-for
    children (servers, trainers), monotonic time)``: their difference over a run is what other
    users' processes took while it ran."""
    import psutil

    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    mine = os.times()
    ours = mine.user + mine.system + mine.children_user + mine.children_system
    return busy, ours, time.monotonic()


def one_run(
    part_config: Path,
    graph_name: str,
    n: int,
    trainers: int,
    args: argparse.Namespace,
    ref: dict[str, Any] | None,
    rep: int,
) -> dict[str, Any]:
    """One run of ``trainers`` trainers: printed, and its row of the results."""
    load = os.getloadavg()[0]
    before = _cpu_seconds()
    seconds, compute = run_trainers(part_config, graph_name, trainers, args)
    after = _cpu_seconds()
    span = after[2] - before[2]
    others = max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / span
    rate, limit = n / seconds, n / compute
    print(
        f"layer-wise inference, {trainers} trainer(s): {rate:,.0f} nodes/s ({seconds:.1f} s for "
        f"{n:,} nodes); ceiling (the same trainers' time in the layers, {compute:.1f} s): "
        f"{limit:,.0f} nodes/s; {100 * rate / limit:.0f}% of it; load average before {load:.1f}; "
        f"cores busy with other processes meanwhile {others:.2f}",
        flush=True,
    )
    if ref is not None:
        same = (ref["batch_size"], ref["num_nodes"], ref["hidden"]) == (args.batch_size, n, args.hidden)
        print(
            f"  DGL {ref['dgl']} ({ref.get('when', '?')}): {ref['nodes_per_s']:,.0f} nodes/s "
            f"({ref['seconds']:.1f} s, {ref['compute_seconds']:.1f} s in its layers); ours / DGL "
            f"{rate / ref['nodes_per_s']:.2f}x" + ("" if same else " (NOT the same set-up)"),
            flush=True,
        )
    return {
        "trainers": trainers, "repeat": rep, "parts": args.parts or trainers,
        "balance_edges": args.balance_edges, "direct": not args.no_direct,
        "threads_per_trainer": args.threads, "seconds": seconds,
        "compute_seconds": compute, "nodes_per_s": rate,
        "ceiling_nodes_per_s": limit, "load_average_1m_before": load,
        "other_processes_cores": others,
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "dgl_nodes_per_s": None if ref is None else ref["nodes_per_s"],
        "ratio_to_dgl": None if ref is None else rate / ref["nodes_per_s"],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.inference_bench", description=__doc__.split("\n\n")[0]
    )
    add_graph_options(ap, default_scale=20)
    ap.add_argument("--trainers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument(
        "--parts", type=int, default=0,
        help="partitions (one server each); 0: as many as trainers, as DGL's one-partition-per-machine runs",
    )  # fmt: skip
    ap.add_argument(
        "--balance-edges", action="store_true",
        help="partitions balanced by in-edges and train nodes too, as DGL's harness makes its own",
    )  # fmt: skip
    ap.add_argument(
        "--dgl-results", type=Path,
        help="JSON lines of benchmarks/dgl_inference_worker.py runs made today: print same-day ratios",
    )  # fmt: skip
    ap.add_argument(
        "--threads", type=int, default=1,
        help="torch (and numba) threads per trainer; 1 as in DGL's harness (OMP_NUM_THREADS=1)",
    )  # fmt: skip
    ap.add_argument(
        "--no-direct", action="store_true",
        help="every layer through the prefetching loader (blocks, pulls), not straight from shared memory",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS / "inference_bench.json")
    ap.add_argument(
        "--repeat", type=int, default=1,
        help="run the trainer counts this many times, interleaved (the machine's load varies)",
    )  # fmt: skip
    ap.add_argument(
        "--no-probe", dest="probe", action="store_false",
        help="skip the CPU probe (the same work in 1 and 2 processes: the machine's 2-trainer ceiling)",
    )  # fmt: skip
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graph-name", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    npz = graph_npz(args)
    # our default METIS partitions (node-balanced; layerwise_inference balances in-edges itself)
    configs = {t: partitioned(npz, args.parts or t, balance=args.balance_edges) for t in args.trainers}
    first = json.loads(next(iter(configs.values())).read_text())
    graph_name, n = first["graph_name"], int(first["num_nodes"])
    results: dict[str, Any] = {
        "graph": npz.name,
        "num_nodes": n,
        "batch_size": args.batch_size,
        "hidden": args.hidden,
        "runs": [],
        "cpu_count": os.cpu_count(),
        "load_average_1m_before": os.getloadavg()[0],
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    dgl: dict[int, dict[str, Any]] = {}
    if args.dgl_results is not None:
        for text in args.dgl_results.read_text().splitlines():
            if text.startswith("{") and '"dgl_inference"' in text:
                row = json.loads(text)
                dgl[int(row["trainers"])] = row
        results["dgl"] = list(dgl.values())
    probes: list[dict[str, float]] = []
    for rep in range(args.repeat):
        if args.probe:
            probes.append(probe_pair())
        for trainers in args.trainers:
            results["runs"].append(
                one_run(configs[trainers], graph_name, n, trainers, args, dgl.get(trainers), rep)
            )
    if args.probe:
        probes.append(probe_pair())
        results["cpu_probe"] = probes
        print(
            "machine ceiling for 2 trainers / 1 (the same CPU work in 1 and 2 processes, before each "
            "repetition and after): "
            + ", ".join(f"{p['speedup_2']:.2f}x ({p['one_s']:.2f} s / {p['two_s']:.2f} s)" for p in probes),
            flush=True,
        )
    for rep in range(args.repeat):
        rates = {r["trainers"]: r["nodes_per_s"] for r in results["runs"] if r["repeat"] == rep}
        if 1 in rates and 2 in rates:
            results.setdefault("speedup_2_over_1", []).append(rates[2] / rates[1])
            print(f"repetition {rep}: 2 trainers / 1: {rates[2] / rates[1]:.2f}x", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
