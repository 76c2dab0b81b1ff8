"""PyG's GraphSAGE (torch_geometric.nn) on PubMed, its batches served by asyncgraph.

A PyG script with only its data source changed: ``NeighborLoader(data, ...)`` becomes
``asyncgraph.pyg.DistNeighborLoader(g, ...)`` (or PyG's own ``NodeLoader`` with
``asyncgraph.pyg.DistNeighborSampler``: ``--loader nodeloader``); the model, the loss and the
batch fields (``x``, ``y``, ``edge_index``, ``batch_size``) are PyG's.

Standalone (one process, no server; the partition folder is made if missing)::
    python examples/pyg_node_classification.py --part-config data/pubmed1/pubmed.json
Launched (2 partitions x 2 trainers, DDP over gloo)::
    python -m asyncgraph.partition --input examples/data/pubmed.npz --graph-name pubmed \
        --num-parts 2 --method metis --balance-train --out data/pubmed2
    python -m asyncgraph.launch --part-config data/pubmed2/pubmed.json --num-trainers 2 -- \
        python examples/pyg_node_classification.py
PyG in-memory references on the same split (``--baseline``): PyG's ``NeighborLoader`` (needs
pyg-lib or torch-sparse; the error is printed if neither is installed) and full-batch training
of the same model on the whole graph in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GraphSAGE

import asyncgraph
from asyncgraph.pyg import DistFeatureStore, DistGraphStore, DistNeighborLoader, DistNeighborSampler

PUBMED = Path(__file__).resolve().parent / "data" / "pubmed.npz"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part-config", default=os.environ.get("ASYNCGRAPH_PART_CONFIG"))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--num-neighbors", default="25,10", help="PyG order: the seeds' hop first")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loader", choices=("dist", "nodeloader"), default="dist")
    p.add_argument("--baseline", action="store_true", help="PyG in-memory references (one process)")
    p.add_argument("--result-file", type=Path, default=None, help="rank 0 writes a JSON summary here")
    return p.parse_args()


def make_loader(g: Any, ids: torch.Tensor, args: argparse.Namespace, shuffle: bool, bs: int) -> Any:
    fanouts = [int(f) for f in args.num_neighbors.split(",")]
    if args.loader == "dist":
        return DistNeighborLoader(g, fanouts, input_nodes=ids, batch_size=bs, shuffle=shuffle, seed=args.seed)
    from torch_geometric.loader import NodeLoader

    sampler = DistNeighborSampler(g, fanouts, seed=args.seed)
    fs, gs = DistFeatureStore(g), DistGraphStore(g)
    return NodeLoader((fs, gs), node_sampler=sampler, input_nodes=ids, batch_size=bs, shuffle=shuffle)


def accuracy(model: torch.nn.Module, loader: Any, distributed: bool) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for b in loader:
            pred = model(b.x, b.edge_index)[: b.batch_size].argmax(-1)
            correct += int((pred == b.y[: b.batch_size]).sum())
            total += int(b.batch_size)
    model.train()
    t = torch.tensor([correct, total], dtype=torch.float64)
    if distributed:
        dist.all_reduce(t)
    return float(t[0] / max(t[1], 1))


def train(args: argparse.Namespace) -> dict[str, Any]:
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    distributed = world > 1
    part_config = args.part_config
    asyncgraph.initialize()
    if asyncgraph.is_standalone() and (part_config is None or not Path(part_config).exists()):
        part_config = part_config or "data/pubmed1/pubmed.json"
        asyncgraph.partition_graph(asyncgraph.Graph.from_npz(PUBMED), "pubmed", 1, Path(part_config).parent)
    g = asyncgraph.DistGraph("pubmed", part_config=part_config if asyncgraph.is_standalone() else None)
    if distributed:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    book = g.get_partition_book()
    split = {
        k: asyncgraph.node_split(g.ndata[f"{k}_mask"][0 : g.num_nodes()], book)
        for k in ("train", "val", "test")
    }
    torch.manual_seed(args.seed)
    model: torch.nn.Module = GraphSAGE(500, args.hidden, num_layers=2, out_channels=3, dropout=args.dropout)
    if distributed:
        model = DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    loader = make_loader(g, split["train"], args, True, args.batch_size)
    val = make_loader(g, split["val"], args, False, 500)
    test = make_loader(g, split["test"], args, False, 500)
    best_val, best_test, t0 = -1.0, 0.0, time.perf_counter()
    for epoch in range(args.epochs):
        for b in loader:
            opt.zero_grad()
            out = model(b.x, b.edge_index)[: b.batch_size]
            F.cross_entropy(out, b.y[: b.batch_size]).backward()
            opt.step()
        v = accuracy(model, val, distributed)
        if v > best_val:
            best_val, best_test = v, accuracy(model, test, distributed)
        if rank == 0:
            print(f"epoch {epoch:3d} val {v:.3f} (best {best_val:.3f}, its test {best_test:.3f})", flush=True)
    result = {
        "mode": "launched" if not asyncgraph.is_standalone() else "standalone",
        "world": world,
        "loader": args.loader,
        "best_val": best_val,
        "test_acc": best_test,
        "epochs": args.epochs,
        "seconds": time.perf_counter() - t0,
    }
    if distributed:
        dist.destroy_process_group()
    asyncgraph.finalize()
    return result


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    """PyG's in-memory references on the same split, fanouts and epochs."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    z = np.load(PUBMED)
    data = Data(
        x=torch.from_numpy(z["feat"]),
        y=torch.from_numpy(z["label"]),
        edge_index=torch.from_numpy(np.stack([z["src"], z["dst"]])),
    )
    masks = {k: torch.from_numpy(z[f"{k}_mask"]) for k in ("train", "val", "test")}
    fanouts = [int(f) for f in args.num_neighbors.split(",")]
    out: dict[str, Any] = {}
    try:
        loader = NeighborLoader(
            data, fanouts, input_nodes=masks["train"], batch_size=args.batch_size, shuffle=True
        )
        next(iter(loader))
        out["neighbor_loader"] = "runs"  # pyg-lib or torch-sparse present: compare with it
    except ImportError as exc:
        out["neighbor_loader_error"] = f"{type(exc).__name__}: {exc}"
        print("PyG NeighborLoader:", out["neighbor_loader_error"], flush=True)
    torch.manual_seed(args.seed)
    model = GraphSAGE(500, args.hidden, num_layers=2, out_channels=3, dropout=args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps = -(-int(masks["train"].sum()) // args.batch_size)  # as many steps as the sampled runs
    best_val, best_test = -1.0, 0.0
    train_ids = masks["train"].nonzero().view(-1)
    for _ in range(args.epochs):
        model.train()
        for ids in train_ids[torch.randperm(train_ids.numel())].chunk(steps):
            opt.zero_grad()
            F.cross_entropy(model(data.x, data.edge_index)[ids], data.y[ids]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(-1)
        v = float((pred[masks["val"]] == data.y[masks["val"]]).float().mean())
        if v > best_val:
            best_val, best_test = v, float((pred[masks["test"]] == data.y[masks["test"]]).float().mean())
    out.update(mode="pyg-full-batch", best_val=best_val, test_acc=best_test, epochs=args.epochs)
    print(
        f"PyG in-memory full-batch GraphSAGE: best val {best_val:.3f}, its test {best_test:.3f}", flush=True
    )
    return out


def main() -> None:
    args = parse_args()
    result = baseline(args) if args.baseline else train(args)
    print(json.dumps(result), flush=True)
    if args.result_file is not None and int(os.environ.get("RANK", "0")) == 0:
        args.result_file.parent.mkdir(parents=True, exist_ok=True)
        args.result_file.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
