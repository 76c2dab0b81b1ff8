"""A server's apply functions for a live graph's structure writes (issue 35).

``RequestHandlers`` hands them to its ``WritePath``: each update is deduplicated by request
id, applied to the partition's overlay, logged and acknowledged like every write, and replayed
through the same functions after a restart (so new edges get the same IDs again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.protocol.ops import AddEdgesArgs, AddNodesArgs, CompactArgs, Op, RemoveEdgesArgs
from asyncgraph.server.writes import Apply
from asyncgraph.service.local import PartitionService

if TYPE_CHECKING:
    from asyncgraph.server.compactor import Compactor
    from asyncgraph.server.metrics import ServerMetrics

__all__ = ["live_applies"]


def live_applies(
    partition: PartitionService, metrics: ServerMetrics | None = None, compactor: Compactor | None = None
) -> dict[Op, Apply]:
    """``{op: apply}`` for ``add_edges``, ``remove_edges``, ``add_nodes`` and ``compact`` (its
    replay: a served one runs through ``compactor``, which may also start one after an update)."""

    def updated() -> None:
        if compactor is not None:
            compactor.maybe_start()

    def add_edges(a: AddEdgesArgs, retried: bool) -> np.ndarray:
        if retried:  # the first one was applied: answer the IDs it allocated
            assert a.rid is not None
            ids = partition.live.answered(a.rid)
            if ids is None:
                raise InvalidRequestError(f"add_edges {a.rid!r} was applied long ago; its answer is gone")
            return ids
        ids = partition.add_edges(a.src, a.dst, a.rid, a.data)
        updated()
        return ids

    def remove_edges(a: RemoveEdgesArgs, retried: bool) -> None:
        partition.remove_edges(a.eids)
        updated()

    def compact(a: CompactArgs, retried: bool) -> None:
        if partition.live.overlay is not None and not retried:
            partition.compact()

    def add_nodes(a: AddNodesArgs, retried: bool) -> np.ndarray:
        if retried:
            assert a.rid is not None
            ids = partition.live.answered_nodes(a.rid)
            if ids is None:
                raise InvalidRequestError(f"add_nodes {a.rid!r} was applied long ago; its answer is gone")
            return ids
        return partition.add_nodes(a.num, a.rid, a.data)

    return {
        Op.ADD_EDGES: add_edges,
        Op.REMOVE_EDGES: remove_edges,
        Op.ADD_NODES: add_nodes,
        Op.COMPACT: compact,
    }
