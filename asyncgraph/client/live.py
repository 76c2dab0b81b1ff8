"""The client's writes of a live graph's structure (issue 35): ``add_edges``, ``remove_edges``.

A call is checked in full first (lengths, integer IDs, nodes that exist, and for a removal that
every edge is live, read with ``find_edges``), then split by owner: an edge belongs to its
destination's owner, one request per owner, run concurrently. Each owner applies its share
atomically and in order; a call spanning owners is atomic per owner only (see the README).
New edge IDs are ``E_base + p + k * P`` (``storage/overlay.py``), so ``edge_positions`` routes
an ID (``edge_routing``). A part of ``AsyncClient``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import OutOfRangeError, ShapeMismatchError
from asyncgraph.protocol.ops import Op

from .edge_routing import edge_positions
from .scatter import gather_rows, scatter, take
from .state import ClientState
from .structure import StructureQueries

__all__ = ["LiveUpdates"]


class LiveUpdates:
    """``add_edges`` / ``remove_edges`` over every partition (a part of ``AsyncClient``)."""

    def __init__(self, state: ClientState, structure: StructureQueries) -> None:
        self.state = state
        self.structure = structure

    async def add_edges(self, src: Any, dst: Any) -> np.ndarray:
        """Add the edges ``src[i] -> dst[i]`` (global node IDs); their new global edge IDs, in
        the caller's order. Stored by each destination's owner; one request per owner."""
        s, d = as_id_array(src, "src"), as_id_array(dst, "dst")
        if s.shape != d.shape:
            raise ShapeMismatchError(f"add_edges: {s.size} sources and {d.size} destinations")
        n = self.state.book.num_nodes
        if s.size and (int(s.min()) < 0 or int(s.max()) >= n):
            bad = s[(s < 0) | (s >= n)][0]
            raise OutOfRangeError(f"add_edges: source {int(bad)} is not a node (the graph has {n})")
        parts = self.state.book.positions(d, "node")  # OutOfRangeError for a destination
        results = await scatter(
            self.state.partitions, parts, Op.ADD_EDGES, lambda p, pos: p.add_edges(take(s, pos), take(d, pos))
        )
        return gather_rows(results, s.size, (), np.int64)

    async def remove_edges(self, eids: Any) -> None:
        """Remove the live edges ``eids`` (global IDs; IDs of the others do not change).

        ``UnknownEdgeError`` (nothing removed) when one was never added or is removed already."""
        gids = as_id_array(eids, "eids")
        if not gids.size:
            return
        await self.structure.find_edges(gids)  # every one live, or a typed error: nothing changed
        parts = edge_positions(self.state.book, gids)
        await scatter(
            self.state.partitions, parts, Op.REMOVE_EDGES, lambda p, pos: p.remove_edges(take(gids, pos))
        )
