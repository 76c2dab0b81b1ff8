"""PyG's remote-backend ``GraphStore`` over a ``DistGraph``: the topology, read on request.

``get_all_edge_attrs`` describes the graph (one COO and one CSC attribute per edge type, with
``size`` set) without reading any edge. ``_get_edge_index`` assembles a whole edge type's
``edge_index`` from the servers (``find_edges`` over every edge ID, or each owner's in-edges of a
type): only for PyG code that walks the store (PyG's own ``NeighborSampler`` builds a CSC from
it). Training through :class:`~asyncgraph.pyg.DistNeighborSampler` never calls it: the servers
sample, and no trainer holds the topology.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, GraphStore
from torch_geometric.data.graph_store import EdgeLayout

from asyncgraph.dataloading.fetch import client_of
from asyncgraph.distributed.hetero import etype_fanouts
from asyncgraph.errors import InvalidRequestError, UnknownTypeError

from .link import ClientLink, LinkedStore

__all__ = ["DistGraphStore"]

_CHUNK = 1 << 22  # edge IDs per find_edges call when assembling a homogeneous COO


class DistGraphStore(LinkedStore, GraphStore):  # type: ignore[misc]
    """PyG ``GraphStore`` whose edges are a ``DistGraph``'s (read-only: the servers own them).

    Picklable and fork-safe (``link.py``): PyG's loaders may use it in ``num_workers`` processes."""

    def __init__(self, g: Any) -> None:
        super().__init__()
        self._graph: Any = g
        self._link = ClientLink(client_of(g))
        self.hetero = bool(self.book.is_hetero)

    def _edge_type(self, edge_type: Any) -> tuple[str, str, str] | None:
        if not self.hetero:
            if edge_type is not None:
                raise UnknownTypeError(f"edge_type {edge_type!r}: the graph is homogeneous (use None)")
            return None
        book = self.book
        return book.canonical_etypes[
            book.etype_id(tuple(edge_type) if isinstance(edge_type, list) else edge_type)
        ]

    def _size(self, etype: tuple[str, str, str] | None) -> tuple[int, int]:
        if etype is None:
            n = self.book.num_nodes
            return (n, n)
        return (self.book.num_nodes_of(etype[0]), self.book.num_nodes_of(etype[2]))

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """COO and CSC per edge type (edge IDs are in CSC order, so CSC needs no permutation)."""
        types: list[tuple[str, str, str] | None] = list(self.book.canonical_etypes) if self.hetero else [None]
        return [
            EdgeAttr(edge_type=t, layout=layout, is_sorted=layout == EdgeLayout.CSC, size=self._size(t))
            for t in types
            for layout in (EdgeLayout.COO, EdgeLayout.CSC)
        ]

    def _coo(self, etype: tuple[str, str, str] | None) -> tuple[np.ndarray, np.ndarray]:
        """Every edge of the type as ``(src, dst)`` (per-type IDs), in (per-type) edge-ID order."""
        client = self.client
        if etype is None:
            live = client.live_edges()  # a live graph's edges (issue 35), in edge-ID order
            if live is not None:
                return live[0], live[1]
            ne = self.book.num_edges
            parts = [
                client.find_edges(np.arange(lo, min(lo + _CHUNK, ne), dtype=np.int64))
                for lo in range(0, ne, _CHUNK)
            ]
            if not parts:
                return np.empty(0, np.int64), np.empty(0, np.int64)
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        book = self.book
        dtype_ids = np.arange(book.num_nodes_of(etype[2]), dtype=np.int64)
        seeds = book.map_to_homo_nid(dtype_ids, etype[2])
        out = client.sample_etypes(seeds, etype_fanouts(book, {etype: -1}))
        order = np.argsort(out["type_eid"], kind="stable")
        _, src = book.map_to_per_ntype(out["src"][order])
        _, dst = book.map_to_per_ntype(out["dst"][order])
        return src, dst

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor]:
        """``(row, col)`` for COO; ``(row, colptr)`` for CSC (sources grouped by destination)."""
        etype = self._edge_type(edge_attr.edge_type)
        layout = EdgeLayout(edge_attr.layout)
        if layout == EdgeLayout.CSR:
            raise InvalidRequestError(
                "layout 'csr' is not served (out-edges are not indexed); use 'coo' or 'csc'"
            )
        src, dst = self._coo(etype)
        if layout == EdgeLayout.COO:
            return torch.from_numpy(src), torch.from_numpy(dst)
        if dst.size and bool((np.diff(dst) < 0).any()):  # edge IDs are in CSC order by construction
            raise InvalidRequestError(f"edges of {etype} are not in CSC order; ask for layout 'coo'")
        counts = np.bincount(dst, minlength=self._size(etype)[1])
        colptr = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=colptr[1:])
        return torch.from_numpy(src), torch.from_numpy(colptr)

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        raise InvalidRequestError(
            "DistGraphStore is read-only: edges are partitioned offline (asyncgraph.partition_graph)"
        )

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise InvalidRequestError(
            "DistGraphStore is read-only: edges are partitioned offline (asyncgraph.partition_graph)"
        )

    def __repr__(self) -> str:
        return f"DistGraphStore({self.graph!r})"
