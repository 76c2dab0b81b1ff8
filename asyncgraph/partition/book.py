"""Range partition book: which partition owns a node or edge ID.

After ``partition_graph`` relabels IDs, partition ``p`` owns the contiguous node IDs
``[node_bounds[p], node_bounds[p+1])`` and likewise for edges, so mapping any ID to its owner is
a ``searchsorted`` over a table of ``num_parts + 1`` numbers. Method names follow DGL's
``RangePartitionBook`` so ported code reads the same.
"""

from __future__ import annotations

import bisect
from typing import Any, Protocol

import numpy as np

from asyncgraph.arrays import IdArray, as_id_array
from asyncgraph.errors import InvalidRequestError, OutOfRangeError, UnknownTypeError
from asyncgraph.names import DEFAULT_ETYPE, DEFAULT_NTYPE, ETYPE, NTYPE, TYPE_EID, TYPE_ORDER
from asyncgraph.partition.added_ids import added_nodes_to_homo, added_nodes_to_per_type

__all__ = ["EdgeIdMap", "IdArray", "RangePartitionBook", "as_id_array", "split_by_owner"]

_NO_POSITIONS: IdArray = np.empty(0, dtype=np.int64)
_NO_POSITIONS.flags.writeable = False
_FEW_PARTS = 8  # split_by_owner: up to this many partitions, one pass per partition


def split_by_owner(owner: IdArray, num_parts: int) -> list[IdArray]:
    """Positions of each partition's IDs, in input order within a partition (vectorised).

    Few partitions (the usual case) take one ``flatnonzero`` pass each, several times faster
    than a stable argsort; many partitions take the argsort.
    """
    if owner.size and int(owner.min()) == int(owner.max()):
        positions = [_NO_POSITIONS] * num_parts
        positions[int(owner[0])] = np.arange(owner.size, dtype=np.int64)
        return positions
    if num_parts <= _FEW_PARTS:
        return [np.flatnonzero(owner == p) for p in range(num_parts)]
    order = np.argsort(owner, kind="stable")
    bounds = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=num_parts), out=bounds[1:])
    return [order[bounds[p] : bounds[p + 1]] for p in range(num_parts)]


class EdgeIdMap(Protocol):
    """Reads what per-edge arrays say about typed edge IDs (they live with the edges, on the
    owners, never in the book): ``DistGraph`` attaches one to its book."""

    def homo_eids(self, positions: IdArray) -> IdArray:
        """Homogeneous edge IDs at ``positions`` of the per-partition type order (``_TYPE_ORDER``)."""
        ...

    def per_etype(self, eids: IdArray) -> tuple[IdArray, IdArray]:
        """``(edge type index, per-type ID)`` of homogeneous edge IDs ``eids``."""
        ...


