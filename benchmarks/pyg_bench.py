"""PyG loaders over asyncgraph, side by side (issue 25): batches per second and what limits them.

Configurations, all on the same graph in the same run (one trainer process):
* (a) PyG's in-memory ``NeighborLoader`` (the whole graph in this process): needs pyg-lib or
  torch-sparse; where neither installs its exact error is recorded instead.
* (b) PyG 2.8's deprecated ``torch_geometric.distributed.DistNeighborLoader``: its sampler calls
  ``torch.ops.pyg.dist_neighbor_sample`` (pyg-lib); where that op is missing the exact error is
  recorded instead.
* ``ours_standalone``: ``asyncgraph.pyg.DistNeighborLoader`` on 1 partition held in-process (no
  server): what stands in for (a) where (a) cannot run.
* ``ours_2parts``: the same loader against 2 partition servers on this host (``asyncgraph.testing``),
  the trainer reading co-located partitions through shared memory, as launched trainers do.
* ``nodeloader_2parts``: PyG's own ``NodeLoader`` with our ``DistNeighborSampler`` on the same 2
  servers (PyG's loader samples in the training loop: no overlap).

Each runs ``--batches`` batches of ``--batch-size`` seeds (every node a seed, shuffled) with
``--num-neighbors`` under two steps: ``fixed`` (a ``--fixed-ms`` sleep: an accelerator-like step)
and ``sage`` (PyG's GraphSAGE forward, backward, Adam step), the median of ``--repeats`` rounds with
the configurations interleaved (this VM is shared; ``loadavg_*`` are recorded). Ceilings, same run:
``fixed`` -> 1000 / fixed-ms batches/s; ``sage`` -> the GraphSAGE step alone on batches held in
memory (the loaders' batches, materialised first). Writes ``benchmarks/results/pyg_bench.json``.

Run: ``.venv/bin/python -m benchmarks.pyg_bench`` (PubMed; about a minute on an idle 2-core VM).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import asyncgraph
from benchmarks.common import RESULTS, ROOT, partitioned


def pyg_inmemory_status(npz: Path, fanouts: list[int], batch_size: int) -> dict[str, Any]:
    """(a): run PyG's NeighborLoader on the whole graph in memory, or record why it cannot."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    z = np.load(npz)
    data = Data(
        x=torch.from_numpy(z["feat"]),
        y=torch.from_numpy(z["label"]),
        edge_index=torch.from_numpy(np.stack([z["src"], z["dst"]])),
    )
    try:
        loader = NeighborLoader(data, fanouts, batch_size=batch_size, shuffle=True)
        next(iter(loader))
    except ImportError as exc:
        return {"runs": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"runs": True, "loader": loader}


def pyg_distributed_status() -> dict[str, Any]:
    """(b): PyG's deprecated distributed sampler needs ``torch.ops.pyg.dist_neighbor_sample``."""
    import warnings

    import torch_geometric.typing as pyg_typing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch_geometric.distributed  # noqa: F401  (it still ships in 2.8)
    try:
        torch.ops.pyg.dist_neighbor_sample  # noqa: B018  (the op its DistNeighborSampler calls)
    except (AttributeError, RuntimeError) as exc:
        return {
            "runs": False,
            "with_pyg_lib": bool(pyg_typing.WITH_PYG_LIB),
            "error": f"{type(exc).__name__}: {exc}",
        }
    return {"runs": True}


def time_loader(loader: Any, batches: int, step: Any) -> dict[str, float]:
    """Batches/s over ``batches`` batches (after one warm-up batch) with ``step`` per batch."""
    it = iter(loader)
    step(next(it))
    t0 = time.perf_counter()
    n = 0
    waited = 0.0
    for _ in range(batches):
        w0 = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - w0
        step(b)
        n += 1
    wall = time.perf_counter() - t0
    return {"batches": n, "seconds": wall, "batches_per_s": n / wall, "wait_fraction": waited / wall}


