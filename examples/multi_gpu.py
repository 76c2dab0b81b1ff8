"""Multi-GPU GraphSAGE on one machine: DGL's multi-GPU tutorial pattern with asyncgraph.

``spawn_trainers`` serves the partitions on this machine and spawns one trainer per GPU
(``torch.multiprocessing.spawn``); each trainer attaches to the same servers, takes its share of
the training nodes, receives its batches on its GPU (copied on a side stream while the previous
batch trains) and keeps its model in step with the others through DDP over nccl. On a machine
without a GPU, ``--device cpu`` runs the same program with gloo::

    python examples/multi_gpu.py --part-config data/cora2/cora.json --device cpu --num-trainers 2

Without ``--part-config`` Cora is partitioned into 2 parts in a temporary folder first.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import asyncgraph
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import spawn_trainers, trainer_device
from asyncgraph.nn import GraphSAGE

DATA = Path(__file__).resolve().parent / "data"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part-config", type=Path, default=None)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--num-trainers", type=int, default=0, help="default: one per GPU, or 2 on CPU")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--sync-copy", action="store_true", help="copy batches synchronously (no overlap)")
    p.add_argument("--amp", action="store_true", help="train under torch.autocast (bf16 on CPU, fp16 on GPU)")
    return p.parse_args()


def train(rank: int, args: argparse.Namespace) -> None:
    """One trainer: asyncgraph and the process group are already initialised by spawn_trainers."""
    device = trainer_device()
    world = dist.get_world_size()
    config = asyncgraph.PartitionConfig.load(os.environ["ASYNCGRAPH_PART_CONFIG"])
    g = asyncgraph.DistGraph(config.graph_name)
    n = g.num_nodes()
    book = g.get_partition_book()
    train_nids = asyncgraph.node_split(
        g.ndata["train_mask"][0:n], book, rank=rank, world_size=world, force_even=True
    )
    # a graph without a val mask trains without validation (split_masks says so once)
    val_nids = asyncgraph.split_masks(g, ["val_mask"], rank=rank, world_size=world).get(
        "val_mask", torch.empty(0, dtype=torch.int64)
    )
    num_classes = int(g.ndata["label"][0:n].max()) + 1
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sampler = NeighborSampler(fanouts)
    on_device = {"device": device, "overlap": not args.sync_copy, "prefetch": args.prefetch}
    train_loader = DistNodeDataLoader(g, train_nids, sampler, args.batch_size, seed=rank, **on_device)
    val_loader = DistNodeDataLoader(g, val_nids, sampler, 1000, shuffle=False, seed=rank, **on_device)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GraphSAGE(int(g.ndata["feat"].shape[1]), args.hidden, num_classes, len(fanouts)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and device.type == "cuda")
    steps_t = torch.tensor([len(train_loader)], device=device)
    dist.all_reduce(steps_t, op=dist.ReduceOp.MIN)  # DDP needs the same number of steps on every rank
    steps = int(steps_t)
    acc = 0.0
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        total = torch.zeros(2, dtype=torch.float64, device=device)
        for i, batch in enumerate(train_loader):
            if i == steps:
                break
            x, y = batch.blocks[0].srcdata["feat"], batch.blocks[-1].dstdata["label"]
            with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                loss = F.cross_entropy(ddp(batch.blocks, x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            total[0] += loss.detach().double() * y.numel()  # no host sync: stays on the device
            total[1] += y.numel()
        dist.all_reduce(total)
        correct = torch.zeros(2, dtype=torch.float64, device=device)
        model.eval()
        with torch.no_grad():
            for batch in val_loader:
                pred = model(batch.blocks, batch.blocks[0].srcdata["feat"]).argmax(1)
                y = batch.blocks[-1].dstdata["label"]
                correct[0] += (pred == y).sum().double()
                correct[1] += y.numel()
        model.train()
        dist.all_reduce(correct)
        if rank == 0:
            loss_avg = float(total[0] / total[1].clamp(min=1))
            acc = float(correct[0] / correct[1].clamp(min=1))
            stats = train_loader.stats
            print(
                f"epoch {epoch}: loss {loss_avg:.4f} val acc {acc:.4f} ({time.perf_counter() - t0:.2f} s, "
                f"wait {stats.wait:.3f} s, copy {stats.copy:.3f} s) on {world} x {device.type}",
                flush=True,
            )
    if rank == 0:
        print(
            "RESULT " + json.dumps({"world_size": world, "device": device.type, "val_acc": acc}), flush=True
        )


def main() -> None:
    args = parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    use_cuda = args.device == "cuda" or (args.device == "auto" and gpus > 0)
    nprocs = args.num_trainers or (gpus if use_cuda else 2)
    with tempfile.TemporaryDirectory(prefix="multi-gpu-") as tmp:
        part_config = args.part_config
        if part_config is None:
            part_config = Path(tmp) / "cora" / "cora.json"
            asyncgraph.partition_graph(
                asyncgraph.Graph.from_npz(DATA / "cora.npz"), "cora", 2, part_config.parent
            )
        spawn_trainers(train, nprocs, part_config, args=(args,), device="cuda" if use_cuda else "cpu")


if __name__ == "__main__":
    main()
