"""Link prediction: DistEdgeDataLoader with uniform negatives and a dot-product GraphSAGE scorer.

Each batch of edges gets 5 negative pairs per edge (``negative.Uniform(5)``); with
``exclude="self"`` the batch's own edges are dropped from its blocks so the model cannot read
them. Standalone on Cora: ``python examples/link_prediction.py --epochs 3``; ``--part-config``
and the launcher work as in ``node_classification.py``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import asyncgraph
from asyncgraph.dataloading import DistEdgeDataLoader, NeighborSampler, negative
from asyncgraph.nn import GraphSAGE

CORA = Path(__file__).resolve().parent / "data" / "cora.npz"


def main() -> None:
    """Train for ``--epochs``; print the last batch's loss of each."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part-config", type=Path, help="default: Cora, partitioned into a temp folder")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-batches", type=int, default=0, help="batches per epoch (0: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        part_config = args.part_config
        if part_config is None:
            asyncgraph.partition_graph(asyncgraph.Graph.from_npz(CORA), "cora", 1, tmp)
            part_config = Path(tmp) / "cora.json"
        name = asyncgraph.PartitionConfig.load(part_config).graph_name

        asyncgraph.initialize()
        g = asyncgraph.DistGraph(name, part_config=part_config)
        train_eids = asyncgraph.edge_split(
            torch.ones(g.num_edges(), dtype=torch.bool), g.get_partition_book()
        )
        loader = DistEdgeDataLoader(g, train_eids, NeighborSampler([10, 5]), batch_size=1024,
                                    negative_sampler=negative.Uniform(5), exclude="self")  # fmt: skip
        model = GraphSAGE(int(g.ndata["feat"].shape[1]), 64, 16, n_layers=2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for epoch in range(args.epochs):
            for i, (_input_nodes, pair_graph, neg_pair_graph, blocks) in enumerate(loader):
                if args.max_batches and i >= args.max_batches:
                    break
                h = model(blocks, blocks[0].srcdata["feat"])  # one row per blocks[-1].dstnodes
                pos = (h[pair_graph.src] * h[pair_graph.dst]).sum(-1)
                neg = (h[neg_pair_graph.src] * h[neg_pair_graph.dst]).sum(-1)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    torch.cat([pos, neg]), torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
            print(f"epoch {epoch}: loss {loss.item():.3f}")
        asyncgraph.finalize()


if __name__ == "__main__":
    main()
