"""Mini-batch construction: blocks, multi-layer neighbour samplers and prefetching loaders.

The loaders (``DistNodeDataLoader``, ``DistDataLoader``, ``MiniBatch``) live in ``loader`` and
pull in the client stack, so they are imported lazily on first access; ``Block``, ``to_block``
and ``NeighborSampler`` stay light (numpy + torch only).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.dataloading.sampler import NeighborSampler, SampleFn

if TYPE_CHECKING:
    from asyncgraph.dataloading.loader import DistDataLoader, DistNodeDataLoader, MiniBatch

__all__ = [
    "Block",
    "DistDataLoader",
    "DistNodeDataLoader",
    "MiniBatch",
    "NeighborSampler",
    "SampleFn",
    "to_block",
]

_LAZY = {"DistDataLoader", "DistNodeDataLoader", "MiniBatch"}


def __getattr__(name: str) -> Any:
    """Import the loader classes on first use (they depend on the client stack)."""
    if name in _LAZY:
        return getattr(importlib.import_module("asyncgraph.dataloading.loader"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
