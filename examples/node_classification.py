"""Node classification with GraphSAGE: the "Train" guide (docs/guides/train.md), runnable.

Standalone on Cora (partitioned into a temporary folder):
    python examples/node_classification.py --epochs 5
On a given partitioning, or under the launcher (which sets the servers' ip_config):
    python examples/node_classification.py --part-config data/pubmed1/pubmed.json
    python -m asyncgraph.launch --part-config data/pubmed2/pubmed.json -- \
        python examples/node_classification.py --part-config data/pubmed2/pubmed.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import asyncgraph
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.nn import GraphSAGE

CORA = Path(__file__).resolve().parent / "data" / "cora.npz"


def main() -> None:
    """Train for ``--epochs`` and print the loss and training accuracy of each."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part-config", type=Path, help="default: Cora, partitioned into a temp folder")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        part_config = args.part_config
        if part_config is None:
            asyncgraph.partition_graph(asyncgraph.Graph.from_npz(CORA), "cora", 1, tmp)
            part_config = Path(tmp) / "cora.json"
        name = asyncgraph.PartitionConfig.load(part_config).graph_name

        asyncgraph.initialize()  # ip_config from the launcher; none -> standalone
        g = asyncgraph.DistGraph(name, part_config=part_config)
        train_nids = asyncgraph.node_split(g.ndata["train_mask"][0 : g.num_nodes()], g.get_partition_book())
        loader = DistNodeDataLoader(g, train_nids, NeighborSampler([25, 10]), batch_size=1000, prefetch=2)
        in_feats = int(g.ndata["feat"].shape[1])
        num_classes = int(g.ndata["label"][0 : g.num_nodes()].max()) + 1
        model = GraphSAGE(in_feats, 64, num_classes, n_layers=2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for epoch in range(args.epochs):
            correct = total = 0
            for _input_nodes, _seeds, blocks in loader:  # the next batches are prepared meanwhile
                logits = model(blocks, blocks[0].srcdata["feat"])
                labels = blocks[-1].dstdata["label"]
                loss = torch.nn.functional.cross_entropy(logits, labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                correct += int((logits.argmax(1) == labels).sum())
                total += labels.numel()
            print(f"epoch {epoch}: loss {loss.item():.3f}, train accuracy {correct / max(total, 1):.3f}")
        asyncgraph.finalize()


if __name__ == "__main__":
    main()
