"""Throughput of ``sample_csc`` on a synthetic power-law CSC against a plain gather ceiling.

Builds (inline, seeded) a CSC with ~1M nodes and ~10M edges whose in-degrees follow a Pareto
(Zipf-like) law with hubs up to 100k in-edges, then times ``sample_csc`` for 1,024 and 25,000
seeds at fanout 10, with and without replacement, for uniformly random seeds and for
degree-biased seeds (what deeper layers see: sources of sampled edges are hub-heavy). The
ceiling is measured in the same run: ``np.take`` of ``indices`` and ``eids`` at the positions of
the same number of edges, the one pass over edge data the kernel cannot avoid.

Run: ``.venv/bin/python benchmarks/kernel_bench.py``; writes ``benchmarks/results/kernel_bench.json``.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.kernels.sampling import sample_csc

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


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    """Run every case, print a table and write the JSON results."""
    t0 = time.perf_counter()
    indptr, indices, eids = make_power_law_csc()
    deg = np.diff(indptr)
    build_s = time.perf_counter() - t0
    print(
        f"graph: {NUM_NODES:,} nodes, {indices.size:,} edges, mean deg {deg.mean():.2f}, "
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
                seeds = seed_rng.integers(0, NUM_NODES, num_seeds, dtype=np.int64)
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

                t_kernel = best_time(run, repeats)
                t_gather = best_time(gather, repeats)
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
            "num_nodes": NUM_NODES,
            "num_edges": int(indices.size),
            "mean_degree": float(deg.mean()),
            "max_degree": int(deg.max()),
        },
        "machine": {"python": platform.python_version(), "numpy": np.__version__, "cpu": platform.machine()},
        "results": results,
    }
    path = Path(__file__).resolve().parent / "results" / "kernel_bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
