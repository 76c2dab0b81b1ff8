"""Partitioning benchmark: wall time, METIS-only time and peak RSS.

``python -m benchmarks.partition_bench [--scale 20 | --graph PATH.npz] [--dgl-results R.json]``
generates (or reuses) the synthetic graph ``benchmarks/data/synth<scale>.npz`` (or takes
``--graph``), then runs metis and random at 2 and 4 parts, each in a
fresh subprocess whose own peak RSS (``ru_maxrss``, everything included: Python, the loaded
graph, METIS) is reported. With ``--dgl-results`` (DGL measured the same day, see
``benchmarks.common.load_reference``; figures under ``"partition": {"metis2": {"wall_s": ...}}``)
it prints time ratios. Writes ``benchmarks/results/partition_bench.json``.
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

from benchmarks.common import (
    RESULTS,
    ROOT,
    add_graph_options,
    add_reference_option,
    graph_npz,
    load_reference,
    provenance,
)


def _worker(npz: Path, method: str, parts: int) -> dict[str, Any]:
    """Run one configuration in this (fresh) process; returns timings and peak RSS."""
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

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
    add_graph_options(ap, default_scale=20)
    add_reference_option(ap)
    ap.add_argument("--methods", nargs="+", default=["metis", "random"])
    ap.add_argument("--parts", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--out", type=Path, default=RESULTS / "partition_bench.json")
    ap.add_argument("--worker", nargs=3, metavar=("NPZ", "METHOD", "PARTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        npz, method, parts = args.worker
        print(json.dumps(_worker(Path(npz), method, int(parts))))
        return

    npz = graph_npz(args)
    ref = load_reference(args.dgl_results)
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
                cwd=ROOT,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            results.append(json.loads(res.stdout.strip().splitlines()[-1]))

    head = (
        f"{'config':<12} {'load s':>7} {'partition s':>12} {'total s':>8} {'METIS s':>8} "
        f"{'peak GiB':>9}" + (f"   vs {provenance(ref)}" if ref else "")
    )
    print(f"{npz.name}: {results[0]['num_nodes']:,} nodes, {results[0]['num_edges']:,} edges")
    print(head)
    print("-" * len(head))
    for r in results:
        theirs = (ref or {}).get("partition", {}).get(f"{r['method']}{r['num_parts']}")
        ref_s = f"   {r['wall_s'] / theirs['wall_s']:.2f}x time" if theirs else ""
        metis = f"{r['metis_s']:.2f}" if r["metis_s"] is not None else "-"
        print(
            f"{r['method'] + ' ' + str(r['num_parts']) + '-way':<12} {r['load_s']:>7.2f} "
            f"{r['partition_s']:>12.2f} {r['wall_s']:>8.2f} {metis:>8} {r['peak_rss_gib']:>9.2f}   {ref_s}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"graph": str(npz), "reference": ref, "results": results, "cpu_count": os.cpu_count()},
            indent=2,
        )
    )
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
