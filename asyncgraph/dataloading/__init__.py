"""Mini-batch construction: blocks, multi-layer neighbour samplers and prefetching loaders.

The loaders pull in the client stack, so they are imported lazily on first access:
``prefetch`` (the engine, ``DistDataLoader``), ``node_loader`` (``DistNodeDataLoader``,
``MiniBatch``) and ``edge_loader`` (``DistEdgeDataLoader``, ``EdgeMiniBatch``, ``PairGraph``).
``Block``, ``to_block`` and ``NeighborSampler`` stay light (numpy + torch only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncgraph.dataloading import negative
from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.dataloading.sampler import NeighborSampler, SampleFn
from asyncgraph.lazy import lazy_exports

if TYPE_CHECKING:
    from asyncgraph.dataloading.edge_loader import DistEdgeDataLoader, EdgeMiniBatch, PairGraph
    from asyncgraph.dataloading.edge_loader import DistEdgeDataLoader as EdgeDataLoader
    from asyncgraph.dataloading.node_loader import DistNodeDataLoader, MiniBatch
    from asyncgraph.dataloading.node_loader import DistNodeDataLoader as NodeDataLoader
    from asyncgraph.dataloading.prefetch import DistDataLoader

__all__ = [
    "Block",
    "DistDataLoader",
    "DistEdgeDataLoader",
    "DistNodeDataLoader",
    "EdgeDataLoader",
    "EdgeMiniBatch",
    "MiniBatch",
    "MultiLayerNeighborSampler",
    "NeighborSampler",
    "NodeDataLoader",
    "PairGraph",
    "SampleFn",
    "negative",
    "negative_sampler",
    "to_block",
]

negative_sampler = negative  # DGL's module name: ``negative_sampler.Uniform(k)``

#: DGL's older name of ``NeighborSampler`` (still in its distributed tutorials).
MultiLayerNeighborSampler = NeighborSampler

_LAZY = {
    "DistDataLoader": "asyncgraph.dataloading.prefetch",
    "DistEdgeDataLoader": "asyncgraph.dataloading.edge_loader",
    "DistNodeDataLoader": "asyncgraph.dataloading.node_loader",
    "EdgeMiniBatch": "asyncgraph.dataloading.edge_loader",
    "MiniBatch": "asyncgraph.dataloading.node_loader",
    "PairGraph": "asyncgraph.dataloading.edge_loader",
    # DGL's older names: on a DistGraph they are the Dist* loaders
    "NodeDataLoader": "asyncgraph.dataloading.node_loader:DistNodeDataLoader",
    "EdgeDataLoader": "asyncgraph.dataloading.edge_loader:DistEdgeDataLoader",
}

#: Import the loader classes on first use (they depend on the client stack).
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
