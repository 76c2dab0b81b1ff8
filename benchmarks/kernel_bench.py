"""Throughput of ``sample_csc`` on a synthetic power-law CSC against a plain gather ceiling.

Builds (inline, seeded) a CSC with ~1M nodes and ~10M edges whose in-degrees follow a Pareto
(Zipf-like) law with hubs up to 100k in-edges, then times ``sample_csc`` for 1,024 and 25,000
seeds at fanout 10, with and without replacement, for uniformly random seeds and for
degree-biased seeds (what deeper layers see: sources of sampled edges are hub-heavy). The
ceiling is measured in the same run: ``np.take`` of ``indices`` and ``eids`` at the positions of
the same number of edges, the one pass over edge data the kernel cannot avoid.

Run: ``.venv/bin/python -m benchmarks.kernel_bench [--graph PATH.npz]`` (``--graph``: the in-edge
CSC of any npz graph instead); writes ``benchmarks/results/kernel_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.kernels.sampling import sample_csc
from benchmarks.common import RESULTS, median_time

NUM_NODES = 1_000_000
TARGET_EDGES = 10_000_000
MAX_DEGREE = 100_000
FANOUT = 10


def make_power_law_csc(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CSC (indptr, indices, eids) with Pareto-distributed in-degrees summing to ~10M."""
    rng = np.random.default_rng(seed)
    weight = rng.pareto(1.3, NUM_NODES) + 1.0
    deg = np.minimum(np.floor(weight * (TARGET_EDGES / weight.sum())), MAX_DEGREE).astype(np.int64)
    deg[rng.integers(0, NUM_NODES, 4)] = MAX_DEGREE  # make sure a few 100k hubs exist
    indptr = np.zeros(NUM_NODES + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    num_edges = int(indptr[-1])
    indices = rng.integers(0, NUM_NODES, num_edges, dtype=np.int64)
    eids = np.arange(num_edges, dtype=np.int64)
    return indptr, indices, eids


def csc_from_npz(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The in-edge CSC (indptr, indices, eids) of an npz graph's src/dst arrays."""
    with np.load(path) as f:
        src, dst = f["src"].astype(np.int64), f["dst"].astype(np.int64)
        num_nodes = int(f["label"].shape[0]) if "label" in f.files else int(max(src.max(), dst.max())) + 1
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, src[order], np.arange(src.size, dtype=np.int64)


def main() -> None:
    """Run every case, print a table and write the JSON results."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel_bench", description=__doc__)
    ap.add_argument("--graph", type=Path, help="an npz graph (src, dst) instead of the synthetic CSC")
    ap.add_argument("--out", type=Path, default=RESULTS / "kernel_bench.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    indptr, indices, eids = csc_from_npz(args.graph) if args.graph else make_power_law_csc()
    num_nodes = indptr.size - 1
    deg = np.diff(indptr)
    build_s = time.perf_counter() - t0
    print(
        f"graph: {num_nodes:,} nodes, {indices.size:,} edges, mean deg {deg.mean():.2f}, "
        f"max deg {deg.max():,}, deg>{FANOUT}: {np.mean(deg > FANOUT):.1%}, "
        f"deg>{4 * FANOUT}: {np.mean(deg > 4 * FANOUT):.1%} (built in {build_s:.1f}s)"
    )
    seed_rng = np.random.default_rng(1)
    results: list[dict[str, Any]] = []
    header = f"{'seeds':>8} {'dist':>7} {'replace':>7} {'edges':>9} {'ms':>8} {'Medges/s':>9} "
    print(header + f"{'gather ms':>9} {'gather Medges/s':>15} {'ratio':>6}")
    for num_seeds in (1_024, 25_000):
        for dist in ("uniform", "degree"):
            if dist == "uniform":
                seeds = seed_rng.integers(0, num_nodes, num_seeds, dtype=np.int64)
            else:  # endpoint of a random edge: probability proportional to in-degree
                seeds = (
                    np.searchsorted(
                        indptr, seed_rng.integers(0, indices.size, num_seeds), side="right"
                    ).astype(np.int64)
                    - 1
                )
            for replace in (False, True):
                rng = np.random.default_rng(2)
                _, _, sampled = sample_csc(indptr, indices, eids, seeds, FANOUT, replace, rng)
                repeats = 200 if num_seeds < 10_000 else 30

                def run(seeds: np.ndarray = seeds, replace: bool = replace) -> None:
                    sample_csc(indptr, indices, eids, seeds, FANOUT, replace, np.random.default_rng(3))

                pos = sampled.copy()  # eids == positions in this CSC

                def gather(pos: np.ndarray = pos) -> None:
                    np.take(indices, pos)
                    np.take(eids, pos)

                t_kernel = median_time(run, repeats)
                t_gather = median_time(gather, repeats)
                row = {
                    "num_seeds": num_seeds,
                    "seed_distribution": dist,
                    "replace": replace,
                    "fanout": FANOUT,
                    "sampled_edges": int(sampled.size),
                    "kernel_ms": t_kernel * 1e3,
                    "kernel_edges_per_s": sampled.size / t_kernel,
                    "gather_ms": t_gather * 1e3,
                    "gather_edges_per_s": sampled.size / t_gather,
                    "kernel_over_gather_time": t_kernel / t_gather,
                }
                results.append(row)
                print(
                    f"{num_seeds:>8,} {dist:>7} {replace!s:>7} {sampled.size:>9,} {t_kernel * 1e3:>8.3f} "
                    f"{sampled.size / t_kernel / 1e6:>9.2f} {t_gather * 1e3:>9.3f} "
                    f"{sampled.size / t_gather / 1e6:>15.2f} {t_kernel / t_gather:>6.1f}"
                )
    out = {
        "graph": {
            "source": str(args.graph) if args.graph else "synthetic power-law CSC",
            "num_nodes": num_nodes,
            "num_edges": int(indices.size),
            "mean_degree": float(deg.mean()),
            "max_degree": int(deg.max()),
        },
        "machine": {"python": platform.python_version(), "numpy": np.__version__, "cpu": platform.machine()},
        "results": results,
    }
    path = args.out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
