"""A launched trainer that records which seeds it visits per epoch (and checks its batches)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

import asyncgraph
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler


def main() -> None:
    out = Path(sys.argv[1])
    asyncgraph.initialize()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    config = asyncgraph.PartitionConfig.load(os.environ["ASYNCGRAPH_PART_CONFIG"])
    g = asyncgraph.DistGraph(config.graph_name)
    n = g.num_nodes()
    nids = asyncgraph.node_split(
        g.ndata["train_mask"][0:n], g.get_partition_book(), rank=rank, world_size=world
    )
    loader = DistNodeDataLoader(g, nids, NeighborSampler([4, 3]), batch_size=9, prefetch=2, seed=rank)
    feat = g.ndata["feat"]
    for epoch in range(2):
        seen = []
        for input_nodes, seeds, blocks in loader:
            assert torch.equal(blocks[0].srcnodes, input_nodes)
            assert torch.equal(blocks[-1].dstnodes, seeds)
            assert torch.equal(blocks[0].srcdata["feat"], feat[input_nodes])
            seen.append(seeds.numpy())
        np.save(out / f"seeds_r{rank}_e{epoch}.npy", np.concatenate(seen))
    np.save(out / f"nids_r{rank}.npy", nids.numpy())
    asyncgraph.barrier("done")
    asyncgraph.finalize()


if __name__ == "__main__":
    main()
