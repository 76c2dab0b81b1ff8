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
from asyncgraph.names import ETYPE, NTYPE, tensor_key, typed_name
from asyncgraph.partition.typed import edge_type_key
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
        self, op: str, policy: str, count: int, data: Mapping[str, Any] | None, type_key: str | None = None
    ) -> dict[str, np.ndarray]:
        """``data`` checked against the tensors before anything is sent: names (a stored name,
        or a user-facing one of ``policy``: ``"feat"`` is ``"node:feat"``, or the per-type
        tensor ``"node:paper/feat"`` of ``type_key`` ``"paper"`` where there is one), dtypes,
        shapes."""
        out: dict[str, np.ndarray] = {}
        for name, values in (data or {}).items():
            key = name if name in self.state.metas or ":" in name else tensor_key(policy, name)
            typed = tensor_key(policy, typed_name(type_key, name)) if type_key else None
            if typed is not None and key not in self.state.metas and typed in self.state.metas:
                key = typed
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

    async def add_edges(
        self, src: Any, dst: Any, data: Mapping[str, Any] | None = None, etype: Any = None
    ) -> np.ndarray:
        """Add the edges ``src[i] -> dst[i]`` (global node IDs) with rows ``data`` of edge
        tensors (``{name: rows}``, a row per edge; tensors not named: zeros); their new global
        edge IDs, in the caller's order. Stored by each destination's owner; one request per
        owner, each applying its edges and their rows at once.

        A heterogeneous graph: with ``etype`` (a relation or canonical triple) ``src``/``dst``
        are per-type IDs of its source and destination types and the answer per-type edge IDs;
        without it, global IDs with each edge's relation in ``data["_ETYPE"]`` (checked against
        the nodes' types by the owner: ``NodeTypeMismatchError``)."""
        s, d = as_id_array(src, "src"), as_id_array(dst, "dst")
        if s.shape != d.shape:
            raise ShapeMismatchError(f"add_edges: {s.size} sources and {d.size} destinations")
        book = self.state.book
        typed = etype is not None and book.is_hetero
        if typed:
            r = book.etype_id(etype)  # UnknownTypeError
            canon = book.canonical_etypes[r]
            s, d = book.map_to_homo_nid(s, canon[0]), book.map_to_homo_nid(d, canon[2])
            meta = await self.catalog.tensor_meta(tensor_key("edge", ETYPE))
            data = {**(data or {}), meta.name: np.full(s.size, r, meta.dtype)}
            type_key = edge_type_key(canon)
        elif etype is not None:
            book.etype_id(etype)
        rows = await self._rows("add_edges", "edge", int(s.size), data, type_key if typed else None)
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
        ids = gather_rows(results, s.size, (), np.int64)
        if typed:  # per-type IDs of the new edges: E_r + (ID - E)
            return ids - book.num_edges + book.num_edges_of(etype)
        return ids

    async def add_nodes(
        self, num: int, part: int | None = None, data: Mapping[str, Any] | None = None, ntype: Any = None
    ) -> np.ndarray:
        """Add ``num`` nodes owned by partition ``part`` with rows ``data`` of node tensors
        (``{name: rows}``; tensors not named: zeros): their new global IDs
        (``num_nodes + part + k * num_parts``). ``part=None`` picks the partition with the fewest
        nodes, counting the base and what this client added. A heterogeneous graph needs
        ``ntype`` and answers per-type IDs (``partition/added_ids.py``)."""
        if isinstance(num, bool) or not isinstance(num, int | np.integer) or num < 0:
            raise InvalidRequestError(f"add_nodes: num must be a non-negative int, got {num!r}")
        book = self.state.book
        typed = book.is_hetero and len(book.ntypes) > 1
        if typed and ntype is None:
            raise InvalidRequestError(f"add_nodes on a heterogeneous graph needs ntype; types: {book.ntypes}")
        if ntype is not None:
            t = book.ntype_id(ntype)  # UnknownTypeError
            if book.is_hetero:
                meta = await self.catalog.tensor_meta(tensor_key("node", NTYPE))
                data = {**(data or {}), meta.name: np.full(int(num), t, meta.dtype)}
        rows = await self._rows(
            "add_nodes", "node", int(num), data, book.ntypes[t] if book.is_hetero and ntype else None
        )
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
        return book.map_to_per_ntype(ids)[1] if book.is_hetero and ntype is not None else ids

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
