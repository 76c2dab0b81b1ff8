"""PyG's remote-backend ``GraphStore`` over a ``DistGraph``: the topology, read on request.

``get_all_edge_attrs`` describes the graph (one COO and one CSC attribute per edge type, with
``size`` set) without reading any edge. ``_get_edge_index`` assembles a whole edge type's
``edge_index`` from the servers (``find_edges`` over every edge ID, or each owner's in-edges of a
type): only for PyG code that walks the store (PyG's own ``NeighborSampler`` builds a CSC from
it, with :meth:`DistGraphStore.csc`). A live graph's edges (issue 35) are listed in edge-ID
order, which is no longer CSC order: the CSC groups them by destination and ``csc`` answers
PyG's edge permutation, the global edge ID of each CSC position, so a loader's ``e_id`` names
the sampled edges. Training through :class:`~asyncgraph.pyg.DistNeighborSampler` never calls it: the servers
sample, and no trainer holds the topology.
"""

from __future__ import annotations

from typing import Any, cast

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
        """COO and CSC per edge type (a CSC's edge permutation: :meth:`csc`)."""
        types: list[tuple[str, str, str] | None] = list(self.book.canonical_etypes) if self.hetero else [None]
        return [
            EdgeAttr(edge_type=t, layout=layout, is_sorted=layout == EdgeLayout.CSC, size=self._size(t))
            for t in types
            for layout in (EdgeLayout.COO, EdgeLayout.CSC)
        ]

    def _coo(self, etype: tuple[str, str, str] | None) -> tuple[np.ndarray, np.ndarray]:
        """Every edge of the type as ``(src, dst)`` (per-type IDs), in (per-type) edge-ID order."""
        src, dst, _ = self._edges(etype)
        return src, dst

    def _edges(self, etype: tuple[str, str, str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every edge of the type as ``(src, dst, eids)`` (per-type IDs), in edge-ID order."""
        client = self.client
        if etype is None:
            live = client.live_edges()  # a live graph's edges (issue 35), in edge-ID order
            if live is not None:
                return live[0], live[1], live[2]
            ne = self.book.num_edges
            parts = [
                client.find_edges(np.arange(lo, min(lo + _CHUNK, ne), dtype=np.int64))
                for lo in range(0, ne, _CHUNK)
            ]
            if not parts:
                return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
            src = np.concatenate([p[0] for p in parts])
            return src, np.concatenate([p[1] for p in parts]), np.arange(ne, dtype=np.int64)
        book = self.book
        dtype_ids = np.arange(book.num_nodes_of(etype[2]), dtype=np.int64)
        seeds = book.map_to_homo_nid(dtype_ids, etype[2])
        out = client.sample_etypes(seeds, etype_fanouts(book, {etype: -1}))
        order = np.argsort(out["type_eid"], kind="stable")
        _, src = book.map_to_per_ntype(out["src"][order])
        _, dst = book.map_to_per_ntype(out["dst"][order])
        return src, dst, np.asarray(out["type_eid"], dtype=np.int64)[order]

    def _csc(self, etype: tuple[str, str, str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(row, colptr, perm)`` of the type: sources grouped by destination (stable: by edge
        ID within one), and the edge ID of each position (None when it is the position, as in a
        graph nobody updated). ``colptr`` covers nodes added since partitioning too."""
        src, dst, eids = self._edges(etype)
        order = np.argsort(dst, kind="stable")
        num_cols = max(self._size(etype)[1], int(dst.max()) + 1 if dst.size else 0)
        colptr = np.zeros(num_cols + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=num_cols), out=colptr[1:])
        perm = eids[order]
        if np.array_equal(perm, np.arange(perm.size)):
            return src, colptr, None  # edge IDs are CSC positions: PyG needs no permutation
        return src[order], colptr, perm

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor]:
        """``(row, col)`` for COO; ``(row, colptr)`` for CSC (sources grouped by destination)."""
        etype = self._edge_type(edge_attr.edge_type)
        layout = EdgeLayout(edge_attr.layout)
        if layout == EdgeLayout.CSR:
            raise InvalidRequestError(
                "layout 'csr' is not served (out-edges are not indexed); use 'coo' or 'csc'"
            )
        if layout == EdgeLayout.COO:
            src, dst = self._coo(etype)
            return torch.from_numpy(src), torch.from_numpy(dst)
        row, colptr, _ = self._csc(etype)
        return torch.from_numpy(row), torch.from_numpy(colptr)

    def csc(self, edge_types: list[Any] | None = None, store: bool = False) -> Any:
        """PyG's ``GraphStore.csc``: ``(row, colptr, perm)`` (dicts by edge type when
        heterogeneous), ``perm`` the edge ID of each CSC position (PyG's loaders map sampled
        positions through it to ``e_id``) or None where the two agree. ``store`` is ignored:
        the store is read-only."""
        if not self.hetero:
            row, colptr, perm = self._csc(None)
            return torch.from_numpy(row), torch.from_numpy(colptr), _tensor(perm)
        wanted = [self._edge_type(t) for t in edge_types] if edge_types is not None else None
        rows: dict[Any, torch.Tensor] = {}
        cols: dict[Any, torch.Tensor] = {}
        perms: dict[Any, torch.Tensor | None] = {}
        for etype in cast(list[tuple[str, str, str]], list(self.book.canonical_etypes)):
            if wanted is not None and etype not in wanted:
                continue
            row, colptr, perm = self._csc(etype)
            rows[etype], cols[etype] = torch.from_numpy(row), torch.from_numpy(colptr)
            perms[etype] = _tensor(perm)
        return rows, cols, perms

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


def _tensor(values: np.ndarray | None) -> torch.Tensor | None:
    return None if values is None else torch.from_numpy(values)
