"""GraphSAGE node classification on a partitioned graph, standalone or launched.

Standalone (one process, no server)::

    python examples/train_dist.py --part-config data/pubmed1/pubmed.json

Launched (2 partitions x 2 trainers, DDP over gloo)::

    python -m asyncgraph.launch --part-config data/pubmed2/pubmed.json --num-trainers 2 -- \
        python examples/train_dist.py

Reports per-epoch loss and validation accuracy, the test accuracy of the best-validation epoch,
and a timing breakdown (sample and pull run in the background; ``wait`` is time the training
loop spent waiting for data).

``--device cuda`` (or ``auto``: the launcher's ``ASYNCGRAPH_DEVICE``, e.g. with
``--num-gpus-per-host``) trains on the GPU: batches are copied in the background on a side
stream (``--sync-copy``: synchronously in the training loop, for comparison) and DDP uses nccl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import asyncgraph
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import ddp_backend, resolve_device
from asyncgraph.nn import GraphSAGE


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph-name", default=None, help="default: the name in the partition config")
    p.add_argument("--part-config", default=os.environ.get("ASYNCGRAPH_PART_CONFIG"))
    p.add_argument("--ip-config", default=None)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--eval-batch-size", type=int, default=2000)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=0, help="torch threads (0: leave the default)")
    p.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs (0: never)")
    p.add_argument("--max-batches", type=int, default=0, help="stop each epoch after N batches (0: all)")
    p.add_argument(
        "--result-file",
        type=Path,
        default=None,
        help="rank 0 writes a JSON summary here; with '{rank}' in the name, every rank writes its own",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--save-model",
        type=Path,
        default=None,
        help="rank 0 saves the trained model here for python -m asyncgraph.serve (model.json + model.pt)",
    )
    p.add_argument(
        "--cache-fraction",
        type=float,
        default=0.0,
        help="feature cache of this fraction of the remote nodes' rows (0: none)",
    )
    p.add_argument(
        "--carry-features",
        action="store_true",
        help="have the last sampling layer's answers carry the feature rows (one request wave per batch)",
    )
    p.add_argument(
        "--attach",
        choices=("all", "own"),
        default="all",
        help="shared memory for every co-located partition, or only this rank's own (the rest over sockets)",
    )
    p.add_argument(
        "--sim-ms",
        type=float,
        default=0.0,
        help="replace forward/backward/step with a sleep of this many ms (an accelerator-like step)",
    )
    p.add_argument(
        "--sim-holds-gil",
        action="store_true",
        help="the --sim-ms step spins in Python, holding the GIL as a GPU loop's kernel launches do",
    )
    p.add_argument(
        "--num-workers",
        default="auto",
        help="loader worker processes that sample and gather batches (0: the client's event-loop thread; "
        "auto: on a GPU, the trainer's share of this host's cores less one, at most 4; on CPU, 0)",
    )
    p.add_argument(
        "--worker-mode",
        choices=("process", "thread"),
        default="process",
        help="loader workers as processes (default) or threads of the trainer (for comparison)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda (this trainer's GPU: cuda:LOCAL_RANK), cuda:N, or auto (the launcher's choice)",
    )
    p.add_argument("--sync-copy", action="store_true", help="copy batches to the device synchronously")
    return p.parse_args()


def loader_workers(value: str, device: torch.device) -> int:
    """``--num-workers``: a count, or ``auto`` (GPU trainers get their cores' worth, less one
    for the training loop; CPU trainers compute on their cores themselves)."""
    if value != "auto":
        return int(value)
    if device.type != "cuda":
        return 0
    trainers_here = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    return max(1, min(4, len(os.sched_getaffinity(0)) // max(trainers_here, 1) - 1))


def all_reduce_sum(values: list[float], distributed: bool, device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if distributed:
        dist.all_reduce(tensor)
    return tensor.tolist()


def evaluate(
    model: torch.nn.Module, loader: DistNodeDataLoader, distributed: bool, device: torch.device
) -> tuple[float, float]:
    """Accuracy over this rank's share, summed over ranks: (correct, total)."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in loader:
            x = batch.blocks[0].srcdata["feat"]
            y = batch.blocks[-1].dstdata["label"]
            pred = model(batch.blocks, x).argmax(1)
            correct += int((pred == y).sum())
            total += int(y.numel())
    model.train()
    c, t = all_reduce_sum([correct, total], distributed, device)
    return c, t


