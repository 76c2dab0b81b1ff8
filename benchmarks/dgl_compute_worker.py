"""DGL 2.1's side of ``benchmarks.compute_vs_dgl``; runs under DGL's venv (imports dgl, not asyncgraph).

``python dgl_compute_worker.py BLOCKS.npz REPEATS HIDDEN CLASSES``: builds ``dgl.create_block``
from the saved edges and times forward + loss + backward + Adam step of the model DGL's
harness trains (``../shared/peers/dgl/bench_dist.py``: two ``SAGEConv(.., "mean")``, ReLU and
dropout 0.5 between them, Adam lr 0.003) per batch, one torch thread, CPU time of that thread.
Prints one JSON line: ``{"per_batch_ms": [...]}`` (one mean per timed pass).
"""

from __future__ import annotations

import json
import sys
import time

import dgl
import dgl.nn.pytorch as dglnn
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class SAGE(nn.Module):
    """The harness's model (bench_dist.py)."""

    def __init__(self, i: int, h: int, o: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([dglnn.SAGEConv(i, h, "mean"), dglnn.SAGEConv(h, o, "mean")])
        self.dropout = nn.Dropout(0.5)

    def forward(self, blocks: list, x: torch.Tensor) -> torch.Tensor:
        h = x
        for li, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
            h = layer(block, h)
            if li != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


def main() -> None:
    path, repeats, hidden, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = np.load(path)
    nb, nl = int(data["num_batches"]), int(data["num_layers"])
    if nl != 2:
        sys.exit("the harness's model has two layers")
    batches = []
    for b in range(nb):
        blocks = []
        for layer in range(nl):
            num_src, num_dst = (int(v) for v in data[f"b{b}_l{layer}_shape"])
            src = torch.from_numpy(data[f"b{b}_l{layer}_src"])
            dst = torch.from_numpy(data[f"b{b}_l{layer}_dst"])
            blocks.append(dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=num_dst))
        batches.append((blocks, torch.from_numpy(data[f"b{b}_x"]), torch.from_numpy(data[f"b{b}_y"])))
    model = SAGE(batches[0][1].shape[1], hidden, classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.003)

    def step(blocks: list, x: torch.Tensor, y: torch.Tensor) -> float:
        t0 = time.thread_time()
        out = model(blocks, x)
        loss = F.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.thread_time() - t0

    for blocks, x, y in batches[:2]:
        step(blocks, x, y)
    times = [[step(*batch) for batch in batches] for _ in range(repeats)]
    print(json.dumps({"per_batch_ms": [sum(t) / len(t) * 1e3 for t in times]}))


if __name__ == "__main__":
    main()
