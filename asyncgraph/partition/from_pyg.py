"""PyG's ``Data`` / ``HeteroData`` as asyncgraph graphs, for ``partition_graph`` (issue 33 item 9).

Read by duck typing (``edge_index``, ``num_nodes``, ``node_types``, ``is_node_attr``): the
partitioner never imports torch_geometric. Tensors keep PyG's names (``x``, ``y``,
``train_mask``, ...), so batches of ``asyncgraph.pyg``'s loaders carry them under the same
names. ``edge_index[0]`` is the source and ``edge_index[1]`` the destination (PyG's default
``source_to_target`` flow), as asyncgraph's ``src``/``dst``. Node attributes become node
tensors and edge attributes edge tensors; anything else (graph-level values, strings, sparse
``adj_t``) is refused by name rather than dropped silently.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError

from .graph import Graph
from .hetero_graph import HeteroGraph

__all__ = ["from_pyg", "is_pyg_data"]

_STRUCTURE = frozenset({"edge_index", "num_nodes"})


def is_pyg_data(obj: Any) -> bool:
    """Whether ``obj`` is a torch_geometric ``Data`` or ``HeteroData`` (by its class's module)."""
    return any(
        c.__module__.startswith("torch_geometric.") and c.__name__ in ("Data", "HeteroData")
        for c in type(obj).__mro__
    )


def _edges(store: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    edge_index = getattr(store, "edge_index", None)
    if edge_index is None:
        raise InvalidRequestError(
            f"{where}: no edge_index (a sparse adj_t is not read: convert it with ToSparseTensor's inverse)"
        )
    arr = edge_index.detach().cpu().numpy() if hasattr(edge_index, "detach") else np.asarray(edge_index)
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise InvalidRequestError(f"{where}: edge_index must have shape [2, E], got {arr.shape}")
    return arr[0].astype(np.int64), arr[1].astype(np.int64)


def _tensors(store: Any, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(node tensors, edge tensors)`` of one PyG storage, by PyG's own node/edge test."""
    ndata: dict[str, Any] = {}
    edata: dict[str, Any] = {}
    for key in store.keys():  # noqa: SIM118 (a PyG Data iterates as (key, value) pairs)
        if key in _STRUCTURE:
            continue
        value = store[key]
        if not hasattr(value, "detach"):
            raise InvalidRequestError(
                f"{where}: attribute {key!r} is not a tensor ({type(value).__name__}); partitions "
                "hold node and edge tensors only: remove it first"
            )
        if store.is_node_attr(key):
            ndata[key] = value.detach().cpu()
        elif store.is_edge_attr(key):
            edata[key] = value.detach().cpu()
        else:
            raise InvalidRequestError(
                f"{where}: attribute {key!r} (shape {tuple(value.shape)}) is neither per node nor per "
                "edge; partitions hold node and edge tensors only: remove it first"
            )
    return ndata, edata


def from_pyg(data: Any) -> Graph | HeteroGraph:
    """An asyncgraph ``Graph`` (from ``Data``) or ``HeteroGraph`` (from ``HeteroData``)."""
    if not hasattr(data, "node_types"):
        src, dst = _edges(data, "Data")
        ndata, edata = _tensors(data, "Data")
        if data.num_nodes is None:
            raise InvalidRequestError("Data: num_nodes is unknown (set data.num_nodes)")
        return Graph(int(data.num_nodes), src, dst, ndata=ndata, edata=edata)
    edges = {}
    for etype in data.edge_types:
        if len(etype) != 3:
            raise InvalidRequestError(f"HeteroData: edge type {etype!r} is not (src, relation, dst)")
        edges[tuple(etype)] = _edges(data[etype], f"HeteroData[{etype!r}]")
    counts = {}
    for ntype in data.node_types:
        n = data[ntype].num_nodes
        if n is None:
            raise InvalidRequestError(f"HeteroData[{ntype!r}]: num_nodes is unknown (set it)")
        counts[ntype] = int(n)
    graph = HeteroGraph(edges, counts)
    for ntype in data.node_types:
        ndata, _ = _tensors(data[ntype], f"HeteroData[{ntype!r}]")
        for name, value in ndata.items():
            graph.nodes[ntype].data[name] = value
    for etype in data.edge_types:
        ndata, edata = _tensors(data[etype], f"HeteroData[{etype!r}]")
        for name, value in {**ndata, **edata}.items():
            graph.edges[tuple(etype)].data[name] = value
    return graph
