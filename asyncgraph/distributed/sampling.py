"""``sample_neighbors`` over a DistGraph (each owner samples its seeds, all concurrently), and
DGL's module-level ``find_edges`` / ``in_subgraph``."""

from __future__ import annotations

from typing import Any

import torch

from .graph import DistGraph
from .queries import SampledSubgraph


def sample_neighbors(
    g: DistGraph,
    seeds: Any,
    fanout: int,
    edge_dir: str = "in",
    prob: str | None = None,
    exclude: Any = None,
    replace: bool = False,
    *,
    seed: int | None = None,
    output: str = "graph",
) -> SampledSubgraph | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample up to ``fanout`` edges of every seed, as DGL's ``dgl.distributed.sample_neighbors``.

    ``edge_dir="in"`` samples in-edges (by the seeds' owners), ``"out"`` out-edges (every
    partition samples its edges leaving the seeds; the client merges them exactly). Without
    replacement a seed with at most ``fanout`` candidate edges keeps them all, otherwise a
    uniform subset, or with ``prob`` (the name of a 1-D non-negative edge tensor) a weighted one
    (Efraimidis-Spirakis; zero-weight edges are never picked); with replacement it gets exactly
    ``fanout`` draws; fanout -1 keeps every edge. ``exclude`` edge IDs are dropped before
    sampling. The same ``seed`` gives the same sample.

    Returns a ``SampledSubgraph`` (global ``edges()``, ``edata[EID]``, ``num_edges()``) that
    unpacks as ``(src, dst, eid)``; ``output="tuple"`` returns that tuple.
    """
    return g.sample_neighbors(seeds, fanout, edge_dir, prob, exclude, replace, seed=seed, output=output)


def find_edges(g: DistGraph, edge_ids: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """DGL's ``dgl.distributed.find_edges``: global ``(src, dst)`` of ``edge_ids``."""
    return g.find_edges(edge_ids)


def in_subgraph(g: DistGraph, nodes: Any) -> SampledSubgraph:
    """DGL's ``dgl.distributed.in_subgraph``: every in-edge of ``nodes`` (global IDs, in ``edata[EID]``)."""
    return g.in_subgraph(nodes)
