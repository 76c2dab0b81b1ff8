"""Layer-wise inference throughput: nodes per second for every node of a graph, 1 and 2 trainers.

Same set-up as DGL's distributed GraphSAGE ``inference()`` (its examples): a 2-layer GraphSAGE
(128 -> ``--hidden`` -> 50, mean), full neighbourhoods, batches of ``--batch-size`` nodes, on the
synthetic graph of ``--scale`` (default 20: 2**20 nodes, ~10.6M edges, DGL's benchmark graph) in 2
METIS partitions, one server per partition. Each trainer runs
``asyncgraph.inference.layerwise_inference`` over its ``node_split`` share; the figure is
``num_nodes / slowest trainer's wall time``.

Ceiling, measured in the same run: the compute alone. One process builds the same one-layer blocks
from the graph in memory (no servers, no pulls) for ``--ceiling-batches`` batches, times only the
layers' forward passes (wall time, one torch thread, as the trainers) and extrapolates to every node;
``trainers x`` that rate is what the trainers would reach if data movement were free and each had
a core of its own.

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

import numpy as np
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

    torch.set_num_threads(1)
    asyncgraph.initialize()
    g = asyncgraph.DistGraph(args.graph_name)
    model = _model(int(g.ndata["feat"].shape[1]), args.hidden)
    g.barrier("bench.start")
    t0 = time.perf_counter()
    out = layerwise_inference(g, model, "feat", batch_size=args.batch_size, name="bench")
    seconds = time.perf_counter() - t0
    rank = g.rank()
    g.barrier("bench.end")
    if rank == 0:
        out.delete()
        g.ndata["bench.done"].delete()
    print("RESULT " + json.dumps({"rank": rank, "seconds": seconds}), flush=True)
    asyncgraph.finalize()


def run_trainers(part_config: Path, graph_name: str, trainers: int, args: argparse.Namespace) -> float:
    """Servers for 2 partitions and ``trainers`` worker processes; the slowest trainer's seconds."""
    from asyncgraph.testing import start_servers

    with tempfile.TemporaryDirectory(prefix="inference-bench-") as tmp:
        group = start_servers(part_config, Path(tmp), num_parts=2, num_clients=trainers)
        try:
            procs = []
            for rank in range(trainers):
                env = {
                    **subprocess_env(),
                    "ASYNCGRAPH_IP_CONFIG": str(group.ip_config()),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(trainers),
                    "OMP_NUM_THREADS": "1",
                }
                cmd = [
                    sys.executable, "-m", "benchmarks.inference_bench", "--worker",
                    "--graph-name", graph_name, "--batch-size", str(args.batch_size),
                    "--hidden", str(args.hidden),
                ]  # fmt: skip
                procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True))
            seconds = []
            for p in procs:
                out, _ = p.communicate(timeout=args.timeout)
                if p.returncode != 0:
                    raise SystemExit(f"a trainer failed (status {p.returncode})")
                line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
                seconds.append(float(json.loads(line[7:])["seconds"]))
            return max(seconds)
        finally:
            group.stop()


def compute_ceiling(npz: Path, args: argparse.Namespace) -> dict[str, float]:
    """Nodes per second of the two layers' forward passes alone on in-memory blocks (one thread)."""
    from asyncgraph.dataloading import to_block

    torch.set_num_threads(1)
    z = np.load(npz)
    src, dst, feat = z["src"], z["dst"], z["feat"]
    n = int(feat.shape[0])
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    in_src = src[order]
    model = _model(int(feat.shape[1]), args.hidden)
    rng = np.random.default_rng(0)
    perm = rng.permutation(n)
    layer_seconds = [0.0, 0.0]
    nodes = 0
    hidden = torch.randn(n, args.hidden)  # layer 1's input rows (values do not change the cost)
    with torch.no_grad():
        for b in range(args.ceiling_batches):
            seeds = np.sort(perm[b * args.batch_size : (b + 1) * args.batch_size])
            deg = indptr[seeds + 1] - indptr[seeds]
            starts = np.repeat(indptr[seeds] - np.cumsum(deg) + deg, deg) + np.arange(int(deg.sum()))
            block = to_block(in_src[starts], np.repeat(seeds, deg), seeds)
            block.csr()
            ids = block.srcnodes.numpy()
            for i, h in enumerate((torch.from_numpy(feat[ids]), hidden[ids])):
                t0 = time.perf_counter()
                out = model.layers[i](block, h)
                if i == 0:
                    out = torch.relu(out)
                layer_seconds[i] += time.perf_counter() - t0
            nodes += seeds.size
    per_node = sum(layer_seconds) / max(nodes, 1)
    return {"nodes_per_s_one_core": 1.0 / per_node, "batches": args.ceiling_batches, "num_nodes": n}


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.inference_bench", description=__doc__.split("\n\n")[0]
    )
    add_graph_options(ap, default_scale=20)
    ap.add_argument("--trainers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--ceiling-batches", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graph-name", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    npz = graph_npz(args)
    part_config = partitioned(npz, 2)
    graph_name = json.loads(part_config.read_text())["graph_name"]
    ceiling = compute_ceiling(npz, args)
    n = int(ceiling["num_nodes"])
    results: dict[str, Any] = {
        "graph": npz.name,
        "num_nodes": n,
        "batch_size": args.batch_size,
        "hidden": args.hidden,
        "ceiling_compute_nodes_per_s_one_core": ceiling["nodes_per_s_one_core"],
        "runs": [],
        "cpu_count": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    for trainers in args.trainers:
        seconds = run_trainers(part_config, graph_name, trainers, args)
        rate = n / seconds
        limit = trainers * ceiling["nodes_per_s_one_core"]
        print(
            f"layer-wise inference, {trainers} trainer(s): {rate:,.0f} nodes/s ({seconds:.1f} s for "
            f"{n:,} nodes); ceiling (compute only, {trainers} core(s)): {limit:,.0f} nodes/s "
            f"= {100 * rate / limit:.0f}% of it",
            flush=True,
        )
        results["runs"].append(
            {"trainers": trainers, "seconds": seconds, "nodes_per_s": rate, "ceiling": limit}
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "inference_bench.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
