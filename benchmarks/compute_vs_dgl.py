"""GraphSAGE compute per batch, ours against DGL 2.1's, on the very same blocks (issue 9, item 4).

Blocks are sampled once by our sampler from a standalone one-partition copy of ``--graph`` (the
graph DGL's harness generates by default; batch 1000, fanouts [10, 25], as the harness's
end-to-end run), with their input features and labels, and written to one npz. Then two kinds of
process take turns, each in a fresh interpreter with one torch thread: ours
(``asyncgraph.nn.GraphSAGE``: two mean ``SAGEConv`` layers, hidden 256, ReLU and dropout 0.5,
Adam) and DGL's (``benchmarks.dgl_compute_worker`` under DGL's venv: the harness's own model,
two ``dgl.nn.SAGEConv(.., "mean")`` with the same ReLU, dropout and Adam, over
``dgl.create_block`` of the same edges). Each times forward + loss + backward + optimizer step
of every batch (CPU time of its one thread, ``time.thread_time``, after a warm-up pass) for
``--repeats`` passes; the figure is the median per-batch time, and the ratio ours / DGL's.

``DGLBENCH_ROOT=$HOME/.cache/dglbench .venv/bin/python -m benchmarks.compute_vs_dgl`` writes
``benchmarks/results/compute_vs_dgl.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, partitioned

ROOT = Path(__file__).resolve().parent.parent


def sample_batches(npz: Path, batches: int, batch_size: int, fanouts: list[int], out: Path) -> dict[str, Any]:
    """Sample ``batches`` mini-batches with our sampler; write edges, features and labels to ``out``."""
    from asyncgraph.client.async_client import AsyncClient
    from asyncgraph.dataloading import relabel_kernel
    from asyncgraph.dataloading.sampler import NeighborSampler
    from asyncgraph.kernels import compiled

    compiled.wait_ready(120)
    relabel_kernel.wait_ready(120)
    client = AsyncClient.standalone(partitioned(npz, 1, "random"))
    sampler = NeighborSampler(fanouts)
    rng = np.random.default_rng(0)
    n = client.book.num_nodes
    arrays: dict[str, np.ndarray] = {}
    stats = {"input_nodes": [], "edges": []}

    async def one(b: int) -> None:
        seeds = np.sort(rng.choice(n, batch_size, replace=False))

        async def sample_fn(
            layer_seeds: np.ndarray, fanout: int
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            return await client.sample_neighbors(layer_seeds, fanout, seed=b * 7919 + int(fanout))

        input_nodes, _, blocks = await sampler.sample_blocks(sample_fn, seeds)
        for layer, block in enumerate(blocks):
            ei = block.edge_index.numpy()
            arrays[f"b{b}_l{layer}_src"] = ei[0].astype(np.int64)
            arrays[f"b{b}_l{layer}_dst"] = ei[1].astype(np.int64)
            arrays[f"b{b}_l{layer}_shape"] = np.array(
                [block.num_src_nodes(), block.num_dst_nodes()], np.int64
            )
        arrays[f"b{b}_x"] = await client.pull_numpy("node:feat", input_nodes)
        labels = await client.pull_numpy("node:label", seeds)
        arrays[f"b{b}_y"] = labels.astype(np.int64).reshape(-1)
        stats["input_nodes"].append(int(input_nodes.size))
        stats["edges"].append(sum(blk.num_edges() for blk in blocks))

    async def run() -> None:
        for b in range(batches):
            await one(b)

    asyncio.run(run())
    np.savez(out, num_batches=np.array(batches), num_layers=np.array(len(fanouts)), **arrays)
    return {
        "mean_input_nodes": float(np.mean(stats["input_nodes"])),
        "mean_block_edges": float(np.mean(stats["edges"])),
    }


def ours_worker(blocks_npz: str, repeats: int, hidden: int, classes: int) -> dict[str, Any]:
    """Per-batch forward + backward + Adam step of our GraphSAGE (one torch thread)."""
    import torch

    from asyncgraph.dataloading.block import Block
    from asyncgraph.nn import GraphSAGE

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = np.load(blocks_npz)
    nb, nl = int(data["num_batches"]), int(data["num_layers"])
    batches = []
    for b in range(nb):
        blocks = []
        for layer in range(nl):
            num_src, num_dst = (int(v) for v in data[f"b{b}_l{layer}_shape"])
            src, dst = data[f"b{b}_l{layer}_src"], data[f"b{b}_l{layer}_dst"]
            blocks.append(
                Block(
                    srcnodes=torch.arange(num_src),
                    dstnodes=torch.arange(num_dst),
                    edge_index=torch.from_numpy(np.stack([src, dst])),
                    eids=torch.empty(0, dtype=torch.int64),
                )
            )
        for block in blocks:
            block.csr()  # our loader builds it off the training loop, in the prefetcher
        batches.append((blocks, torch.from_numpy(data[f"b{b}_x"]), torch.from_numpy(data[f"b{b}_y"])))
    model = GraphSAGE(batches[0][1].shape[1], hidden, classes, nl, dropout=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)

    def step(blocks: list[Block], x: torch.Tensor, y: torch.Tensor) -> float:
        t0 = time.thread_time()
        out = model(blocks, x)
        loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.thread_time() - t0

    for blocks, x, y in batches[:2]:
        step(blocks, x, y)
    times = [[step(*batch) for batch in batches] for _ in range(repeats)]
    return {"per_batch_ms": [sum(t) / len(t) * 1e3 for t in times]}


def run_worker(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed:\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.compute_vs_dgl", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--graph", type=Path, default=ROOT / "benchmarks" / "data" / "dgl20.npz")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--fanouts", default="10,25")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--classes", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the batches per process")
    ap.add_argument("--rounds", type=int, default=2, help="ours/DGL process pairs, alternating")
    ap.add_argument("--dgl-python", help="DGL venv's python (default $DGLBENCH_ROOT/venv/bin/python)")
    ap.add_argument("--out", type=Path, default=RESULTS / "compute_vs_dgl.json")
    ap.add_argument(
        "--worker", nargs=4, metavar=("NPZ", "REPEATS", "HIDDEN", "CLASSES"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.worker:
        npz, repeats, hidden, classes = args.worker
        print(json.dumps(ours_worker(npz, int(repeats), int(hidden), int(classes))))
        return
    dgl_python = args.dgl_python or os.path.join(os.environ.get("DGLBENCH_ROOT", ""), "venv", "bin", "python")
    if not os.path.exists(dgl_python):
        sys.exit(f"no DGL python at {dgl_python!r}: set DGLBENCH_ROOT (../shared/peers/dgl/README.md)")
    fanouts = [int(f) for f in args.fanouts.split(",")]
    with tempfile.TemporaryDirectory(prefix="compute-vs-dgl-") as tmp:
        blocks_npz = Path(tmp) / "blocks.npz"
        shape = sample_batches(args.graph, args.batches, args.batch_size, fanouts, blocks_npz)
        print(f"{args.batches} batches: {shape['mean_input_nodes']:.0f} input nodes, "
              f"{shape['mean_block_edges']:.0f} block edges per batch", flush=True)  # fmt: skip
        common = [str(blocks_npz), str(args.repeats), str(args.hidden), str(args.classes)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        ours: list[float] = []
        theirs: list[float] = []
        for r in range(args.rounds):
            a = run_worker([sys.executable, "-m", "benchmarks.compute_vs_dgl", "--worker", *common], env)
            b = run_worker([dgl_python, str(ROOT / "benchmarks" / "dgl_compute_worker.py"), *common], env)
            ours += a["per_batch_ms"]
            theirs += b["per_batch_ms"]
            print(f"round {r}: ours {statistics.median(a['per_batch_ms']):7.2f} ms/batch   "
                  f"DGL {statistics.median(b['per_batch_ms']):7.2f} ms/batch", flush=True)  # fmt: skip
    o, t = statistics.median(ours), statistics.median(theirs)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "graph": str(args.graph),
        "batch_size": args.batch_size,
        "fanouts": fanouts,
        "hidden": args.hidden,
        "classes": args.classes,
        **shape,
        "ours_ms_per_batch": round(o, 2),
        "dgl_ms_per_batch": round(t, 2),
        "ours_over_dgl": round(o / t, 3),
        "ours_passes_ms": [round(v, 2) for v in ours],
        "dgl_passes_ms": [round(v, 2) for v in theirs],
        "threads": 1,
    }
    print(f"forward + backward + Adam, one thread: ours {o:.2f} ms/batch, DGL 2.1 {t:.2f} ms/batch, "
          f"ours/DGL {o / t:.3f}", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
