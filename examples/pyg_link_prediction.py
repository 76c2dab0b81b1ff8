"""Link prediction on Cora with PyG's GraphSAGE and asyncgraph's ``DistLinkNeighborLoader``.

PyG's ``LinkNeighborLoader`` recipe with the loader swapped: batches of positive edges plus as
many uniform negative pairs (``neg_sampling="binary"``), each batch a PyG ``Data`` with
``edge_label_index`` (into ``n_id``) and ``edge_label``; a GraphSAGE encoder and a dot-product
decoder trained with binary cross-entropy. 10% of the undirected edges are held out: they are
left out of the partitioned graph (so no batch can read them) and scored at the end, ROC-AUC
against as many uniform random pairs (0.5 is chance).

Standalone: ``python examples/pyg_link_prediction.py --epochs 5``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphSAGE

import asyncgraph
from asyncgraph.pyg import DistLinkNeighborLoader, DistNeighborLoader

CORA = Path(__file__).resolve().parent / "data" / "cora.npz"


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Probability that a positive pair scores above a negative one (ties count half)."""
    scores = np.concatenate([pos, neg])
    ranks = np.empty(scores.size)
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, scores.size + 1)
    return float((ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    z = dict(np.load(CORA))
    src, dst = z["src"], z["dst"]
    und = src < dst  # each undirected edge once
    pairs = np.stack([src[und], dst[und]], 1)
    held = rng.random(len(pairs)) < 0.1
    keep = pairs[~held]
    z["src"], z["dst"] = np.concatenate([keep[:, 0], keep[:, 1]]), np.concatenate([keep[:, 1], keep[:, 0]])
    graph = asyncgraph.Graph(
        len(z["label"]), z["src"], z["dst"], ndata={"feat": z["feat"], "label": z["label"]}
    )
    with tempfile.TemporaryDirectory() as tmp:
        orig_nids, _ = asyncgraph.partition_graph(graph, "cora", 1, tmp, return_mapping=True)
        new_of_orig = np.empty_like(np.asarray(orig_nids))
        new_of_orig[np.asarray(orig_nids)] = np.arange(len(new_of_orig))
        asyncgraph.initialize()
        g = asyncgraph.DistGraph("cora", part_config=Path(tmp) / "cora.json")
        loader = DistLinkNeighborLoader(
            g, [10, 5], batch_size=args.batch_size, neg_sampling="binary", shuffle=True, seed=args.seed
        )
        torch.manual_seed(args.seed)
        model = GraphSAGE(z["feat"].shape[1], 64, num_layers=2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for epoch in range(args.epochs):
            total = 0.0
            for b in loader:
                opt.zero_grad()
                h = model(b.x, b.edge_index)
                score = (h[b.edge_label_index[0]] * h[b.edge_label_index[1]]).sum(-1)
                loss = F.binary_cross_entropy_with_logits(score, b.edge_label)
                loss.backward()
                opt.step()
                total += float(loss.detach())
            print(f"epoch {epoch}: mean loss {total / len(loader):.4f}", flush=True)
        model.eval()
        everyone = DistNeighborLoader(g, [-1, -1], batch_size=g.num_nodes())  # one batch: every node
        with torch.no_grad():
            b = next(iter(everyone))
            h = torch.empty_like(model(b.x, b.edge_index))
            h[b.n_id] = model(b.x, b.edge_index)
        test = torch.from_numpy(new_of_orig[pairs[held]])
        neg = torch.from_numpy(rng.integers(0, g.num_nodes(), size=test.shape))
        pos_s = (h[test[:, 0]] * h[test[:, 1]]).sum(-1).numpy()
        neg_s = (h[neg[:, 0]] * h[neg[:, 1]]).sum(-1).numpy()
        print(f"held-out ROC-AUC {roc_auc(pos_s, neg_s):.3f} ({len(test)} edges, as many random pairs)")
        asyncgraph.finalize()


if __name__ == "__main__":
    main()
