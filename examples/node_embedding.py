"""Learnable node embeddings (DistEmbedding + SparseAdam) beside GraphSAGE, for node classification.

Each node gets a 32-d embedding row, stored sharded on the servers (or in-process standalone),
concatenated to its features. ``opt.step()`` sends the traced rows' gradients to their owners,
which apply Adam there. Standalone on Cora: ``python examples/node_embedding.py --epochs 5``;
``--part-config`` and the launcher work as in ``node_classification.py``.
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
    """Train model and embeddings for ``--epochs``; print loss and training accuracy."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part-config", type=Path, help="default: Cora, partitioned into a temp folder")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dim", type=int, default=32, help="embedding size")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        part_config = args.part_config
        if part_config is None:
            asyncgraph.partition_graph(asyncgraph.Graph.from_npz(CORA), "cora", 1, tmp)
            part_config = Path(tmp) / "cora.json"
        name = asyncgraph.PartitionConfig.load(part_config).graph_name

        asyncgraph.initialize()
        g = asyncgraph.DistGraph(name, part_config=part_config)
        n = g.num_nodes()
        train_nids = asyncgraph.node_split(g.ndata["train_mask"][0:n], g.get_partition_book())
        loader = DistNodeDataLoader(g, train_nids, NeighborSampler([10, 5]), batch_size=500, prefetch=2)
        emb = asyncgraph.DistEmbedding(
            n, args.dim, name="node_emb", init_func=asyncgraph.uniform_init(-0.1, 0.1)
        )
        in_feats = int(g.ndata["feat"].shape[1]) + args.dim
        model = GraphSAGE(in_feats, 64, int(g.ndata["label"][0:n].max()) + 1, n_layers=2)
        dense_opt = torch.optim.Adam(model.parameters(), lr=0.01)
        sparse_opt = asyncgraph.SparseAdam([emb], lr=0.01)
        for epoch in range(args.epochs):
            correct = total = 0
            for input_nodes, _seeds, blocks in loader:
                x = torch.cat([blocks[0].srcdata["feat"], emb(input_nodes)], dim=1)  # emb rows traced
                logits = model(blocks, x)
                labels = blocks[-1].dstdata["label"]
                loss = torch.nn.functional.cross_entropy(logits, labels)
                dense_opt.zero_grad()
                sparse_opt.zero_grad()
                loss.backward()
                dense_opt.step()
                sparse_opt.step()  # one sparse update per server, applied there
                correct += int((logits.argmax(1) == labels).sum())
                total += labels.numel()
            print(f"epoch {epoch}: loss {loss.item():.3f}, train accuracy {correct / max(total, 1):.3f}")
        asyncgraph.finalize()


if __name__ == "__main__":
    main()
