"""A server's apply functions for a live graph's structure writes (issue 35).

``RequestHandlers`` hands them to its ``WritePath``: each update is deduplicated by request
id, applied to the partition's overlay, logged and acknowledged like every write, and replayed
through the same functions after a restart (so new edges get the same IDs again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.protocol.ops import AddEdgesArgs, AddNodesArgs, Op, RemoveEdgesArgs
from asyncgraph.server.writes import Apply
from asyncgraph.service.local import PartitionService

if TYPE_CHECKING:
    from asyncgraph.server.metrics import ServerMetrics

__all__ = ["live_applies"]


def live_applies(partition: PartitionService, metrics: ServerMetrics | None = None) -> dict[Op, Apply]:
    """``{op: apply}`` for ``add_edges``, ``remove_edges`` and ``add_nodes`` on ``partition``."""

    def add_edges(a: AddEdgesArgs, retried: bool) -> np.ndarray:
        if retried:  # the first one was applied: answer the IDs it allocated
            assert a.rid is not None
            ids = partition.live.answered(a.rid)
            if ids is None:
                raise InvalidRequestError(f"add_edges {a.rid!r} was applied long ago; its answer is gone")
            return ids
        return partition.add_edges(a.src, a.dst, a.rid, a.data)

    def remove_edges(a: RemoveEdgesArgs, retried: bool) -> None:
        partition.remove_edges(a.eids)

    def add_nodes(a: AddNodesArgs, retried: bool) -> np.ndarray:
        if retried:
            assert a.rid is not None
            ids = partition.live.answered_nodes(a.rid)
            if ids is None:
                raise InvalidRequestError(f"add_nodes {a.rid!r} was applied long ago; its answer is gone")
            return ids
        return partition.add_nodes(a.num, a.rid, a.data)

    return {Op.ADD_EDGES: add_edges, Op.REMOVE_EDGES: remove_edges, Op.ADD_NODES: add_nodes}
