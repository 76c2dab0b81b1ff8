"""DGL 2.1's side of the layer-wise inference comparison; runs under DGL's venv (imports dgl).

Run as a trainer by ``../shared/peers/dgl/launch_local.py`` (``ops/run_side_by_side.sh``). The
loop is DGL's own ``DistSAGE.inference()`` from ``examples/distributed/graphsage/
node_classification.py`` (v2.1.0): ``node_split(arange(N), force_even=True)``, per layer a
persistent ``DistTensor``, ``DistNodeDataLoader`` over ``NeighborSampler([-1])`` in batches of
``--batch-size``, ``x[input_nodes]``, ``layer(block, (h, h_dst))``, ReLU between layers,
``y[output_nodes] = h``, ``g.barrier()``. The model is the one ``benchmarks.inference_bench``
runs: 2 layers of ``SAGEConv(.., "mean")``, 128 -> ``--hidden`` -> 50, eval mode, no grad.
Rank 0 prints one JSON line: ``{"bench": "dgl_inference", "seconds": slowest trainer, ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import dgl
import dgl.nn.pytorch as dglnn
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PEER = os.environ.get(
    "DGL_PEER_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "peers", "dgl")
)
sys.path.insert(0, os.path.abspath(PEER))
from dglbench_common import patch_machine_id  # noqa: E402

DIST = os.environ.get("DGL_DIST_MODE", "standalone") != "standalone"


class DistSAGE(nn.Module):
    """DGL's example model (activation ReLU; dropout is inactive in eval mode)."""

    def __init__(self, in_feats: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [dglnn.SAGEConv(in_feats, hidden, "mean"), dglnn.SAGEConv(hidden, classes, "mean")]
        )
        self.hidden, self.classes = hidden, classes

    def inference(self, g, x, batch_size: int) -> tuple:  # type: ignore[no-untyped-def]
        """DGL's example ``inference()`` loop, timing the time spent inside the layers."""
        nodes = dgl.distributed.node_split(np.arange(g.num_nodes()), g.get_partition_book(), force_even=True)
        compute = 0.0
        for i, layer in enumerate(self.layers):
            last = i == len(self.layers) - 1
            y = dgl.distributed.DistTensor(
                (g.num_nodes(), self.classes if last else self.hidden),
                torch.float32,
                "h_last" if last else "h",
                persistent=True,
            )
            sampler = dgl.dataloading.NeighborSampler([-1])
            loader = dgl.dataloading.DistNodeDataLoader(
                g, nodes, sampler, batch_size=batch_size, shuffle=False, drop_last=False
            )
            for input_nodes, output_nodes, blocks in loader:
                block = blocks[0]
                h = x[input_nodes]
                t = time.perf_counter()
                h_dst = h[: block.number_of_dst_nodes()]
                h = layer(block, (h, h_dst))
                if not last:
                    h = F.relu(h)
                compute += time.perf_counter() - t
                y[output_nodes] = h
            x = y
            g.barrier()
        return x, compute


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part-config", required=True)
    ap.add_argument("--graph-name", default="bench")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--classes", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    patch_machine_id()
    dgl.distributed.initialize(os.environ.get("DGL_IP_CONFIG", "unused_ip_config.txt"))
    if DIST:
        torch.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(args.graph_name, part_config=args.part_config)
    torch.manual_seed(0)
    model = DistSAGE(int(g.ndata["feat"].shape[1]), args.hidden, args.classes).eval()
    g.barrier()
    t0 = time.perf_counter()
    with torch.no_grad():
        out, compute = model.inference(g, g.ndata["feat"], args.batch_size)
    seconds = time.perf_counter() - t0
    rows = out[np.arange(0, g.num_nodes(), max(1, g.num_nodes() // 1000))]  # the output exists
    mine = [seconds, compute]
    allr = [mine]
    if DIST:
        allr = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(allr, mine)
    if g.rank() == 0:
        print(json.dumps({
            "bench": "dgl_inference", "dgl": dgl.__version__, "trainers": len(allr),
            "num_nodes": int(g.num_nodes()), "batch_size": args.batch_size, "hidden": args.hidden,
            "seconds": max(r[0] for r in allr), "compute_seconds": max(r[1] for r in allr),
            "nodes_per_s": g.num_nodes() / max(r[0] for r in allr), "out_checksum": float(rows.abs().sum()),
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }), flush=True)  # fmt: skip
    if DIST:
        torch.distributed.barrier()
        # DGL's exit (its atexit client barrier) hung once after the figures were printed (2
        # trainers, batch 100000, 14:02): do not hold the benchmark lock for the launcher's timeout
        guard = threading.Timer(60.0, os._exit, args=(0,))
        guard.daemon = True  # fires only if the exit below hangs
        guard.start()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
