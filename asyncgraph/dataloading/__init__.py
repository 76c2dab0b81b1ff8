"""Mini-batch construction: blocks, multi-layer neighbour samplers and prefetching loaders.

The loaders pull in the client stack, so they are imported lazily on first access:
``prefetch`` (the engine, ``DistDataLoader``), ``node_loader`` (``DistNodeDataLoader``,
``MiniBatch``) and ``edge_loader`` (``DistEdgeDataLoader``, ``EdgeMiniBatch``, ``PairGraph``).
``Block``, ``to_block`` and ``NeighborSampler`` stay light (numpy + torch only).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from asyncgraph.dataloading import negative
from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.dataloading.sampler import NeighborSampler, SampleFn

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
    "DistDataLoader": "prefetch",
    "DistEdgeDataLoader": "edge_loader",
    "DistNodeDataLoader": "node_loader",
    "EdgeMiniBatch": "edge_loader",
    "MiniBatch": "node_loader",
    "NodeDataLoader": "node_loader",  # DGL's older names: on a DistGraph they are the Dist* loaders
    "EdgeDataLoader": "edge_loader",
    "PairGraph": "edge_loader",
}

_OLD_NAMES = {"NodeDataLoader": "DistNodeDataLoader", "EdgeDataLoader": "DistEdgeDataLoader"}


def __getattr__(name: str) -> Any:
    """Import the loader classes on first use (they depend on the client stack)."""
    if name in _LAZY:
        real = {"NodeDataLoader": "DistNodeDataLoader", "EdgeDataLoader": "DistEdgeDataLoader"}.get(
            name, name
        )
        return getattr(importlib.import_module(f"asyncgraph.dataloading.{_LAZY[name]}"), real)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
