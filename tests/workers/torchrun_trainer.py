"""A trainer started by ``torchrun`` against servers started separately: asyncgraph reads the
servers from $ASYNCGRAPH_IP_CONFIG and the rank from torchrun's variables; DDP over gloo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import asyncgraph
from asyncgraph.env import process_rank


def main() -> None:
    out = Path(sys.argv[1])
    who = process_rank()
    asyncgraph.initialize()  # servers from $ASYNCGRAPH_IP_CONFIG, retried until they answer
    dist.init_process_group("gloo")
    assert (dist.get_rank(), dist.get_world_size()) == (who.rank, who.world_size)
    g = asyncgraph.DistGraph("cora")
    n = g.num_nodes()
    nids = asyncgraph.node_split(g.ndata["train_mask"][0:n], g.get_partition_book())
    feat, labels = g.ndata["feat"], g.ndata["label"]
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(feat.shape[1], 7))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(3):
        batch = nids[step * 16 : (step + 1) * 16]
        loss = torch.nn.functional.cross_entropy(model(feat[batch]), labels[batch].long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    weight = model.module.weight.detach().clone()
    gathered = [torch.empty_like(weight) for _ in range(who.world_size)]
    dist.all_gather(gathered, weight)
    record = {
        "rank": who.rank,
        "world_size": who.world_size,
        "local_rank": who.local_rank,
        "source": who.source,
        "num_seeds": int(nids.numel()),
        "first_seed": int(nids[0]),
        "losses": losses,
        "replicas_equal": all(torch.equal(weight, w) for w in gathered),
    }
    (out / f"rank{who.rank}.json").write_text(json.dumps(record))
    asyncgraph.barrier("done")
    asyncgraph.finalize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
