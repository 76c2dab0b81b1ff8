"""The inference stage of ``benchmarks.e2e_scale``: one trainer of a launched job.

``python -m asyncgraph.launch --part-config C --num-trainers 1 -- python -m benchmarks.e2e_infer
--nodes M``: every trainer runs ``asyncgraph.inference.layerwise_inference`` (2-layer GraphSAGE,
mean, 128 -> ``--hidden`` -> 50, full neighbourhoods, the direct path where it applies) over its
``node_split`` share of ``M`` nodes spread evenly over the ID space (so over every partition).
A slice, not every node: the second layer reads the first layer's rows of the slice's
neighbours, most of which the slice did not compute (zeros), so the figure is the time and
memory of doing the work for ``M`` nodes, not a usable result (the features are random anyway).
Each trainer prints ``RESULT {json}``: its seconds, nodes, attach and kernel load time.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1 << 16, help="nodes in the slice (0: every node)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--classes", type=int, default=50)
    args = ap.parse_args()

    import asyncgraph
    from asyncgraph.inference import layerwise_inference
    from asyncgraph.inference_kernel import wait_ready
    from asyncgraph.nn import GraphSAGE

    t_start = time.perf_counter()
    asyncgraph.initialize()
    cfg_name = asyncgraph.PartitionConfig.load(_part_config()).graph_name
    g = asyncgraph.DistGraph(cfg_name)
    t_attach = time.perf_counter() - t_start
    n = g.num_nodes()
    if args.nodes and args.nodes < n:
        mask = np.zeros(n, dtype=np.bool_)
        mask[np.linspace(0, n - 1, args.nodes).astype(np.int64)] = True
        nodes = asyncgraph.node_split(torch.from_numpy(mask), g.get_partition_book())
    else:
        nodes = None
    torch.manual_seed(0)
    model = GraphSAGE(int(g.ndata["feat"].shape[1]), args.hidden, args.classes, n_layers=2, dropout=0.0)
    t0 = time.perf_counter()
    wait_ready(300.0)
    t_kernel = time.perf_counter() - t0
    stats: dict[str, float] = {}
    g.barrier("e2e.start")
    t0 = time.perf_counter()
    out = layerwise_inference(
        g, model, "feat", batch_size=args.batch_size, nodes=nodes, name="e2e", stats=stats
    )
    seconds = time.perf_counter() - t0
    rank = g.rank()
    mine = n if nodes is None else int(nodes.numel())  # every node: the driver counts n once
    row = {
        "rank": rank,
        "seconds": seconds,
        "nodes": mine,
        "all_nodes": nodes is None,
        "layers_s": stats.get("layers", 0.0),
        "attach_s": t_attach,
        "kernel_wait_s": t_kernel,
        "hidden": args.hidden,
    }
    print("RESULT " + json.dumps(row), flush=True)  # one line per trainer: the driver adds them up
    g.barrier("e2e.end")
    if rank == 0:
        out.delete()
        g.ndata["e2e.done"].delete()
    asyncgraph.finalize()


def _part_config() -> str:
    path = os.environ.get("ASYNCGRAPH_PART_CONFIG")
    if not path:
        raise SystemExit("run under python -m asyncgraph.launch (ASYNCGRAPH_PART_CONFIG is not set)")
    return path


if __name__ == "__main__":
    main()
