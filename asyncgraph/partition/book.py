"""Range partition book: which partition owns a node or edge ID.

After ``partition_graph`` relabels IDs, partition ``p`` owns the contiguous node IDs
``[node_bounds[p], node_bounds[p+1])`` and likewise for edges, so mapping any ID to its owner is
a ``searchsorted`` over a table of ``num_parts + 1`` numbers. Method names follow DGL's
``RangePartitionBook`` so ported code reads the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgraph.arrays import IdArray, as_id_array
from asyncgraph.errors import OutOfRangeError

__all__ = ["IdArray", "RangePartitionBook", "as_id_array"]


class RangePartitionBook:
    """Maps global node/edge IDs to (partition, local ID) and back; vectorised."""

    def __init__(self, node_bounds: Any, edge_bounds: Any) -> None:
        nb = np.asarray(node_bounds, dtype=np.int64)
        eb = np.asarray(edge_bounds, dtype=np.int64)
        if nb.ndim != 1 or eb.ndim != 1 or nb.size < 2 or nb.size != eb.size:
            raise ValueError("node_bounds and edge_bounds must be 1-D with num_parts + 1 entries each")
        if nb[0] != 0 or eb[0] != 0 or np.any(np.diff(nb) < 0) or np.any(np.diff(eb) < 0):
            raise ValueError("partition bounds must start at 0 and be non-decreasing")
        self._node_bounds = nb
        self._edge_bounds = eb

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
    def nid2partid(self, ids: Any) -> IdArray:
        return self._owner(as_id_array(ids), self._node_bounds, "node")

    def eid2partid(self, ids: Any) -> IdArray:
        return self._owner(as_id_array(ids), self._edge_bounds, "edge")

    def owner(self, ids: Any, policy: str) -> IdArray:
        """Owner partition of each ID under a policy (``"node"`` or ``"edge"``)."""
        return self._owner(as_id_array(ids), self.bounds(policy), policy)

    # --- global <-> local -----------------------------------------------------------------
    def nid2localnid(self, ids: Any, partid: int) -> IdArray:
        return self._to_local(as_id_array(ids), partid, self._node_bounds, "node")

    def eid2localeid(self, ids: Any, partid: int) -> IdArray:
        return self._to_local(as_id_array(ids), partid, self._edge_bounds, "edge")

    def partid2nids(self, partid: int) -> IdArray:
        start, end = self.node_range(partid)
        return np.arange(start, end, dtype=np.int64)

    def partid2eids(self, partid: int) -> IdArray:
        start, end = self.edge_range(partid)
        return np.arange(start, end, dtype=np.int64)

    # --- wire form ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, list[int]]:
        return {"node_bounds": self._node_bounds.tolist(), "edge_bounds": self._edge_bounds.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RangePartitionBook:
        return cls(data["node_bounds"], data["edge_bounds"])

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RangePartitionBook)
            and np.array_equal(self._node_bounds, other._node_bounds)
            and np.array_equal(self._edge_bounds, other._edge_bounds)
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
