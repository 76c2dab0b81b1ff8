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
    from asyncgraph.dataloading.node_loader import DistNodeDataLoader, MiniBatch
    from asyncgraph.dataloading.prefetch import DistDataLoader

__all__ = [
    "Block",
    "DistDataLoader",
    "DistEdgeDataLoader",
    "DistNodeDataLoader",
    "EdgeMiniBatch",
    "MiniBatch",
    "NeighborSampler",
    "PairGraph",
    "SampleFn",
    "negative",
    "negative_sampler",
    "to_block",
]

negative_sampler = negative  # DGL's module name: ``negative_sampler.Uniform(k)``

_LAZY = {
    "DistDataLoader": "prefetch",
    "DistEdgeDataLoader": "edge_loader",
    "DistNodeDataLoader": "node_loader",
    "EdgeMiniBatch": "edge_loader",
    "MiniBatch": "node_loader",
    "PairGraph": "edge_loader",
}


def __getattr__(name: str) -> Any:
    """Import the loader classes on first use (they depend on the client stack)."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"asyncgraph.dataloading.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
