"""The client's writes of a live graph's structure (issue 35): ``add_edges``, ``remove_edges``.

A call is checked in full first (lengths, integer IDs, nodes that exist, and for a removal that
every edge is live, read with ``find_edges``), then split by owner: an edge belongs to its
destination's owner, one request per owner, run concurrently. Each owner applies its share
atomically and in order; a call spanning owners is atomic per owner only (see the README).
New edge IDs are ``E_base + p + k * P`` (``storage/overlay.py``), so ``edge_positions`` routes
an ID (``edge_routing``). A part of ``AsyncClient``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array, check_rows
from asyncgraph.errors import InvalidRequestError, OutOfRangeError, ShapeMismatchError
from asyncgraph.names import tensor_key
from asyncgraph.protocol.ops import Op

from .catalog import TensorCatalog
from .edge_routing import edge_positions, node_positions
from .scatter import gather_rows, scatter, take
from .state import ClientState
from .structure import StructureQueries

__all__ = ["LiveUpdates"]


class LiveUpdates:
    """``add_edges`` / ``remove_edges`` over every partition (a part of ``AsyncClient``)."""

    def __init__(self, state: ClientState, structure: StructureQueries, catalog: TensorCatalog) -> None:
        self.state = state
        self.structure = structure
        self.catalog = catalog
        self._added = [0] * state.book.num_partitions()  # nodes this client added, per partition

    async def _rows(
        self, op: str, policy: str, count: int, data: Mapping[str, Any] | None
    ) -> dict[str, np.ndarray]:
        """``data`` checked against the tensors before anything is sent: names (a stored name,
        or a user-facing one of ``policy``: ``"feat"`` is ``"node:feat"``), dtypes, shapes."""
        out: dict[str, np.ndarray] = {}
        for name, values in (data or {}).items():
            key = name if name in self.state.metas or ":" in name else tensor_key(policy, name)
            meta = await self.catalog.tensor_meta(key)  # UnknownTensorError
            if meta.policy != policy:
                raise InvalidRequestError(
                    f"{op}: data {name!r} is a {meta.policy} tensor, not a {policy} tensor"
                )
            ids = np.zeros(count, np.int64)
            _, rows = check_rows(
                f"{op}: data {name!r}", ids, values, dtype=meta.dtype, row_shape=meta.row_shape
            )
            out[key] = np.ascontiguousarray(rows)
        return out

    async def add_edges(self, src: Any, dst: Any, data: Mapping[str, Any] | None = None) -> np.ndarray:
        """Add the edges ``src[i] -> dst[i]`` (global node IDs) with rows ``data`` of edge
        tensors (``{name: rows}``, a row per edge; tensors not named: zeros); their new global
        edge IDs, in the caller's order. Stored by each destination's owner; one request per
        owner, each applying its edges and their rows at once."""
        s, d = as_id_array(src, "src"), as_id_array(dst, "dst")
        if s.shape != d.shape:
            raise ShapeMismatchError(f"add_edges: {s.size} sources and {d.size} destinations")
        rows = await self._rows("add_edges", "edge", int(s.size), data)
        if s.size and int(s.min()) < 0:
            raise OutOfRangeError(f"add_edges: source {int(s.min())} is not a node")
        added = np.unique(s[s >= self.state.book.num_nodes])
        if added.size:  # added nodes: their owners say whether they exist (OutOfRangeError)
            await self.structure.degrees(added, "in")
        parts = node_positions(self.state.book, d)  # each destination's owner checks it
        results = await scatter(
            self.state.partitions,
            parts,
            Op.ADD_EDGES,
            lambda p, pos: p.add_edges(
                take(s, pos), take(d, pos), {k: take(v, pos) for k, v in rows.items()}
            ),
        )
        return gather_rows(results, s.size, (), np.int64)

    async def add_nodes(
        self, num: int, part: int | None = None, data: Mapping[str, Any] | None = None
    ) -> np.ndarray:
        """Add ``num`` nodes owned by partition ``part`` with rows ``data`` of node tensors
        (``{name: rows}``; tensors not named: zeros): their new global IDs
        (``num_nodes + part + k * num_parts``). ``part=None`` picks the partition with the fewest
        nodes, counting the base and what this client added."""
        if isinstance(num, bool) or not isinstance(num, int | np.integer) or num < 0:
            raise InvalidRequestError(f"add_nodes: num must be a non-negative int, got {num!r}")
        rows = await self._rows("add_nodes", "node", int(num), data)
        book = self.state.book
        parts = book.num_partitions()
        if part is None:
            sizes = [
                hi - lo + self._added[p] for p, (lo, hi) in enumerate(map(book.node_range, range(parts)))
            ]
            part = int(np.argmin(sizes))
        if isinstance(part, bool) or not isinstance(part, int | np.integer) or not 0 <= part < parts:
            raise OutOfRangeError(f"add_nodes: part must be a partition ID in [0, {parts}), got {part!r}")
        ids = await self.state.partitions[int(part)].add_nodes(int(num), rows)
        self._added[int(part)] += int(num)
        return ids

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
