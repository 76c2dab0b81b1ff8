"""Partitioning benchmark: wall time, METIS-only time and peak RSS vs DGL's reference numbers.

``python -m benchmarks.partition_bench [--scale 20]`` generates (or reuses) the synthetic graph
``benchmarks/data/synth<scale>.npz``, then runs metis and random at 2 and 4 parts, each in a
fresh subprocess whose own peak RSS (``ru_maxrss``, everything included: Python, the loaded
graph, METIS) is reported. Writes ``benchmarks/results/partition_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# DGL reference (2^20 nodes, ~10.6M edges, 128-d float32 features; 2-way).
DGL_REF = {
    "metis": {"wall_s": 26.0, "metis_s": 5.0, "peak_gib": 3.3},
    "random": {"wall_s": 16.0, "peak_gib": 3.3},
}


def _worker(npz: Path, method: str, parts: int) -> dict[str, Any]:
    """Run one configuration in this (fresh) process; returns timings and peak RSS."""
    from asyncgraph.graph import Graph
    from asyncgraph.partition import partition_graph

    stages: dict[str, float] = {}

    class _Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            name = getattr(record, "stage", None)
            if name is not None:
                stages[name] = stages.get(name, 0.0) + float(getattr(record, "seconds", 0.0))

    log = logging.getLogger("asyncgraph.partition")
    log.addHandler(_Grab())
    log.setLevel(logging.INFO)
    t0 = time.perf_counter()
    graph = Graph.from_npz(npz)
    t1 = time.perf_counter()
    out = Path(tempfile.mkdtemp(prefix="partbench-")) / "out"
    try:
        partition_graph(graph, "synth", parts, out, part_method=method)
        t2 = time.perf_counter()
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    return {
        "method": method,
        "num_parts": parts,
        "load_s": t1 - t0,
        "partition_s": t2 - t1,
        "wall_s": t2 - t0,
        "metis_s": stages.get("metis"),
        "stages": stages,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB on Linux
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
    }


def main() -> None:
    """Generate/load the graph, run each configuration in a subprocess, print and save a table."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.partition_bench", description=__doc__)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--methods", nargs="+", default=["metis", "random"])
    ap.add_argument("--parts", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "partition_bench.json")
    ap.add_argument("--worker", nargs=3, metavar=("NPZ", "METHOD", "PARTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        npz, method, parts = args.worker
        print(json.dumps(_worker(Path(npz), method, int(parts))))
        return

    npz = HERE / "data" / f"synth{args.scale}.npz"
    if not npz.is_file():
        print(f"generating {npz}…", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "benchmarks.synthetic", "--scale", str(args.scale), "--out", str(npz)],
            check=True,
            cwd=HERE.parent,
        )
    results = []
    for method in args.methods:
        for parts in args.parts:
            print(f"running {method} {parts}-way…", file=sys.stderr, flush=True)
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.partition_bench",
                    "--worker",
                    str(npz),
                    method,
                    str(parts),
                ],
                check=True,
                cwd=HERE.parent,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            results.append(json.loads(res.stdout.strip().splitlines()[-1]))

    head = (
        f"{'config':<12} {'load s':>7} {'partition s':>12} {'total s':>8} {'METIS s':>8} "
        f"{'peak GiB':>9}   DGL reference (2-way)"
    )
    print(
        f"synthetic scale {args.scale}: {results[0]['num_nodes']:,} nodes, "
        f"{results[0]['num_edges']:,} edges, 128-d float32 features"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        ref = DGL_REF.get(r["method"], {})
        ref_s = f"{ref['wall_s']:.0f} s / {ref['peak_gib']:.1f} GiB" if ref else ""
        if "metis_s" in ref:
            ref_s += f" (METIS {ref['metis_s']:.0f} s)"
        metis = f"{r['metis_s']:.2f}" if r["metis_s"] is not None else "-"
        print(
            f"{r['method'] + ' ' + str(r['num_parts']) + '-way':<12} {r['load_s']:>7.2f} "
            f"{r['partition_s']:>12.2f} {r['wall_s']:>8.2f} {metis:>8} {r['peak_rss_gib']:>9.2f}   {ref_s}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"scale": args.scale, "dgl_reference": DGL_REF, "results": results, "cpu_count": os.cpu_count()},
            indent=2,
        )
    )
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
