"""DGL's ``dgl.sampling`` names that apply to a DistGraph.

DGL's user guide writes ``dgl.sampling.MultiLayerNeighborSampler`` (the class lives in
``dgl.dataloading``) and ``dgl.sampling.sample_neighbors``; both resolve here so its snippets run.
"""

from __future__ import annotations

from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.distributed.sampling import sample_neighbors

__all__ = ["MultiLayerNeighborSampler", "NeighborSampler", "sample_neighbors"]

MultiLayerNeighborSampler = NeighborSampler
