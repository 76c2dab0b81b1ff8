"""A trainer for tests/test_inference.py: layer-wise inference of PubMed that dies (os._exit, as
if SIGKILLed) after ``--die-after`` batches of layer 1, or resumes and writes the result."""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

import asyncgraph
from asyncgraph.inference import layerwise_inference, write_npy
from asyncgraph.nn import GraphSAGE


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ip-config", required=True)
    ap.add_argument("--die-after", type=int, default=-1)
    ap.add_argument("--out")
    args = ap.parse_args()
    asyncgraph.initialize(args.ip_config)
    g = asyncgraph.DistGraph("pubmed")
    torch.manual_seed(3)
    model = GraphSAGE(500, 16, 3, n_layers=2).eval()
    layer1_batches = 0

    def step(i: int, layer: torch.nn.Module, block: object, h: torch.Tensor) -> torch.Tensor:
        nonlocal layer1_batches
        if i == 1:
            if layer1_batches == args.die_after:
                os._exit(9)  # no cleanup, no goodbye: as a killed trainer
            layer1_batches += 1
        out = layer(block, h)
        return torch.relu(out) if i == 0 else out

    out = layerwise_inference(g, model, "feat", batch_size=4000, name="kill", resume=True, layer_fn=step)
    if args.out:
        write_npy(out, args.out)
        np.save(args.out + ".layer1_batches.npy", np.array([layer1_batches]))
        torch.save(model.state_dict(), args.out + ".model.pt")
    asyncgraph.finalize()


if __name__ == "__main__":
    main()
