"""A trainer for tests/test_inference_direct.py: layer-wise inference of PubMed (GraphSAGE mean),
writing the result (rank 0, ``--out``) and this trainer's ``stats`` and share as JSON."""

from __future__ import annotations

import argparse
import json

import torch

import asyncgraph
from asyncgraph.inference import _my_nodes, layerwise_inference, write_npy
from asyncgraph.nn import GraphSAGE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ip-config", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    asyncgraph.initialize(args.ip_config)
    g = asyncgraph.DistGraph("pubmed")
    torch.manual_seed(5)
    model = GraphSAGE(500, 16, 3, n_layers=2).eval()
    stats: dict[str, float] = {}
    out = layerwise_inference(g, model, "feat", batch_size=3000, name="direct2", stats=stats)
    share = _my_nodes(g, None, "edges").numpy()
    rank = g.rank()
    if rank == 0:
        write_npy(out, args.out)
        torch.save(model.state_dict(), args.out + ".model.pt")
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(
            {"stats": stats, "share": [int(share[0]), int(share[-1]) + 1], "local": g.local_partition_ids}, f
        )
    g.barrier("direct2.end")
    asyncgraph.finalize()


if __name__ == "__main__":
    main()
