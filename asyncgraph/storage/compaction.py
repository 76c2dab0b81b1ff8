"""Compaction of a live graph's overlay (issue 35): fold the live edges into a new CSC.

A partition's overlay grows with every update, and every read walks the base CSC (skipping
tombstones) and then the appended edges' index. Compaction folds both into a new CSC of the
live edges only, held by a :class:`CompactedOverlay`: each destination's live base (or
previously folded) edges in their order, then its live appended edges in slot order. Edge IDs
do not change: the CSC carries an ``eids`` column, ``base_pos`` maps a base edge ID to its new
position and ``slot_pos`` a folded appended slot to its (-1: removed before the fold); edges
appended afterwards take the next slots (``slot_base`` on), so strided IDs keep resolving.
Rows of tensors for new IDs (``overlay_data.py``) are indexed by node slot and global edge slot,
so the fold copies each area as it is and they keep answering for the same IDs.

The owner runs it in three steps (``service/live_compact.py``): :func:`capture` copies what
the fold reads (the tombstones and the appended prefix: small) on the thread that applies
updates, :func:`fold` builds the new overlay on a worker thread (new memfds; numpy, no Python
loop per edge) while reads and updates go on, and :func:`adopt`, under the store's write lock,
carries over what changed meanwhile (edges appended, nodes added, edges removed, rows of new IDs
written) before the store's overlay is swapped. The same steps in a row replay a logged compaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncgraph.errors import OutOfRangeError, UnknownEdgeError
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.overlay import _EDGE_BYTES, HEADER, Overlay
from asyncgraph.storage.overlay_layout import first_edge_capacity

__all__ = [
    "FOLDED",
    "CompactedOverlay",
    "FoldInput",
    "adopt",
    "capture",
    "fold",
    "fold_bytes",
    "overlay_view",
]

#: The arrays of a compacted overlay's own CSC, mapped by co-located processes with ``MAPPED``.
FOLDED = ("csc_indptr", "csc_indices", "csc_eids", "base_pos", "slot_pos")


class CompactedOverlay(Overlay):
    """An overlay over a CSC of its own, made by compaction (see the module docstring)."""

    csc_indptr: np.ndarray
    csc_indices: np.ndarray
    csc_eids: np.ndarray
    base_pos: np.ndarray
    slot_pos: np.ndarray

    @classmethod
    def made(
        cls,
        label: str,
        params: Mapping[str, int],
        *,
        shared: bool,
        slot_base: int,
        compactions: int,
        edges: int,
        rows: int,
    ) -> CompactedOverlay:
        """An empty compacted overlay with room for a CSC of ``edges`` edges over ``rows`` nodes."""
        self = cls(label, shared=shared, **{k: int(v) for k, v in params.items() if k in _INIT})
        self.slot_base, self.compactions = int(slot_base), int(compactions)
        self.dead = self._new("dead", max(1, edges), np.uint8)
        sizes = {
            "csc_indptr": (rows + 1, np.int64),
            "csc_indices": (max(1, edges), np.int64),
            "csc_eids": (max(1, edges), np.int64),
            "base_pos": (max(1, self.num_base_edges), np.int64),
            "slot_pos": (max(1, slot_base), np.int64),
        }
        for name, (size, dtype) in sizes.items():
            setattr(self, name, self._new(name, size, dtype))
        return self

    @property
    def folded_edges(self) -> int:
        """Edges in this overlay's CSC (live when folded; some may be removed since)."""
        return int(self.csc_indptr[-1])

    def params(self) -> dict[str, int]:
        return {**super().params(), "slot_base": self.slot_base, "compactions": self.compactions}

    @classmethod
    def view(cls, params: Mapping[str, Any], arrays: Mapping[str, SharedArray]) -> Overlay:
        self = super().view(params, arrays)
        for name in FOLDED:
            setattr(self, name, arrays[name].array)
        return self

    def mapped_names(self) -> tuple[str, ...]:
        return (*super().mapped_names(), *FOLDED)

    def csc(self, indptr: np.ndarray, indices: np.ndarray, eids: np.ndarray) -> tuple[np.ndarray, ...]:
        n = self.folded_edges
        return self.csc_indptr, self.csc_indices[:n], self.csc_eids[:n]

    def positions(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        above = ids >= self.edge_base
        slot = np.where(above, (ids - self.edge_base) // self.num_parts, 0)
        folded = above & (slot < self.slot_base)
        appended = above & ~folded
        pos = np.full(ids.size, -1, np.int64)
        idx = np.full(ids.size, -1, np.int64)
        pos[~above] = self.base_pos[ids[~above] - self.edge_start]
        pos[folded] = self.slot_pos[slot[folded]]
        idx[appended] = slot[appended] - self.slot_base
        return pos, idx

    def locate(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(CSC positions, appended indices)`` of owned live edges ``eids``, sorted unique;
        the errors of ``Overlay.locate``."""
        ids = np.asarray(eids, dtype=np.int64)
        above = ids >= self.edge_base
        base = ids[~above] - self.edge_start
        if base.size and (base.min() < 0 or base.max() >= self.num_base_edges):
            bad = ids[~above][(base < 0) | (base >= self.num_base_edges)][0]
            raise OutOfRangeError(f"edge {int(bad)} is not owned by partition {self.part_id}")
        rel = ids[above] - self.edge_base
        if rel.size and np.any(rel % self.num_parts != self.part_id):
            bad = ids[above][rel % self.num_parts != self.part_id][0]
            raise OutOfRangeError(f"edge {int(bad)} is not owned by partition {self.part_id}")
        total = self.slot_base + self.added
        if rel.size and int((rel // self.num_parts).max()) >= total:
            bad = ids[above][rel // self.num_parts >= total][0]
            raise UnknownEdgeError(f"edge {int(bad)} was never added (partition {self.part_id} has {total})")
        pos, idx = self.positions(ids)
        gone = (pos < 0) & (idx < 0)  # removed before the fold
        gone[pos >= 0] = self.dead[pos[pos >= 0]] != 0
        gone[idx >= 0] = self.add_dead[idx[idx >= 0]] != 0
        if gone.any():
            raise UnknownEdgeError(f"edge {int(ids[gone][0])} was removed")
        return np.unique(pos[pos >= 0]), np.unique(idx[idx >= 0])

    def append(self, src: np.ndarray, dst_local: np.ndarray, rid: str | None = None) -> int:
        """As ``Overlay.append``; the first new edge's global slot (``slot_base`` on)."""
        first = self.slot_base + super().append(src, dst_local)
        if rid is not None:
            self.remember(rid, first, int(src.size))
        return first

    def state(self) -> dict[str, np.ndarray]:
        """A snapshot's arrays: the folded CSC and its maps, the appended edges, the removed
        positions of the CSC (``dead_base``)."""
        out = super().state()
        out["dead_base"] = np.flatnonzero(self.dead[: self.folded_edges]).astype(np.int64)
        n = self.folded_edges
        out.update(
            csc_indptr=self.csc_indptr,
            csc_indices=self.csc_indices[:n],
            csc_eids=self.csc_eids[:n],
            base_pos=self.base_pos[: self.num_base_edges],
            slot_pos=self.slot_pos[: self.slot_base],
            compaction=np.array([self.slot_base, self.compactions], dtype=np.int64),
        )
        return out

    @classmethod
    def from_state(
        cls,
        label: str,
        params: Mapping[str, int],
        shared: bool,
        state: Mapping[str, np.ndarray],
        answers: Any,
    ) -> CompactedOverlay:
        """The compacted overlay a snapshot's ``state`` describes (``state``'s inverse)."""
        slot_base, compactions = (int(v) for v in np.asarray(state["compaction"])[:2])
        edges = int(np.asarray(state["csc_eids"]).size)
        rows = int(np.asarray(state["csc_indptr"]).size) - 1
        self = cls.made(
            label, params, shared=shared, slot_base=slot_base, compactions=compactions, edges=edges, rows=rows
        )
        for name in FOLDED:
            data = np.asarray(state[name])
            getattr(self, name)[: data.size] = data
        self.load(state, answers, self.csc_indptr)
        return self


#: ``Overlay.__init__``'s keyword arguments among the params.
_INIT = (
    "part_id",
    "num_parts",
    "node_start",
    "num_local_nodes",
    "edge_base",
    "edge_start",
    "num_base_edges",
    "node_base",
    "node_types",
)


def overlay_view(params: Mapping[str, Any], arrays: Mapping[str, SharedArray]) -> Overlay:
    """A read-only view of an owner's overlay (compacted or not) mapped from its memfds."""
    kind = CompactedOverlay if "slot_base" in params else Overlay
    return kind.view(params, arrays)


@dataclass
class FoldInput:
    """What a fold reads: the CSC the overlay refers to (immutable) and copies of the rest."""

    label: str
    shared: bool
    params: dict[str, int]
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray
    dead: np.ndarray
    add_src: np.ndarray
    add_dst: np.ndarray
    add_dead: np.ndarray
    slot_base: int
    compactions: int
    nodes: int
    type_nodes: np.ndarray
    #: ``(tensor, policy, rows in use)``: views of the areas of rows of new IDs, copied by the
    #: fold (rows written meanwhile are recorded by the overlay and copied again by ``adopt``).
    rows: list[tuple[str, str, np.ndarray]]


def capture(
    overlay: Overlay, indptr: np.ndarray, indices: np.ndarray, eids: np.ndarray, label: str
) -> FoldInput:
    """The input of a fold of ``overlay`` as it is now (call where updates are applied)."""
    ind, idx, e = overlay.csc(indptr, indices, eids)
    n, edges = overlay.added, int(ind[-1])
    return FoldInput(
        label,
        overlay.shared,
        {k: int(v) for k, v in overlay.params().items() if k in _INIT},
        np.asarray(ind, dtype=np.int64),
        idx,
        e,
        overlay.dead[:edges].copy(),
        overlay.add_src[:n].copy(),
        overlay.add_dst[:n].copy(),
        overlay.add_dead[:n].copy(),
        overlay.slot_base,
        overlay.compactions,
        overlay.nodes,
        overlay.type_nodes.copy(),
        [(name, policy, rows[: overlay.data_used(policy)]) for name, (policy, rows) in overlay.data.items()],
    )


def fold_bytes(overlay: Overlay, indptr: np.ndarray) -> int:
    """Bytes a fold of ``overlay`` allocates (its new overlay), for the memory budget: the
    live edges' CSC (16 B each, and a tombstone byte), the ID maps, the destination index (17 B
    a node), the empty appended arrays,
    the carried rows of new IDs (an edge area: every global slot, and room for appended ones)."""
    ind = overlay.csc(indptr, indptr, indptr)[0]
    live = int(ind[-1]) - int(overlay.header[1]) + overlay.added - int(overlay.header[2])
    rows = overlay.num_local_nodes + overlay.nodes
    maps = overlay.num_base_edges + overlay.slot_base + overlay.added
    room = first_edge_capacity(overlay.num_base_edges)
    fixed = len(HEADER) * 8 + (rows + overlay.node_capacity + 2) * 17 + room * _EDGE_BYTES
    carried = overlay.data_bytes("node", overlay.node_capacity)
    carried += overlay.data_bytes("edge", overlay.slot_base + overlay.added + room)
    return live * 17 + maps * 8 + rows * 8 + fixed + carried


def fold(inp: FoldInput) -> CompactedOverlay:
    """The compacted overlay of ``inp`` (new arrays; nothing the store holds changes)."""
    p = inp.params
    rows = p["num_local_nodes"] + inp.nodes
    live_b = np.flatnonzero(inp.dead == 0)  # CSC positions, by destination then position
    row_b = np.searchsorted(inp.indptr, live_b, side="right") - 1
    live_a = np.flatnonzero(inp.add_dead == 0)
    order_a = live_a[np.argsort(inp.add_dst[live_a], kind="stable")]  # by destination, then slot
    row_a = inp.add_dst[order_a]
    count_b = np.bincount(row_b, minlength=rows)
    count_a = np.bincount(row_a, minlength=rows)
    edges = int(live_b.size + order_a.size)
    new = CompactedOverlay.made(
        inp.label,
        p,
        shared=inp.shared,
        slot_base=inp.slot_base + int(inp.add_src.size),
        compactions=inp.compactions + 1,
        edges=edges,
        rows=rows,
    )
    new.csc_indptr[0] = 0
    np.cumsum(count_b + count_a, out=new.csc_indptr[1:])
    # a row's live CSC edges first, then its appended ones: shift each run by the other's
    pos_b = np.arange(live_b.size, dtype=np.int64) + (np.cumsum(count_a) - count_a)[row_b]
    pos_a = np.arange(order_a.size, dtype=np.int64) + np.cumsum(count_b)[row_a]
    eid_b = inp.eids[live_b].astype(np.int64, copy=False)
    eid_a = p["edge_base"] + p["part_id"] + (inp.slot_base + order_a) * p["num_parts"]
    new.csc_indices[pos_b] = inp.indices[live_b]
    new.csc_indices[pos_a] = inp.add_src[order_a]
    new.csc_eids[pos_b] = eid_b
    new.csc_eids[pos_a] = eid_a
    new.base_pos[:] = -1
    new.slot_pos[:] = -1
    is_base = eid_b < p["edge_base"]
    new.base_pos[eid_b[is_base] - p["edge_start"]] = pos_b[is_base]
    new.slot_pos[(eid_b[~is_base] - p["edge_base"]) // p["num_parts"]] = pos_b[~is_base]
    new.slot_pos[inp.slot_base + order_a] = pos_a
    new.match_nodes(inp.type_nodes)
    for name, policy, data in inp.rows:  # same slots: node slots, and edge slots below slot_base
        new.put_data(name, policy, data)
    return new


def adopt(new: CompactedOverlay, old: Overlay, inp: FoldInput, removed: list[np.ndarray]) -> None:
    """Carry into ``new`` what ``old`` took since ``inp`` was captured: appended edges (same
    slots), added nodes, removals (``removed``: the IDs removed meanwhile), the request-id
    answers, the rows of new IDs written. Under the store's write lock; then ``old`` is marked
    stale for mapped views."""
    n0, n = int(inp.add_src.size), old.added
    if n > n0:
        new.append(old.add_src[n0:n], old.add_dst[n0:n])
    new.match_nodes(old.type_nodes)
    _carry_rows(new, old)
    gone_pos = [np.empty(0, np.int64)]
    if removed:
        pos, _ = new.positions(np.concatenate(removed))
        gone_pos.append(pos[pos >= 0])  # folded edges removed meanwhile (later ones: add_dead)
    gone_slots = np.flatnonzero(old.add_dead[n0:n]).astype(np.int64)  # new's slots count from n0
    new.kill(np.unique(np.concatenate(gone_pos)), gone_slots, new.csc_indptr)
    new.answers = dict(old.answers)
    new.header[3] = old.header[3] + 1
    old.header[4] = -1  # a view of the old overlay is stale from now on (OverlayMovedError)


def _carry_rows(new: CompactedOverlay, old: Overlay) -> None:
    """Make ``new``'s rows of new IDs equal ``old``'s: the rows written while it folded
    (``old.rows_meanwhile``) are copied again; an area made, dropped or made anew meanwhile
    (another shape or dtype) is copied whole, or dropped. Slots are the same in both."""
    written = old.rows_meanwhile or []
    whole = {name for name, slots in written if slots is None}
    for name in [name for name in new.data if name not in old.data]:
        new.drop_data(name)  # its tensor was deleted meanwhile
    copied: set[str] = set()
    for name, (policy, rows) in old.data.items():
        got = new.data.get(name)
        like = (policy, rows.shape[1:], rows.dtype)
        kept = got is not None and (got[0], got[1].shape[1:], got[1].dtype) == like
        if name in whole or not kept:
            new.put_data(name, policy, rows[: old.data_used(policy)])
            copied.add(name)
    for name in {name for name, _ in written} - copied - whole:
        slots = np.concatenate([s for t, s in written if t == name and s is not None])
        new.data[name][1][slots] = old.data[name][1][slots]
