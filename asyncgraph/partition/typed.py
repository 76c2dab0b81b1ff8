"""Per-type tensors of a heterogeneous partition: how they are written, and which rows a part holds.

A heterogeneous graph's partitioned tensors are stored per (type, name), as DGL's partitions
store them: ``"paper/feat"`` (``names.typed_name``) holds rows of ``paper`` nodes only, whatever
the other types' ``feat`` look like, and no type pads another's. Partition ``p`` holds of it
its own ``paper`` nodes' rows in per-type ID order (file ``part<p>/node_feat/paper/feat.npy``).

Those nodes are one contiguous run of ``p``'s homogeneous IDs (``partition_graph`` sorts a
part's nodes by type), so the tensor is an ordinary node tensor whose owned range is that run
(:func:`typed_range`): pulls and pushes address it by homogeneous ID (per-type IDs mapped by
``book.map_to_homo_nid``), routed by the node bounds like any node tensor; the owner's row is
``id - run start``, i.e. ``per-type ID - the part's first per-type ID`` (DGL's arithmetic). An
edge type's tensor (``"user:buys:item/w"``) is addressed likewise by positions in the part's
type order (``book.type_order_positions``: a range computation, no read from the owners).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import TYPED_SEP, split_typed, typed_name
from asyncgraph.partition.book import IdArray, RangePartitionBook

__all__ = ["check_typed_names", "edge_type_key", "typed_range", "typed_specs", "write_typed_part"]

RowWriter = Callable[[Path, np.ndarray[Any, Any], IdArray], None]


def edge_type_key(c: tuple[str, str, str]) -> str:
    """An edge type's key in stored names and the config (``"src:rel:dst"``)."""
    return ":".join(c)


def typed_range(book: RangePartitionBook, part_id: int, key: str) -> tuple[int, int] | None:
    """Global rows ``[lo, hi)`` partition ``part_id`` holds of per-type tensor ``key``
    (``"node:paper/feat"``, ``"edge:user:buys:item/w"``); None for any other tensor."""
    policy, _, name = key.partition(":")
    split = split_typed(name) if book.is_hetero else None
    if split is None:
        return None
    type_key = split[0]
    canon = {edge_type_key(c): c for c in book.canonical_etypes}
    if policy == "node" and type_key in book.ntypes:
        bounds, owned = book.ntype_bounds(type_key), book.node_range(part_id)
    elif policy == "edge" and type_key in canon:
        bounds, owned = book.etype_bounds(canon[type_key]), book.edge_range(part_id)
    else:
        return None
    count = int(bounds[part_id + 1] - bounds[part_id])
    if count == 0:
        return owned[0], owned[0]
    first_id = bounds[part_id : part_id + 1]  # the part's first per-type ID, and where it sits:
    if policy == "node":
        lo = int(book.map_to_homo_nid(first_id, type_key)[0])  # a homogeneous node ID
    else:
        lo = int(book.type_order_positions(first_id, canon[type_key])[0])  # a type-order position
    return lo, lo + count


def check_typed_names(hetero: Any) -> None:
    """Type names of a heterogeneous graph must be usable as stored names and folder names: no
    ``"/"``, not ``"."`` or ``".."`` (``InvalidRequestError`` before anything is written; tensor
    names are checked when they are set)."""
    names = [("node type", t) for t in hetero.ntypes]
    names += [("relation", c[1]) for c in hetero.canonical_etypes]
    for what, name in names:
        if TYPED_SEP in name or name in (".", "..") or "\0" in name:
            raise InvalidRequestError(
                f"{what} {name!r} cannot be stored: per-type tensors are stored as files "
                f"'<type>/<name>.npy', so names may not hold '/' or NUL, nor be '.' or '..'"
            )


def typed_specs(hetero: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(node, edge)`` ``{stored name: array}`` of every per-type tensor (arrays over that
    type's original per-type IDs), sorted by name as the chunked path lists them."""
    nodes = {
        typed_name(t, n): hetero.nodes[t].data[n]
        for t, names in hetero.ntype_data_names().items()
        for n in names
    }
    edges = {
        typed_name(edge_type_key(c), n): hetero.edges[c].data[n]
        for c in hetero.canonical_etypes
        for n in sorted(hetero.edges[c].data)
    }
    return dict(sorted(nodes.items())), dict(sorted(edges.items()))


def write_typed_part(
    hetero: Any,
    write_rows: RowWriter,
    node_path: Callable[[str], Path],
    edge_path: Callable[[str], Path],
    part_nids: IdArray,
    part_eids: IdArray,
    ntype: IdArray,
    etype: IdArray,
) -> None:
    """Write one part's rows of every per-type tensor: for type ``t``, the part's nodes of ``t``
    (``part_nids``: original homogeneous IDs in the part's order, which is per-type ID order),
    edges likewise (``part_eids`` in CSC order, which per-type edge IDs follow)."""
    noff, eoff = hetero.node_offsets(), hetero.edge_offsets()
    nt, et = ntype[part_nids], etype[part_eids]
    for i, t in enumerate(hetero.ntypes):
        data = hetero.nodes[t].data
        if data:
            rows = part_nids[nt == i] - noff[i]
            for name in sorted(data):
                path = node_path(typed_name(t, name))
                path.parent.mkdir(parents=True, exist_ok=True)
                write_rows(path, data[name], rows)
    for i, c in enumerate(hetero.canonical_etypes):
        data = hetero.edges[c].data
        if data:
            rows = part_eids[et == i] - eoff[i]
            for name in sorted(data):
                path = edge_path(typed_name(edge_type_key(c), name))
                path.parent.mkdir(parents=True, exist_ok=True)
                write_rows(path, data[name], rows)
