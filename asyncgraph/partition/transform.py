"""Graph transforms DGL's partition scripts call before ``partition_graph``.

``to_bidirected``: DGL's ``examples/distributed/graphsage/partition_graph.py --undirected`` runs
``dgl.to_bidirected(g, readonly=True)`` and copies ``ndata`` over itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgraph.arrays import unique_sorted
from asyncgraph.errors import InvalidRequestError

from .graph import Graph

__all__ = ["to_bidirected"]


def to_bidirected(g: Graph, copy_ndata: bool = False, readonly: Any = None) -> Graph:
    """A simple graph with an edge both ways for every edge of ``g`` (DGL's ``to_bidirected``).

    Duplicate edges are dropped and edges come sorted by ``(src, dst)``, as DGL's; self-loops
    stay once. No edge tensors are kept (edge IDs change); ``ndata`` only with ``copy_ndata``
    (DGL's default leaves it out too). ``readonly`` is accepted for DGL call sites (graphs here
    are always read-only in structure). Vectorised: one ``np.unique`` over ``2 * num_edges`` keys.
    """
    if not isinstance(g, Graph):
        raise InvalidRequestError(f"to_bidirected takes a homogeneous Graph, got {type(g).__name__}")
    n = g.num_nodes()
    src, dst = g.edges()
    keys = unique_sorted(np.concatenate([src * n + dst, dst * n + src])) if n else np.empty(0, np.int64)
    out = Graph(n, keys // max(n, 1), keys % max(n, 1))
    if copy_ndata:
        for name, value in g.ndata.items():
            out.ndata[name] = value
    return out
