"""Trainer body for spawn_trainers tests: a few DDP (gloo) GraphSAGE steps over a tiny graph."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import asyncgraph
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import ddp_backend, trainer_device
from asyncgraph.nn import GraphSAGE


def train(rank: int, out: str, steps: int) -> None:
    """Train ``steps`` batches with DDP, then write this rank's env and final weights' checksum."""
    config = asyncgraph.PartitionConfig.load(os.environ["ASYNCGRAPH_PART_CONFIG"])
    g = asyncgraph.DistGraph(config.graph_name)
    device = trainer_device()
    n = g.num_nodes()
    nids = asyncgraph.node_split(
        g.ndata["train_mask"][0:n], g.get_partition_book(), rank=rank, world_size=dist.get_world_size()
    )
    loader = DistNodeDataLoader(g, nids, NeighborSampler([3, 3]), 16, prefetch=2, seed=rank, device=device)
    torch.manual_seed(0)
    model = DistributedDataParallel(GraphSAGE(int(g.ndata["feat"].shape[1]), 8, 7, 2, dropout=0.0).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    done = 0
    while done < steps:
        for batch in loader:
            x, y = batch.blocks[0].srcdata["feat"], batch.blocks[-1].dstdata["label"]
            assert x.device == device and y.device == device
            loss = F.cross_entropy(model(batch.blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    asyncgraph.barrier("done")
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "ASYNCGRAPH_DEVICE", "ASYNCGRAPH_DDP_BACKEND"]
    record = {
        "env": {k: os.environ.get(k) for k in keys},
        "backend": ddp_backend(),
        "dist_backend": str(dist.get_backend()),
        "world": dist.get_world_size(),
        "device": str(device),
        "checksum": checksum,
        "steps": done,
        "distributed": not asyncgraph.is_standalone(),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def fail_on_rank_1(rank: int, out: str) -> None:
    """Rank 1 raises after both joined the process group; rank 0 waits until it is torn down."""
    Path(out, f"started{rank}").write_text(str(os.getpid()))
    dist.barrier()  # both joined the process group
    if rank == 1:
        raise RuntimeError("trainer 1 failed on purpose")
    time.sleep(120)  # spawn terminates this rank as soon as it sees rank 1 fail
