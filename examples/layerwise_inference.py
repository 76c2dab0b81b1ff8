"""Train a GraphSAGE, then compute its prediction for every node with layer-wise inference.

Standalone on PubMed (partitioned into a temporary folder):
    python examples/layerwise_inference.py --epochs 20 --out pred.npy
Launched, 2 partitions x 1 trainer (each trainer infers its share of the nodes):
    python -m asyncgraph.partition --input examples/data/pubmed.npz --graph-name pubmed \
        --num-parts 2 --out data/pubmed2
    python -m asyncgraph.launch --part-config data/pubmed2/pubmed.json -- \
        python examples/layerwise_inference.py --part-config data/pubmed2/pubmed.json --out pred.npy

``asyncgraph.inference.layerwise_inference`` computes layer 1 for every node, then layer 2 from
layer 1's stored outputs, and so on (full neighbourhoods, batches of ``--batch-size`` nodes), so
no node's lower layers are computed twice and memory per trainer is one batch. ``--out`` writes
the logits to a ``.npy`` whose row ``v`` is original node ``v`` (through ``orig_nids.npy``);
``--save-model`` writes the trained weights (``torch.save`` of the state dict).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import asyncgraph
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.inference import layerwise_inference, write_npy
from asyncgraph.nn import GraphSAGE
from asyncgraph.partition import load_orig_ids

PUBMED = Path(__file__).resolve().parent / "data" / "pubmed.npz"


def main() -> None:
    """Train for ``--epochs``, infer every node layer by layer, print the test accuracy."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part-config", type=Path, help="default: PubMed, partitioned into a temp folder")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4096, help="nodes per inference batch")
    ap.add_argument("--out", type=Path, help="write every node's logits here (.npy, original IDs)")
    ap.add_argument("--save-model", type=Path, help="write the trained weights here (trainer 0)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        part_config = args.part_config
        if part_config is None:
            asyncgraph.partition_graph(asyncgraph.Graph.from_npz(PUBMED), "pubmed", 1, tmp)
            part_config = Path(tmp) / "pubmed.json"
        name = asyncgraph.PartitionConfig.load(part_config).graph_name

        asyncgraph.initialize()  # ip_config from the launcher; none -> standalone
        distributed = not asyncgraph.is_standalone()
        if distributed:
            dist.init_process_group("gloo")
        g = asyncgraph.DistGraph(name, part_config=part_config)
        n = g.num_nodes()
        train = asyncgraph.node_split(g.ndata["train_mask"][0:n], g.get_partition_book())
        loader = DistNodeDataLoader(g, train, NeighborSampler([10, 10]), batch_size=64, seed=args.seed)
        model = GraphSAGE(int(g.ndata["feat"].shape[1]), args.hidden, 3, n_layers=2, dropout=0.5)
        trained: torch.nn.Module = DistributedDataParallel(model) if distributed else model
        opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
        for _ in range(args.epochs):
            for _inputs, _seeds, blocks in loader:
                loss = torch.nn.functional.cross_entropy(
                    trained(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
        pred = layerwise_inference(g, model, g.ndata["feat"], batch_size=args.batch_size, name="sage_pred")
        if g.rank() == 0:
            if "test_mask" in g.ndata:
                test = np.flatnonzero(g.ndata["test_mask"][0:n].numpy())
                logits, labels = pred[test], g.ndata["label"][test]
                acc = float((logits.argmax(1) == labels).float().mean())
                print(f"layer-wise inference of {n} nodes: test accuracy {acc:.3f}", flush=True)
            else:  # a graph with a train mask only: nothing to score against
                print(f"layer-wise inference of {n} nodes: no test_mask, accuracy skipped", flush=True)
            if args.out is not None:
                write_npy(pred, args.out, orig_nids=load_orig_ids(part_config)[0])
                print(f"wrote {args.out}", flush=True)
            if args.save_model is not None:
                torch.save(model.state_dict(), args.save_model)
        g.barrier("done")
        if g.rank() == 0:
            pred.delete()
            g.ndata["sage_pred.done"].delete()
        if distributed:
            dist.destroy_process_group()
        asyncgraph.finalize()


if __name__ == "__main__":
    main()
