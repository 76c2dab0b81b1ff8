"""Negative samplers for link prediction (DGL's ``dgl.dataloading.negative_sampler``).

A negative sampler turns a batch's positive edges into ``(src, dst)`` pairs that are (most
likely) not edges. ``DistEdgeDataLoader`` calls ``generate`` with the batch's positive sources
and a generator keyed by the batch, so negatives are reproducible at any prefetch depth.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from asyncgraph.errors import DTypeMismatchError, InvalidRequestError
from asyncgraph.partition.book import as_id_array

__all__ = ["NegativeSampler", "Uniform"]


class NegativeSampler(Protocol):
    """What ``DistEdgeDataLoader`` needs from a negative sampler."""

    def generate(
        self, src: np.ndarray, num_nodes: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Global int64 ``(neg_src, neg_dst)`` for positive sources ``src``."""
        ...


class Uniform:
    """``k`` negatives per positive edge: the edge's source and a destination uniform over all nodes."""

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise DTypeMismatchError(f"k must be an integer, got {k!r}")
        if int(k) < 1:
            raise InvalidRequestError(f"k must be at least 1, got {k}")
        self.k = int(k)

    def generate(
        self, src: np.ndarray, num_nodes: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(repeat(src, k), uniform destinations)``: negatives of positive ``i`` at ``[i*k, (i+1)*k)``."""
        neg_src = np.repeat(as_id_array(src, "src"), self.k)
        neg_dst = rng.integers(0, num_nodes, size=neg_src.size, dtype=np.int64)
        return neg_src, neg_dst

    def __call__(self, g: Any, eids: Any, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """DGL's form: negatives for edges ``eids`` of graph ``g`` (a ``DistGraph``) as tensors."""
        src, _ = g.find_edges(eids)
        rng = np.random.default_rng(seed)
        neg_src, neg_dst = self.generate(as_id_array(src, "src"), int(g.num_nodes()), rng)
        return torch.from_numpy(neg_src), torch.from_numpy(neg_dst)

    def __repr__(self) -> str:
        return f"Uniform(k={self.k})"
