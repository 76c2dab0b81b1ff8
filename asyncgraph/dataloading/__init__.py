"""Mini-batch construction: blocks, multi-layer neighbour samplers and prefetching loaders.

The loaders (``DistNodeDataLoader``, ``DistDataLoader``, ``MiniBatch``) live in ``loader`` and
pull in the client stack, so they are imported lazily on first access; ``Block``, ``to_block``
and ``NeighborSampler`` stay light (numpy + torch only).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from asyncgraph.dataloading import negative
from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.dataloading.sampler import NeighborSampler, SampleFn

if TYPE_CHECKING:
    from asyncgraph.dataloading.loader import (
        DistDataLoader,
        DistEdgeDataLoader,
        DistNodeDataLoader,
        EdgeMiniBatch,
        MiniBatch,
        PairGraph,
    )

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
    "DistDataLoader",
    "DistEdgeDataLoader",
    "DistNodeDataLoader",
    "EdgeMiniBatch",
    "MiniBatch",
    "PairGraph",
}


def __getattr__(name: str) -> Any:
    """Import the loader classes on first use (they depend on the client stack)."""
    if name in _LAZY:
        return getattr(importlib.import_module("asyncgraph.dataloading.loader"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
