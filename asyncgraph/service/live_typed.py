"""Heterogeneous updates of a live partition (issue 35): node types and relations of new IDs.

A heterogeneous partition holds the partitioner's node tensor ``_TYPE`` and edge tensors
``_ETYPE`` / ``_TYPE_EID``; rows of new IDs live in the overlay like any tensor's. A typed
``add_nodes`` carries its node type as ``_TYPE`` rows (one type a call): the owner gives the
nodes typed slots (``Overlay.add_nodes``). A typed ``add_edges`` carries each edge's relation as
``_ETYPE`` rows, checked here against the types of both ends (``NodeTypeMismatchError``,
nothing changes), and the owner writes each new edge's per-type ID into ``_TYPE_EID``
(``partition/added_ids.py``). A graph with one node type or one relation needs none of them.
"""

from __future__ import annotations

import numpy as np

from asyncgraph.errors import DuplicateEdgeError, InvalidRequestError, NodeTypeMismatchError, UnknownTypeError
from asyncgraph.kernels.edge_queries import segment_positions
from asyncgraph.kernels.overlay_edges import sample_edges_live
from asyncgraph.kernels.overlay_typed import edge_rows
from asyncgraph.kernels.unique_edges import repeated_new_edge
from asyncgraph.names import ETYPE, NTYPE, TYPE_EID, tensor_key
from asyncgraph.storage.overlay import Overlay, new_edge_ids
from asyncgraph.storage.overlay_rows import RowData
from asyncgraph.storage.store import PartitionStore

__all__ = ["check_unique_adds", "edge_types_of", "node_type_of", "type_eid_rows"]

NTYPE_KEY, ETYPE_KEY, TEID_KEY = (
    tensor_key("node", NTYPE),
    tensor_key("edge", ETYPE),
    tensor_key("edge", TYPE_EID),
)


def _rows_of(rows: RowData, key: str) -> np.ndarray | None:
    return next((values for name, _, values in rows if name == key), None)


def node_type_of(store: PartitionStore, rows: RowData, num: int) -> int:
    """The node type of an ``add_nodes`` request (its ``_TYPE`` rows; 0 on a graph of one type)."""
    book = store.book
    given = _rows_of(rows, NTYPE_KEY) if book.is_hetero else None
    if given is None or not num:
        if given is None and len(book.ntypes) > 1 and num:
            raise InvalidRequestError(
                f"add_nodes on a heterogeneous graph needs a node type (ntype=); types: {book.ntypes}"
            )
        return 0
    types = np.unique(given)
    if types.size != 1:
        raise InvalidRequestError(f"add_nodes adds nodes of one type a call, got types {types.tolist()}")
    t = int(types[0])
    if not 0 <= t < len(book.ntypes):
        raise UnknownTypeError(f"add_nodes: node type {t} does not exist; types: {book.ntypes}")
    return t


def edge_types_of(
    store: PartitionStore, src: np.ndarray, dst: np.ndarray, rows: RowData
) -> np.ndarray | None:
    """Each new edge's relation (its ``_ETYPE`` row) on a heterogeneous partition, checked
    against its ends' node types; None on a homogeneous one. Adds zero ``_ETYPE`` rows to
    ``rows`` when the graph has one relation and the request named none."""
    book = store.book
    if not book.is_hetero:
        return None
    canon = book.canonical_etypes
    given = _rows_of(rows, ETYPE_KEY)
    if given is None:
        if len(canon) > 1 and src.size:
            raise InvalidRequestError(
                f"add_edges on a heterogeneous graph needs an edge type; types: {canon}"
            )
        given = np.zeros(src.size, store.tensor_meta(ETYPE_KEY).dtype)
        rows.append((ETYPE_KEY, "edge", given))
    et = np.asarray(given, dtype=np.int64).reshape(-1)
    if et.size and (int(et.min()) < 0 or int(et.max()) >= len(canon)):
        bad = int(et[(et < 0) | (et >= len(canon))][0])
        raise UnknownTypeError(f"add_edges: edge type {bad} does not exist; types: {canon}")
    src_types = np.asarray([book.ntype_id(c[0]) for c in canon], dtype=np.int64)
    dst_types = np.asarray([book.ntype_id(c[2]) for c in canon], dtype=np.int64)
    s_t, _ = book.map_to_per_ntype(src)
    d_t, _ = book.map_to_per_ntype(dst)
    bad_at = np.flatnonzero((s_t != src_types[et]) | (d_t != dst_types[et]))
    if bad_at.size:
        i = int(bad_at[0])
        raise NodeTypeMismatchError(
            f"add_edges: edge {i} ({int(src[i])} -> {int(dst[i])}) is a {canon[et[i]]} edge but joins a "
            f"{book.ntypes[s_t[i]]!r} node to a {book.ntypes[d_t[i]]!r} node"
        )
    return et


def type_eid_rows(store: PartitionStore, etypes: np.ndarray, first: int) -> tuple[str, str, np.ndarray]:
    """The ``_TYPE_EID`` rows of edges appended at slots ``first...`` of relations ``etypes``:
    ``E_r + (ID - E)``."""
    book = store.book
    slots = first + np.arange(etypes.size, dtype=np.int64)
    ids = new_edge_ids(book.num_edges, store.part_id, book.num_partitions(), slots)
    tops = np.asarray([book.num_edges_of(c) for c in book.canonical_etypes], dtype=np.int64)
    meta = store.tensor_meta(TEID_KEY)
    values = (tops[etypes] + ids - book.num_edges).astype(meta.dtype).reshape(-1, *meta.row_shape)
    return TEID_KEY, "edge", values


def check_unique_adds(
    store: PartitionStore,
    overlay: Overlay | None,
    src: np.ndarray,
    dst: np.ndarray,
    etypes: np.ndarray | None,
) -> None:
    """``DuplicateEdgeError`` (nothing changes) when a new edge ``src -> dst`` (global IDs, of
    relation ``etypes``) is live already or comes twice: a graph partitioned with
    ``multigraph=False``. Reads the destinations' live in-edges under the read lock."""
    seeds = np.unique(dst)
    with store.lock.read():
        if overlay is None:
            indptr = np.asarray(store.indptr)
            local = seeds - store.node_range[0]
            seg, j = segment_positions(indptr[local], indptr[local + 1] - indptr[local])
            old_src, old_dst = np.asarray(store.indices)[j], seeds[seg]
            rel = np.asarray(store.local_rows(ETYPE_KEY))[j] if etypes is not None else None
        else:
            every = sample_edges_live(
                store, overlay, None, seeds, -1, edge_dir="in", replace=False, seed=0, prob=None, exclude=None
            )
            old_src, old_dst = every["src"], every["dst"]
            rel = edge_rows(store, overlay, ETYPE_KEY, every["eids"]) if etypes is not None else None
    old_rel = np.zeros(old_src.size, np.int64) if rel is None else np.asarray(rel, np.int64)
    new_rel = np.zeros(src.size, np.int64) if etypes is None else etypes
    at = repeated_new_edge((old_src, old_dst, old_rel), (src, dst, new_rel))
    if at is not None:
        raise DuplicateEdgeError(
            f"add_edges: edge {int(src[at])} -> {int(dst[at])} exists already (this graph was "
            "partitioned with multigraph=False)"
        )
