"""A/B of GraphSAGE's mean aggregation with gradients: CSR products (A @ x forward, A^T @ g
backward) vs gather + index_add, on the same blocks, alternating back to back.

Blocks are shaped like train_bench's batches (batch 1000, fanouts [10, 25] over 2**20 nodes,
in 128, hidden 256, 16 classes), built here without servers. Times are CPU seconds of the one
torch thread (``time.thread_time``), so other processes on the machine change them little; the
figure to read is the ratio, measured in the same run.

Run: ``.venv/bin/python -m benchmarks.sage_ab [--batches 10 --repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import asyncgraph.nn.sage as sage
from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.nn import GraphSAGE


def make_blocks(rng: np.random.Generator, num_nodes: int, batch: int, fanouts: list[int]) -> list[Block]:
    seeds = rng.choice(num_nodes, batch, replace=False)
    blocks: list[Block] = []
    current = seeds
    for fanout in reversed(fanouts):
        dst = np.repeat(current, fanout)
        src = rng.integers(0, num_nodes, dst.size)
        block = to_block(src, dst, current)
        block.csr()  # the loader builds it off the training loop
        blocks.append(block)
        current = block.srcnodes.numpy()
    blocks.reverse()
    return blocks


def step(model: GraphSAGE, blocks: list[Block], x: torch.Tensor, y: torch.Tensor) -> float:
    t0 = time.thread_time()
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(blocks, x), y)
    loss.backward()
    return time.thread_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sage_ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = GraphSAGE(128, 256, 16, 2, dropout=0.5)
    batches = []
    for _ in range(args.batches):
        blocks = make_blocks(rng, 1 << 20, 1000, [10, 25])
        x = torch.randn(blocks[0].num_src_nodes(), 128)
        y = torch.from_numpy(rng.integers(0, 16, blocks[-1].num_dst_nodes()))
        batches.append((blocks, x, y))
    times: dict[bool, list[float]] = {True: [], False: []}
    for flag in (True, False):  # warm-up (and the transposed CSR of each block, built once)
        sage.SPMM_GRAD = flag
        step(model, *batches[0])
    for _ in range(args.repeats):
        for blocks, x, y in batches:
            for flag in (True, False):
                sage.SPMM_GRAD = flag
                times[flag].append(step(model, blocks, x, y))
    sage.SPMM_GRAD = True
    csr, gather = (1000 * float(np.median(times[f])) for f in (True, False))
    out = {
        "csr_ms_per_batch": round(csr, 2),
        "gather_ms_per_batch": round(gather, 2),
        "csr_over_gather": round(csr / gather, 3),
        "edges_per_batch": [b.num_edges() for b in batches[0][0]],
        "threads": args.threads,
        "clock": "thread CPU time, median",
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