def main() -> None:
    args = parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_parts = None
    if args.attach == "own" and args.part_config is not None:  # as on a host of its own
        num_parts = asyncgraph.PartitionConfig.load(args.part_config).num_parts
        local_parts = [rank * num_parts // world_size]
    asyncgraph.initialize(args.ip_config, local_partitions=local_parts)
    distributed = world_size > 1
    device = resolve_device(args.device)  # auto: the launcher's cuda:LOCAL_RANK or cpu
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if distributed:  # nccl only on a CUDA device
        dist.init_process_group(ddp_backend(device), rank=rank, world_size=world_size)
    graph_name = args.graph_name
    if graph_name is None:
        if args.part_config is None:
            sys.exit("give --part-config (standalone) or launch with asyncgraph.launch")
        graph_name = asyncgraph.PartitionConfig.load(args.part_config).graph_name
    g = asyncgraph.DistGraph(graph_name, part_config=args.part_config)
    n = g.num_nodes()

    # a graph may come with a train mask only: what is missing is skipped (one warning on rank 0);
    # without evaluation the val/test masks are not read at all
    wanted = ("train_mask", "val_mask", "test_mask") if args.eval_every > 0 else ("train_mask",)
    splits = asyncgraph.split_masks(g, wanted, rank=rank, world_size=world_size, force_even=True)
    if "train_mask" not in splits:
        sys.exit(f"graph {graph_name!r} has no 'train_mask' node tensor; known: {sorted(g.ndata)}")
    train_nids = splits["train_mask"]
    val_nids, test_nids = splits.get("val_mask"), splits.get("test_mask")
    feat = g.ndata["feat"]
    labels = g.ndata["label"][0:n]
    num_classes = int(labels.max()) + 1
    in_feats = int(feat.shape[1])
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sampler = NeighborSampler(fanouts)
    model: torch.nn.Module = GraphSAGE(
        in_feats, args.hidden, num_classes, len(fanouts), dropout=args.dropout
    ).to(device)
    if distributed:
        model = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    # CPU training keeps the loaders' default (no copy); a GPU gets every batch on the device
    on_device: dict[str, Any] = (
        {} if device.type == "cpu" else {"device": device, "overlap": not args.sync_copy}
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    cache_bytes = 0
    if args.cache_fraction > 0:
        remote_nodes = int(g.client.remote_ids("node").size)
        cache_bytes = int(args.cache_fraction * remote_nodes * feat.dtype.itemsize * in_feats)
    train_loader = DistNodeDataLoader(
        g,
        train_nids,
        sampler,
        args.batch_size,
        shuffle=True,
        prefetch=args.prefetch,
        seed=args.seed * 1000 + rank,
        feature_cache_bytes=cache_bytes,
        carry_features=args.carry_features,
        num_workers=loader_workers(args.num_workers, device),
        worker_mode=args.worker_mode,
        **on_device,
    )

    def eval_loader(nids: torch.Tensor | None, seed: int) -> DistNodeDataLoader | None:
        if nids is None:
            return None
        return DistNodeDataLoader(
            g,
            nids,
            sampler,
            args.eval_batch_size,
            shuffle=False,
            prefetch=args.prefetch,
            seed=seed,
            **on_device,
        )

    val_loader, test_loader = eval_loader(val_nids, 7 + rank), eval_loader(test_nids, 11 + rank)

    def how_many(nids: torch.Tensor | None) -> str:
        return "no" if nids is None else str(len(nids))

    if rank == 0:
        print(
            f"{g!r}: {len(train_nids)} train / {how_many(val_nids)} val / {how_many(test_nids)} test "
            f"nodes on rank 0, {world_size} trainer(s), fanouts {fanouts}, prefetch {args.prefetch}, "
            f"device {device}"
            + (" (synchronous copies)" if args.sync_copy and device.type != "cpu" else ""),
            flush=True,
        )
    progress = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(total=args.epochs, desc="epochs", unit="ep", file=sys.stdout, mininterval=1.0)

    totals = {"sample": 0.0, "pull": 0.0, "compute": 0.0, "wait": 0.0, "copy": 0.0, "epoch": 0.0}
    epoch_stats: list[dict[str, Any]] = []
    best_val = -1.0
    best = {"epoch": -1, "val_acc": 0.0, "test_acc": 0.0}
    history = []
    asyncgraph.barrier("start")
    for epoch in range(args.epochs):
        t_epoch = time.perf_counter()
        compute = 0.0
        loss_sum = 0.0
        count = 0
        # on a GPU: the device time of each step (events), for the GPU's busy share of the epoch
        gpu_events: list[tuple[Any, Any]] | None = [] if device.type == "cuda" else None
        for index, batch in enumerate(train_loader):
            t0 = time.perf_counter()
            x = batch.blocks[0].srcdata["feat"]
            y = batch.blocks[-1].dstdata["label"]
            if args.sim_ms > 0 and args.sim_holds_gil:  # a Python loop launching kernels: holds the GIL
                deadline = t0 + args.sim_ms / 1000
                while time.perf_counter() < deadline:
                    pass
                compute += time.perf_counter() - t0
            elif args.sim_ms > 0:  # the CPU is free while an accelerator would compute
                time.sleep(args.sim_ms / 1000)
                compute += time.perf_counter() - t0
            else:
                if gpu_events is not None:
                    gpu_events.append(
                        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                    )
                    gpu_events[-1][0].record()
                logits = model(batch.blocks, x)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if gpu_events is not None:
                    gpu_events[-1][1].record()
                compute += time.perf_counter() - t0
                loss_sum += float(loss.detach()) * int(y.numel())
                count += int(y.numel())
            if args.max_batches and index + 1 >= args.max_batches:
                break
        if len(train_loader) == 0 and distributed:  # keep DDP's collective calls in step
            raise RuntimeError(f"rank {rank} got no training nodes")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_time = time.perf_counter() - t_epoch
        gpu_busy = sum(a.elapsed_time(b) for a, b in gpu_events) / 1000 if gpu_events else 0.0
        stats = train_loader.stats
        totals["sample"] += stats.sample
        totals["pull"] += stats.pull
        totals["wait"] += stats.wait
        totals["copy"] += stats.copy
        totals["compute"] += compute
        totals["epoch"] += epoch_time
        epoch_stats.append(
            {
                "epoch": epoch,
                "batches": stats.batches,
                "time": round(epoch_time, 4),
                "sample": round(stats.sample, 4),
                "pull": round(stats.pull, 4),
                "compute": round(compute, 4),
                "wait": round(stats.wait, 4),
                "copy": round(stats.copy, 4),
                "gpu_compute": round(gpu_busy, 4),
                "feature_bytes": stats.feature_bytes,
                "host_copy_bytes": stats.host_copy_bytes,
                "structure_bytes": stats.structure_bytes,
                "traffic": stats.traffic.as_dict(),
                "cache": train_loader.cache_info,
            }
        )
        loss_total, n_total = all_reduce_sum([loss_sum, count], distributed, device)
        record = {"epoch": epoch, "loss": loss_total / max(n_total, 1), "time": epoch_time}
        if args.eval_every > 0 and ((epoch + 1) % args.eval_every == 0 or epoch == args.epochs - 1):
            if val_loader is not None:
                vc, vt = evaluate(model, val_loader, distributed, device)
                record["val_acc"] = vc / max(vt, 1)
            # without a val mask the latest evaluation is the one reported
            if val_loader is None or record["val_acc"] > best_val:
                best_val = record.get("val_acc", best_val)
                best = {"epoch": epoch, "val_acc": record.get("val_acc", 0.0), "test_acc": 0.0}
                if test_loader is not None:
                    tc, tt = evaluate(model, test_loader, distributed, device)
                    best["test_acc"] = tc / max(tt, 1)
        history.append(record)
        if progress is not None:
            progress.set_postfix(
                loss=f"{record['loss']:.3f}", val=f"{record.get('val_acc', float('nan')):.3f}"
            )
            progress.update(1)
        elif rank == 0:
            print(
                f"epoch {epoch:3d} loss {record['loss']:.4f} val {record.get('val_acc', float('nan')):.4f} "
                f"({epoch_time * 1000:.0f} ms)",
                flush=True,
            )
    if progress is not None:
        progress.close()
    asyncgraph.barrier("end")
    summary = {
        "graph": graph_name,
        "world_size": world_size,
        "epochs": args.epochs,
        "best_epoch": best["epoch"],
        "val_acc": best["val_acc"],
        "test_acc": best["test_acc"],
        "final_loss": history[-1]["loss"] if history else None,
        "time": {k: round(v, 4) for k, v in totals.items()},
        "rank": rank,
        "epoch_stats": epoch_stats,
        "device": str(device),
        "sync_copy": bool(args.sync_copy),
    }
    if args.result_file is not None and "{rank}" in str(args.result_file):
        Path(str(args.result_file).replace("{rank}", str(rank))).write_text(json.dumps(summary, indent=2))
    if rank == 0:
        t = totals
        print(
            f"best epoch {best['epoch']}: val acc {best['val_acc']:.4f}, test acc {best['test_acc']:.4f}\n"
            f"time over {args.epochs} epochs: {t['epoch']:.2f} s total; "
            f"background sample {t['sample']:.2f} s, "
            f"pull {t['pull']:.2f} s; compute {t['compute']:.2f} s; waiting for data {t['wait']:.2f} s "
            f"({100 * t['wait'] / max(t['epoch'], 1e-9):.1f}% of the epochs)",
            flush=True,
        )
        brief = {
            k: v for k, v in summary.items() if k != "epoch_stats"
        }  # the full record goes to --result-file
        print("RESULT " + json.dumps(brief), flush=True)
        if args.result_file is not None and "{rank}" not in str(args.result_file):
            args.result_file.write_text(json.dumps(summary, indent=2))
        if args.save_model is not None:
            from asyncgraph.serve.artifact import save_model

            plain = model.module if isinstance(model, DistributedDataParallel) else model
            kwargs = {"in_feats": in_feats, "hidden": args.hidden, "n_classes": num_classes,
                      "n_layers": len(fanouts), "dropout": args.dropout}  # fmt: skip
            save_model(args.save_model, plain.to("cpu"), name="sage", kwargs=kwargs, fanouts=fanouts)
            print(f"model saved to {args.save_model} (serve it: python -m asyncgraph.serve --model ...)")
    train_loader.close()
    if distributed:
        dist.destroy_process_group()
    asyncgraph.finalize()


if __name__ == "__main__":
    main()