def make_steps(fixed_ms: float, in_dim: int, classes: int) -> dict[str, Any]:
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(0)
    model = GraphSAGE(in_dim, 64, num_layers=2, out_channels=classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def fixed(b: Any) -> None:
        time.sleep(fixed_ms / 1000)

    def sage(b: Any) -> None:
        opt.zero_grad()
        out = model(b.x, b.edge_index)[: b.batch_size]
        torch.nn.functional.cross_entropy(out, b.y[: b.batch_size]).backward()
        opt.step()

    return {"fixed": fixed, "sage": sage}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", type=Path, default=ROOT / "examples" / "data" / "pubmed.npz")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--num-neighbors", default="10,5")
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--fixed-ms", type=float, default=40.0)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="rounds per configuration (median reported)")
    ap.add_argument("--out", type=Path, default=RESULTS / "pyg_bench.json")
    args = ap.parse_args()
    fanouts = [int(f) for f in args.num_neighbors.split(",")]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from asyncgraph.pyg import DistFeatureStore, DistGraphStore, DistNeighborLoader, DistNeighborSampler
    from asyncgraph.testing import start_servers

    z = np.load(args.graph)
    in_dim, classes = int(z["feat"].shape[1]), int(z["label"].max()) + 1
    steps = make_steps(args.fixed_ms, in_dim, classes)
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "graph": args.graph.name,
        "batch_size": args.batch_size,
        "num_neighbors": fanouts,
        "batches": args.batches,
        "fixed_ms": args.fixed_ms,
        "torch_threads": torch.get_num_threads(),
    }
    a = pyg_inmemory_status(args.graph, fanouts, args.batch_size)
    result["a_pyg_inmemory"] = {k: v for k, v in a.items() if k != "loader"}
    result["b_pyg_distributed"] = pyg_distributed_status()
    rows: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    ceiling_runs: list[float] = []
    phase_of: dict[str, int] = {}  # configuration -> index of its phase (standalone, 2 servers)
    phase_ceilings: list[list[float]] = []
    held: list[Any] = []

    def measure(makers: dict[str, Any]) -> None:
        """``--repeats`` rounds, configurations interleaved; the sage ceiling timed in each round."""
        phase_ceilings.append([])
        for name in makers:
            phase_of[name] = len(phase_ceilings) - 1
        for _ in range(args.repeats):
            for name, make in makers.items():
                for step, fn in steps.items():
                    runs.setdefault(name, {}).setdefault(step, []).append(
                        time_loader(make(), args.batches, fn)
                    )
            t0 = time.perf_counter()
            for b in held:
                steps["sage"](b)
            ceiling_runs.append(len(held) / (time.perf_counter() - t0))
            phase_ceilings[-1].append(ceiling_runs[-1])

    def ours(g: Any) -> Any:
        return DistNeighborLoader(
            g, fanouts, batch_size=args.batch_size, shuffle=True, seed=0, prefetch=args.prefetch
        )

    cfg1 = partitioned(args.graph, 1)
    asyncgraph.initialize()
    g = asyncgraph.DistGraph(args.graph.stem, part_config=cfg1)
    held = [b for _, b in zip(range(args.batches), ours(g), strict=False)]  # for the sage ceiling
    if a["runs"]:
        measure({"a_pyg_inmemory": lambda: a["loader"], "ours_standalone": lambda: ours(g)})
    else:
        measure({"ours_standalone": lambda: ours(g)})
    asyncgraph.finalize()
    cfg2 = partitioned(args.graph, 2)
    with tempfile.TemporaryDirectory() as tmp:
        group = start_servers(cfg2, Path(tmp), num_parts=2)
        try:
            asyncgraph.initialize(group.ip_config())
            g2 = asyncgraph.DistGraph(args.graph.stem)
            from torch_geometric.loader import NodeLoader

            def nodeloader() -> Any:
                sampler = DistNeighborSampler(g2, fanouts, seed=0)
                fs, gs = DistFeatureStore(g2), DistGraphStore(g2)
                every = torch.arange(g2.num_nodes())
                return NodeLoader(
                    (fs, gs),
                    node_sampler=sampler,
                    input_nodes=every,
                    batch_size=args.batch_size,
                    shuffle=True,
                )

            measure({"ours_2parts": lambda: ours(g2), "nodeloader_2parts": nodeloader})
            asyncgraph.finalize()
        finally:
            group.stop()
    for name, by_step in runs.items():
        rows[name] = {
            step: {
                "batches_per_s": float(np.median([r["batches_per_s"] for r in rs])),
                "wait_fraction": float(np.median([r["wait_fraction"] for r in rs])),
                "runs": [round(r["batches_per_s"], 3) for r in rs],
                "ceiling": 1000.0 / args.fixed_ms
                if step == "fixed"
                else float(np.median(phase_ceilings[phase_of[name]])),
            }
            for step, rs in by_step.items()
        }
    ceilings = {"fixed": 1000.0 / args.fixed_ms, "sage": float(np.median(ceiling_runs))}
    result["sage_ceiling_runs"] = [round(c, 3) for c in ceiling_runs]
    result["loadavg_end"] = list(os.getloadavg())
    result["ceiling_batches_per_s"] = ceilings
    result["rows"] = rows
    ref = rows.get("a_pyg_inmemory", rows["ours_standalone"])
    result["reference_for_a"] = "a_pyg_inmemory" if "a_pyg_inmemory" in rows else "ours_standalone"
    print(
        f"graph {args.graph.name}, batch {args.batch_size}, num_neighbors {fanouts}, {args.batches} batches"
    )
    print(f"(a) PyG in-memory NeighborLoader: {result['a_pyg_inmemory'].get('error', 'runs')}")
    print(f"(b) PyG distributed DistNeighborLoader: {result['b_pyg_distributed'].get('error', 'runs')}")
    for step in steps:
        print(f"step {step}: ceiling {ceilings[step]:.2f} batches/s (median; per row: its phase's)")
        for name, r in rows.items():
            x = r[step]
            rate = x["batches_per_s"]
            print(
                f"  {name:20s} {rate:7.2f} batches/s  ({rate / x['ceiling']:.0%} of {x['ceiling']:.2f}, "
                f"{rate / ref[step]['batches_per_s']:.2f}x {result['reference_for_a']}, "
                f"waiting {x['wait_fraction']:.0%})"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
