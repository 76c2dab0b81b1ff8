"""KaMinPar (registry ``kaminpar`` 3.7) against pymetis on the same symmetric R-MAT structure.

``python -m benchmarks.kaminpar_vs_metis --scales 18 20 [--parts 4]``: for each graph of
``benchmarks.chunked_bench`` (generated if missing) builds the undirected CSR once
(``symmetric_csr``), then partitions it with pymetis (recursive bisection, as ``partition_graph``
does at <= 8 parts) and with KaMinPar (``--contexts`` presets, default ``default`` and ``fm``,
eps 0.03, 1 and all threads), each in a
fresh process whose peak RSS (``ru_maxrss``) is reported beside its wall time, edge cut (of the
symmetric edges) and node balance (max part / mean). KaMinPar's Python binding reads graphs only
from files, so the CSR is written in ParHIP's binary format first (its time is reported apart).
Writes ``benchmarks/results/kaminpar_vs_metis.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import DATA, RESULTS, ROOT

WORKER = r"""
import json, resource, sys, time
import numpy as np
kind, xadj_p, adj_p, k, threads, parhip, context = sys.argv[1:8]
k, threads = int(k), int(threads)
xadj = np.load(xadj_p); adj = np.load(adj_p)
t0 = time.perf_counter()
if kind == "metis":
    import pymetis
    o = pymetis.Options(); o.seed = 0
    parts = np.asarray(pymetis.part_graph(k, adjacency=pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adj),
                                          recursive=k <= 8, options=o).vertex_part)
    load = 0.0
else:
    import kaminpar
    t = time.perf_counter()
    g = kaminpar.load_graph(parhip, kaminpar.GraphFileFormat.PARHIP)
    load = time.perf_counter() - t
    kaminpar.reseed(0)
    solver = kaminpar.KaMinPar(threads, kaminpar.context_by_name(context))
    parts = np.asarray(solver.compute_partition(g, k, 0.03))
wall = time.perf_counter() - t0
rows = np.repeat(np.arange(xadj.size - 1), np.diff(xadj))
cut = int(np.count_nonzero(parts[rows] != parts[adj])) // 2
sizes = np.bincount(parts, minlength=k)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "load_s": load, "peak_bytes": peak, "cut": cut,
                  "cut_frac": cut / (adj.size // 2), "node_balance": float(sizes.max() / sizes.mean())}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kaminpar_vs_metis", description=__doc__)
    ap.add_argument("--scales", type=int, nargs="+", default=[18])
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--contexts", nargs="+", default=["default", "fm"], help="KaMinPar presets")
    ap.add_argument("--skip-metis", action="store_true")
    ap.add_argument("--data", type=Path, default=DATA, help="folder of the generated graphs")
    ap.add_argument("--graph", choices=["rmat", "synth"], default="rmat",
                    help="chunked_bench's R-MAT graph or partition_bench's graph (synth)")  # fmt: skip
    args = ap.parse_args()
    from asyncgraph.partition.assign import symmetric_csr
    from asyncgraph.partition.assign_stream import _structure, write_parhip
    from asyncgraph.partition.chunked import read_metadata
    from asyncgraph.partition.graph import Graph
    from benchmarks.chunked_bench import GRAPHS

    out = []
    for scale in args.scales:
        prefix, writer = GRAPHS[args.graph]
        meta = writer(scale, args.data / f"{prefix}{scale}")
        g: Graph = _structure(read_metadata(meta), 1 << 22)
        xadj, adj = symmetric_csr(g.num_nodes, g.src, g.dst)
        del g
        tmp = args.data / f"csr_{args.graph}{scale}"
        tmp.mkdir(exist_ok=True)
        np.save(tmp / "xadj.npy", xadj)
        np.save(tmp / "adj.npy", adj)
        write_parhip(tmp / "g.parhip", xadj, adj)
        runs = [("kaminpar", c, t) for c in args.contexts for t in sorted({1, os.cpu_count() or 1})]
        for kind, context, threads in ([("metis", "-", 1)] if not args.skip_metis else []) + runs:
            res = subprocess.run(
                [sys.executable, "-c", WORKER, kind, str(tmp / "xadj.npy"), str(tmp / "adj.npy"),
                 str(args.parts), str(threads), str(tmp / "g.parhip"), context],
                capture_output=True, text=True, cwd=ROOT, check=True,
            )  # fmt: skip
            row = {"scale": scale, "graph": args.graph, "method": kind, "context": context,
                   "threads": threads,
                   "undirected_edges": int(adj.size // 2), "load_avg_1min": os.getloadavg()[0],
                   **json.loads(res.stdout.strip().splitlines()[-1])}  # fmt: skip
            out.append(row)
            print(
                f"{args.graph} {scale} {kind:>8} {context:>7} x{threads}: {row['wall_s']:.1f} s "
                f"(file load {row['load_s']:.1f} s), "
                f"peak {row['peak_bytes'] / 2**30:.2f} GiB, cut {row['cut_frac']:.1%}, "
                f"balance {row['node_balance']:.3f}",
                flush=True,
            )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "kaminpar_vs_metis.json"
    old = json.loads(path.read_text())["runs"] if path.is_file() else []
    keys = {(r["scale"], r["graph"], r["method"], r["context"], r["threads"]) for r in out}
    old = [r for r in old if (r["scale"], r.get("graph", "rmat"), r["method"], r.get("context", "default"),
                              r["threads"]) not in keys]  # fmt: skip
    path.write_text(json.dumps({"runs": old + out}, indent=2))


if __name__ == "__main__":
    main()