class RangePartitionBook:
    """Maps global node/edge IDs to (partition, local ID) and back; vectorised."""

    def __init__(
        self,
        node_bounds: Any,
        edge_bounds: Any,
        *,
        ntypes: list[str] | None = None,
        canonical_etypes: list[tuple[str, str, str]] | None = None,
        ntype_counts: Any = None,
        etype_counts: Any = None,
        ntype_feats: dict[str, list[str]] | None = None,
        etype_feats: dict[str, list[str]] | None = None,
    ) -> None:
        nb = np.asarray(node_bounds, dtype=np.int64)
        eb = np.asarray(edge_bounds, dtype=np.int64)
        if nb.ndim != 1 or eb.ndim != 1 or nb.size < 2 or nb.size != eb.size:
            raise ValueError("node_bounds and edge_bounds must be 1-D with num_parts + 1 entries each")
        if nb[0] != 0 or eb[0] != 0 or np.any(np.diff(nb) < 0) or np.any(np.diff(eb) < 0):
            raise ValueError("partition bounds must start at 0 and be non-decreasing")
        self._node_bounds = nb
        self._edge_bounds = eb
        self._bound_lists = {"node": nb.tolist(), "edge": eb.tolist()}  # for scalar lookups
        p = nb.size - 1
        self._hetero = ntypes is not None
        self._ntypes = list(ntypes) if ntypes is not None else [DEFAULT_NTYPE]
        self._canon = [tuple(c) for c in canonical_etypes] if canonical_etypes else [DEFAULT_ETYPE]
        nc = np.diff(nb)[:, None] if ntype_counts is None else np.asarray(ntype_counts, dtype=np.int64)
        ec = np.diff(eb)[:, None] if etype_counts is None else np.asarray(etype_counts, dtype=np.int64)
        if nc.shape != (p, len(self._ntypes)) or not np.array_equal(nc.sum(axis=1), np.diff(nb)):
            raise ValueError("ntype_counts must be [num_parts, num_ntypes] and add up to each part's nodes")
        if ec.shape != (p, len(self._canon)) or not np.array_equal(ec.sum(axis=1), np.diff(eb)):
            raise ValueError("etype_counts must be [num_parts, num_etypes] and add up to each part's edges")
        self._ntype_counts, self._etype_counts = nc, ec
        self._partid = 0
        # heterogeneous graphs: which partitioned node tensors each type has (None: unknown)
        self.ntype_feats = (
            {str(k): [str(n) for n in v] for k, v in ntype_feats.items()} if ntype_feats else None
        )
        # heterogeneous graphs: which partitioned edge tensors each type ("src:rel:dst") has
        self.etype_feats = (
            {str(k): [str(n) for n in v] for k, v in etype_feats.items()} if etype_feats else None
        )
        #: True for a client's book: IDs above the base counts are a live graph's added nodes and
        #: edges, mapped by ``added_ids`` (their owners say whether they exist).
        self.grows = False
        #: Set by ``DistGraph``: reads per-type edge IDs where the edges live (``map_to_homo_eid``).
        self.edge_id_map: EdgeIdMap | None = None
        # Per-type edge IDs are range-partitioned too: type t's IDs in part p are
        # [etb[p, t], etb[p + 1, t]); inside part p its edges come after those of earlier types
        # in the type order (``_TYPE_ORDER``), from ``_etype_offsets[p, t]`` on.
        self._etype_bounds = np.vstack([np.zeros((1, ec.shape[1]), np.int64), np.cumsum(ec, axis=0)])
        self._etype_offsets = eb[:-1, None] + np.cumsum(ec, axis=1) - ec
        # Homogeneous start of (part p, type t) at [p * T + t]; nodes of a type are contiguous in a part.
        self._type_starts = (nb[:-1, None] + np.cumsum(nc, axis=1) - nc).ravel()
        # Per-type ID bounds over partitions: type t's IDs in part p are [tb[p, t], tb[p + 1, t]).
        self._type_bounds = np.vstack([np.zeros((1, nc.shape[1]), np.int64), np.cumsum(nc, axis=0)])

    # --- sizes -----------------------------------------------------------------------------
    def num_partitions(self) -> int:
        return int(self._node_bounds.size - 1)

    @property
    def num_nodes(self) -> int:
        return int(self._node_bounds[-1])

    @property
    def num_edges(self) -> int:
        return int(self._edge_bounds[-1])

    @property
    def node_bounds(self) -> IdArray:
        return self._node_bounds.copy()

    @property
    def edge_bounds(self) -> IdArray:
        return self._edge_bounds.copy()

    def node_range(self, partid: int) -> tuple[int, int]:
        self._check_part(partid)
        return int(self._node_bounds[partid]), int(self._node_bounds[partid + 1])

    def edge_range(self, partid: int) -> tuple[int, int]:
        self._check_part(partid)
        return int(self._edge_bounds[partid]), int(self._edge_bounds[partid + 1])

    def bounds(self, policy: str) -> IdArray:
        """Bounds for a partition policy: ``"node"`` or ``"edge"``."""
        if policy == "node":
            return self._node_bounds
        if policy == "edge":
            return self._edge_bounds
        raise ValueError(f"unknown partition policy {policy!r}; expected 'node' or 'edge'")

    # --- global -> owner ---------------------------------------------------------------------
    def nid2partid(self, ids: Any, ntype: Any = None) -> IdArray:
        """Owner of node ``ids`` (with ``ntype``: of that type's per-type IDs, as DGL's)."""
        if ntype is None or not self._hetero:
            return self._owner(as_id_array(ids), self._node_bounds, "node")
        t = self.ntype_id(ntype)
        return self._owner(as_id_array(ids), self._type_bounds[:, t], f"{self._ntypes[t]} node")

    def eid2partid(self, ids: Any, etype: Any = None) -> IdArray:
        """Owner of edge ``ids`` (with ``etype``: of that type's per-type IDs, as DGL's)."""
        if etype is None or not self._hetero:
            return self._owner(as_id_array(ids), self._edge_bounds, "edge")
        t = self.etype_id(etype)
        return self._owner(as_id_array(ids), self._etype_bounds[:, t], f"{self._canon[t]} edge")

    def owner(self, ids: Any, policy: str) -> IdArray:
        """Owner partition of each ID under a policy (``"node"`` or ``"edge"``)."""
        return self._owner(as_id_array(ids), self.bounds(policy), policy)

    def positions(self, ids: IdArray, policy: str) -> list[IdArray]:
        """Positions of each partition's IDs in ``ids`` (1-D int64), input order kept.

        Raises ``OutOfRangeError`` like ``owner``. When one partition owns every ID (a single
        ID, a batch of one partition's nodes) two reductions decide it and no per-ID owner
        array is built: this is the fixed cost of every small request.
        """
        bounds = self.bounds(policy)
        parts = bounds.size - 1
        if not ids.size:
            return [_NO_POSITIONS] * parts
        if ids.size <= 8:  # a few IDs: Python ints beat two ufunc reductions
            few = ids.tolist()
            lo, hi = min(few), max(few)
        else:
            lo, hi = int(ids.min()), int(ids.max())
        edges = self._bound_lists[policy]
        if lo < 0 or hi >= edges[-1]:
            bad = lo if lo < 0 else hi
            raise OutOfRangeError(f"{policy} ID {bad} out of range [0, {edges[-1]})")
        first = bisect.bisect_right(edges, lo) - 1
        last = bisect.bisect_right(edges, hi) - 1
        out = [_NO_POSITIONS] * parts
        if first == last:
            out[first] = np.arange(ids.size, dtype=np.int64)
            return out
        if last == first + 1:  # two neighbouring owners (every split request of a 2-partition graph)
            upper = ids >= edges[last]
            out[first] = np.flatnonzero(~upper)
            out[last] = np.flatnonzero(upper)
            return out
        return split_by_owner(np.searchsorted(bounds, ids, side="right").astype(np.int64) - 1, parts)

    # --- global <-> local -----------------------------------------------------------------
    def nid2localnid(self, ids: Any, partid: int) -> IdArray:
        return self._to_local(as_id_array(ids), partid, self._node_bounds, "node")

    def eid2localeid(self, ids: Any, partid: int) -> IdArray:
        return self._to_local(as_id_array(ids), partid, self._edge_bounds, "edge")

    @property
    def partid(self) -> int:
        """The partition of this process's machine (DGL's ``pb.partid``): set by
        ``DistGraph.get_partition_book()`` from the partition it reads locally (else its rank's
        share of the partitions); 0 for a book nobody placed."""
        return self._partid

    @partid.setter
    def partid(self, value: int) -> None:
        self._check_part(value)
        self._partid = int(value)

    def partid2nids(self, partid: int, ntype: Any = None) -> Any:
        """Node IDs partition ``partid`` owns as an int64 tensor, as DGL returns them;
        with ``ntype``, that type's per-type IDs."""
        import torch

        if ntype is None:
            start, end = self.node_range(partid)
        else:
            self._check_part(partid)
            tb = self._type_bounds[:, self.ntype_id(ntype)]
            start, end = int(tb[partid]), int(tb[partid + 1])
        return torch.arange(start, end, dtype=torch.int64)

    def partid2eids(self, partid: int, etype: Any = None) -> Any:
        """Edge IDs partition ``partid`` owns as an int64 tensor (homogeneous edge IDs); with
        ``etype``, that type's per-type IDs (a range: per-type IDs are range-partitioned)."""
        import torch

        if etype is None:
            start, end = self.edge_range(partid)
        else:
            self._check_part(partid)
            tb = self._etype_bounds[:, self.etype_id(etype)]
            start, end = int(tb[partid]), int(tb[partid + 1])
        return torch.arange(start, end, dtype=torch.int64)

    # --- node and edge types (DGL's hetero partition book) ------------------------------------------
    @property
    def is_hetero(self) -> bool:
        return self._hetero

    @property
    def ntypes(self) -> list[str]:
        return list(self._ntypes)

    @property
    def etypes(self) -> list[str]:
        return [c[1] for c in self._canon]

    @property
    def canonical_etypes(self) -> list[tuple[str, str, str]]:
        return [tuple(c) for c in self._canon]  # type: ignore[misc]

    def ntype_id(self, ntype: Any) -> int:
        """Index of ``ntype`` in ``ntypes`` (``UnknownTypeError`` otherwise)."""
        if ntype is None and len(self._ntypes) == 1:
            return 0
        try:
            return self._ntypes.index(ntype)
        except ValueError:
            raise UnknownTypeError(f"unknown node type {ntype!r}; known: {self._ntypes}") from None

    def etype_id(self, etype: Any) -> int:
        """Index of a relation name or canonical triple in ``canonical_etypes``."""
        from asyncgraph.partition.hetero_graph import resolve_etype

        if etype is None and len(self._canon) == 1:
            return 0
        return self._canon.index(resolve_etype(etype, self.canonical_etypes))

    def num_nodes_of(self, ntype: Any) -> int:
        return int(self._ntype_counts[:, self.ntype_id(ntype)].sum())

    def num_edges_of(self, etype: Any) -> int:
        return int(self._etype_counts[:, self.etype_id(etype)].sum())

    def ntype_bounds(self, ntype: Any) -> IdArray:
        """Per-type ID bounds: partition ``p`` owns type IDs ``[b[p], b[p+1])`` of ``ntype``."""
        return self._type_bounds[:, self.ntype_id(ntype)].copy()

    def map_to_homo_nid(self, ids: Any, ntype: Any) -> IdArray:
        """Homogeneous node IDs of per-type ``ids`` of ``ntype`` (vectorised)."""
        t = self.ntype_id(ntype)
        tid = as_id_array(ids)
        tb = self._type_bounds[:, t]
        if self.grows and tid.size and int(tid.max()) >= tb[-1]:
            above = tid >= tb[-1]
            mixed = np.empty(tid.size, np.int64)
            mixed[~above] = self.map_to_homo_nid(tid[~above], ntype)
            mixed[above] = added_nodes_to_homo(self, tid[above], t)
            return mixed
        part = self._owner(tid, tb, f"{self._ntypes[t]} node")
        starts = self._type_starts[part * len(self._ntypes) + t]
        out: IdArray = tid - tb[part] + starts
        return out

    def map_to_per_ntype(self, ids: Any) -> tuple[IdArray, IdArray]:
        """``(ntype index, per-type ID)`` of homogeneous node ``ids``."""
        hid = as_id_array(ids)
        if self.grows and hid.size and int(hid.max()) >= self.num_nodes:
            above = hid >= self.num_nodes
            types, per = np.empty(hid.size, np.int64), np.empty(hid.size, np.int64)
            types[~above], per[~above] = self.map_to_per_ntype(hid[~above])
            types[above], per[above] = added_nodes_to_per_type(self, hid[above])
            return types, per
        self._owner(hid, self._node_bounds, "node")
        nt = len(self._ntypes)
        flat = np.searchsorted(self._type_starts, hid, side="right").astype(np.int64) - 1
        part, t = np.divmod(flat, nt)
        return t, hid - self._type_starts[flat] + self._type_bounds[part, t]

    def etype_bounds(self, etype: Any) -> IdArray:
        """Per-type edge ID bounds: partition ``p`` owns type IDs ``[b[p], b[p+1])`` of ``etype``."""
        return self._etype_bounds[:, self.etype_id(etype)].copy()

    def type_order_positions(self, ids: Any, etype: Any) -> IdArray:
        """Where per-type edge ``ids`` of ``etype`` sit in the type order (``_TYPE_ORDER``, an
        edge tensor each partition derives from its ``_ETYPE``): a pure range computation."""
        t = self.etype_id(etype)
        tid = as_id_array(ids)
        tb = self._etype_bounds[:, t]
        part = self._owner(tid, tb, f"{self._canon[t]} edge")
        out: IdArray = tid - tb[part] + self._etype_offsets[part, t]
        return out

    def map_to_homo_eid(self, ids: Any, etype: Any) -> IdArray:
        """Homogeneous edge IDs of per-type ``ids`` of ``etype`` (vectorised): a range
        computation here, then one read of ``_TYPE_ORDER`` from the owners (a book that
        ``DistGraph`` handed out; a homogeneous book returns ``ids``)."""
        if not self._hetero:
            self.etype_id(etype)
            eids = as_id_array(ids)
            self._owner(eids, self._edge_bounds, "edge")
            return eids.copy()
        positions = self.type_order_positions(ids, etype)
        return self._edge_ids().homo_eids(positions)

    def map_to_per_etype(self, ids: Any) -> tuple[IdArray, IdArray]:
        """``(edge type index, per-type ID)`` of homogeneous edge ``ids`` (read from the owners'
        ``_ETYPE`` / ``_TYPE_EID`` for a heterogeneous graph)."""
        eids = as_id_array(ids)
        if not (self.grows and eids.size and int(eids.min()) >= 0):  # added: their owners' rows
            self._owner(eids, self._edge_bounds, "edge")
        if not self._hetero:
            return np.zeros(eids.size, dtype=np.int64), eids.copy()
        return self._edge_ids().per_etype(eids)

    def _edge_ids(self) -> EdgeIdMap:
        if self.edge_id_map is None:
            raise InvalidRequestError(
                "per-type edge IDs are read where the edges live: use the book of a DistGraph "
                "(g.get_partition_book()), not one loaded from the partition files alone"
            )
        return self.edge_id_map

    def etype_has(self, etype: Any, name: str) -> bool:
        """Whether edge type ``etype`` has edge tensor ``name``: a partitioned tensor only if
        that type was given it; a tensor made at run time (in no type's list) every type has."""
        if name in (ETYPE, TYPE_EID, TYPE_ORDER):
            return False
        if self.etype_feats is None:
            return True
        key = ":".join(self._canon[self.etype_id(etype)])
        listed = self.etype_feats.get(key, [])
        return name in listed or not any(name in v for v in self.etype_feats.values())

    def ntype_has(self, ntype: str, name: str) -> bool:
        """Whether node type ``ntype`` has node tensor ``name``: a partitioned tensor only if
        that type was given it; a tensor made at run time (in no type's list) every type has."""
        if name == NTYPE:  # the partitioner's own type column: no type's data
            return False
        if self.ntype_feats is None:
            return True
        listed = self.ntype_feats.get(ntype, [])
        return name in listed or not any(name in v for v in self.ntype_feats.values())

    # --- wire form ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node_bounds": self._node_bounds.tolist(),
            "edge_bounds": self._edge_bounds.tolist(),
        }
        if self._hetero:
            out["ntypes"] = list(self._ntypes)
            out["canonical_etypes"] = [list(c) for c in self._canon]
            out["ntype_counts"] = self._ntype_counts.tolist()
            out["etype_counts"] = self._etype_counts.tolist()
            if self.ntype_feats is not None:
                out["ntype_feats"] = self.ntype_feats
            if self.etype_feats is not None:
                out["etype_feats"] = self.etype_feats
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RangePartitionBook:
        if "ntypes" not in data:
            return cls(data["node_bounds"], data["edge_bounds"])
        return cls(
            data["node_bounds"],
            data["edge_bounds"],
            ntypes=[str(t) for t in data["ntypes"]],
            canonical_etypes=[(str(c[0]), str(c[1]), str(c[2])) for c in data["canonical_etypes"]],
            ntype_counts=data["ntype_counts"],
            etype_counts=data["etype_counts"],
            ntype_feats=data.get("ntype_feats"),
            etype_feats=data.get("etype_feats"),
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RangePartitionBook)
            and np.array_equal(self._node_bounds, other._node_bounds)
            and np.array_equal(self._edge_bounds, other._edge_bounds)
            and self._ntypes == other._ntypes
            and self._canon == other._canon
            and np.array_equal(self._ntype_counts, other._ntype_counts)
        )

    def __hash__(self) -> int:
        return hash((self._node_bounds.tobytes(), self._edge_bounds.tobytes()))

    def __repr__(self) -> str:
        return (
            f"RangePartitionBook(num_partitions={self.num_partitions()}, "
            f"num_nodes={self.num_nodes}, num_edges={self.num_edges})"
        )

    # --- helpers --------------------------------------------------------------------------
    def _check_part(self, partid: int) -> None:
        if not 0 <= int(partid) < self.num_partitions():
            raise OutOfRangeError(f"partition id {partid} out of range [0, {self.num_partitions()})")

    @staticmethod
    def _owner(ids: IdArray, bounds: IdArray, kind: str) -> IdArray:
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= bounds[-1]:
                bad = lo if lo < 0 else hi
                raise OutOfRangeError(f"{kind} ID {bad} out of range [0, {int(bounds[-1])})")
        return np.searchsorted(bounds, ids, side="right").astype(np.int64) - 1

    def _to_local(self, ids: IdArray, partid: int, bounds: IdArray, kind: str) -> IdArray:
        self._check_part(partid)
        start, end = int(bounds[partid]), int(bounds[partid + 1])
        if ids.size and (int(ids.min()) < start or int(ids.max()) >= end):
            bad = int(ids.min()) if int(ids.min()) < start else int(ids.max())
            raise OutOfRangeError(
                f"{kind} ID {bad} is not owned by partition {partid} (owns [{start}, {end}))"
            )
        return ids - start
