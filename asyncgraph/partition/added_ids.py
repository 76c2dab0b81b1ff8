"""IDs of a live graph's added nodes and edges (issue 35), typed or not: arithmetic, no table.

Partition ``p`` of ``P`` gives its added nodes the global IDs ``N + p + s * P`` (``N`` the base
node count), slot ``s = k * T + t`` for the ``k``-th node of type ``t`` (``T`` node types) it
added; that node's per-type ID is ``N_t + p + k * P`` (``N_t`` the base count of type ``t``).
So owner, type and per-type ID of an added node follow from its ID, both ways; a homogeneous
graph (``T = 1``) numbers them ``N + p + k * P``. An appended edge has the global ID
``E + p + k * P`` (its owner's ``k``-th); of relation ``r`` its per-type ID is
``E_r + (ID - E)``: unique within the relation, not dense (the owner holds its relation in
``_ETYPE`` and this ID in ``_TYPE_EID``). Whether an ID exists only its owner knows.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from asyncgraph.arrays import IdArray

__all__ = ["added_edges_to_homo", "added_nodes_to_homo", "added_nodes_to_per_type", "node_type_counts"]


class RangePartitionBook(Protocol):
    """What these functions read of ``partition.book.RangePartitionBook``."""

    @property
    def ntypes(self) -> list[str]: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def num_edges(self) -> int: ...
    def num_partitions(self) -> int: ...
    def num_nodes_of(self, ntype: Any) -> int: ...
    def num_edges_of(self, etype: Any) -> int: ...
    def map_to_homo_eid(self, ids: Any, etype: Any) -> IdArray: ...


def node_type_counts(book: RangePartitionBook) -> IdArray:
    """The base node count of each node type, ``N_t``."""
    return np.asarray([book.num_nodes_of(t) for t in book.ntypes], dtype=np.int64)


def added_nodes_to_homo(book: RangePartitionBook, per_type: IdArray, t: int) -> IdArray:
    """Global IDs of added nodes of type ``t`` by their per-type IDs (all ``>= N_t``)."""
    parts, types = book.num_partitions(), len(book.ntypes)
    rel = per_type - int(node_type_counts(book)[t])
    out: IdArray = book.num_nodes + rel % parts + ((rel // parts) * types + t) * parts
    return out


def added_nodes_to_per_type(book: RangePartitionBook, ids: IdArray) -> tuple[IdArray, IdArray]:
    """``(type, per-type ID)`` of added nodes' global IDs (all ``>= N``)."""
    parts, types = book.num_partitions(), len(book.ntypes)
    rel = ids - book.num_nodes
    slot = rel // parts
    t = slot % types
    per: IdArray = node_type_counts(book)[t] + rel % parts + (slot // types) * parts
    return t.astype(np.int64), per


def added_edges_to_homo(book: RangePartitionBook, per_type: IdArray, etype: Any) -> IdArray:
    """Global IDs of per-type edge IDs of ``etype``: the book's below ``E_r``, ``E + (ID - E_r)``
    above it (appended edges; their owners say whether they exist and are of ``etype``)."""
    top = book.num_edges_of(etype)
    above = per_type >= top
    out = np.empty(per_type.size, np.int64)
    out[~above] = book.map_to_homo_eid(per_type[~above], etype)
    out[above] = book.num_edges + per_type[above] - top
    return out
