"""A live graph's overlay on one partition's immutable CSC (issue 35; ``docs/design.md``).

The base structure (``indptr``/``indices``/``eids``) never changes. Updates the partition owns
(edges whose destination it owns) land here: ``dead`` marks removed base edges (one byte per
base edge), appended edges are kept in log order (``add_src`` global, ``add_dst`` local,
``add_dead``), and ``add_block``/``add_indptr``/``add_order`` index them by destination (two-
level offsets, ``storage/overlay_layout.py``, moved per applied batch); ``dead_deg`` counts each
node's removed in-edges (base and appended), so a reader knows a live degree, and whether a row
has tombstones to skip, in O(1); ``touched`` (one byte a node, small enough to stay in cache)
marks the nodes with any appended or removed in-edge: a reader of an untouched node reads the
base CSC alone. The ``k``-th appended edge of partition ``p`` has the global ID ``E_base + p + k
* P`` (:func:`new_edge_ids`): owner and slot are arithmetic, the partition book stays as it is.
``header`` holds the counts (appended, removed base, removed appended) and a version that moves
with every applied batch.

Only the owner (the server, or a standalone store) writes, under the store's write lock;
readers hold the read lock, so they see whole batches. With ``shared`` every array is a memfd
(``SharedArray``), so co-located processes can map it; arrays grow by doubling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncgraph.errors import OutOfRangeError, UnknownEdgeError
from asyncgraph.storage import overlay_layout as layout
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.overlay_data import DataAreas
from asyncgraph.storage.overlay_layout import FIRST_CAPACITY, INDEX_SHIFT, doubled, first_edge_capacity

__all__ = ["HEADER", "INDEX_SHIFT", "MAPPED", "Overlay", "edge_owner", "new_edge_ids"]

#: The header's words: appended edges, removed base edges, removed appended edges, version,
#: the capacity of the appended arrays (a mapped view whose arrays are smaller is stale), added
#: nodes and the capacity for them in the destination index, and how many times an append area
#: of tensor rows was made (a view mapped before the last one is stale).
HEADER = ("added", "dead_base", "dead_added", "version", "capacity", "nodes", "node_capacity", "data_layout")
#: The arrays a co-located process maps, read-only.
MAPPED = (
    "header",
    "dead",
    "dead_deg",
    "touched",
    "add_indptr",
    "add_block",
    "add_src",
    "add_dst",
    "add_order",
    "add_dead",
    "type_nodes",
)
#: Bytes per appended edge: source, destination, index order (int64) and tombstone (uint8).
_EDGE_BYTES = 8 * 3 + 1
#: Most request-id answers kept (``rid -> first slot, count``); older resends answer nothing.
_MAX_ANSWERS = 1 << 16


def new_edge_ids(edge_base: int, part_id: int, num_parts: int, slots: np.ndarray) -> np.ndarray:
    """Global IDs of appended edges ``slots`` of partition ``part_id``: ``E_base + p + k * P``."""
    return (edge_base + part_id + slots.astype(np.int64) * num_parts).astype(np.int64)


def edge_owner(eids: np.ndarray, edge_base: int, base_owner: np.ndarray, num_parts: int) -> np.ndarray:
    """The owner of every edge ID: the book's for base IDs (``base_owner``, computed by the
    caller on the clipped IDs), ``(eid - E_base) % P`` above the base."""
    above = eids >= edge_base
    return np.where(above, (eids - edge_base) % num_parts, base_owner).astype(np.int64)


class Overlay(DataAreas):
    """One partition's appended and removed edges (see the module docstring)."""

    #: The global slot of appended entry 0 (edges folded by compaction keep slots below it;
    #: ``storage/compaction.py``), and how many compactions made this overlay's CSC.
    slot_base = 0
    compactions = 0
    dead_deg: np.ndarray
    touched: np.ndarray

    def __init__(
        self,
        label: str,
        *,
        part_id: int,
        num_parts: int,
        node_start: int,
        num_local_nodes: int,
        edge_base: int,
        edge_start: int,
        num_base_edges: int,
        node_base: int,
        shared: bool,
        node_types: int = 1,
    ) -> None:
        self.label = label
        self.part_id = part_id
        self.num_parts = num_parts
        self.node_start = node_start
        self.num_local_nodes = num_local_nodes
        self.edge_base = edge_base
        self.edge_start = edge_start
        self.num_base_edges = num_base_edges
        self.node_base = node_base
        self.shared = shared
        self.node_types = node_types
        self._arrays: dict[str, SharedArray | np.ndarray] = {}
        self.header = self._new("header", len(HEADER), np.int64)
        #: Added nodes of each node type (one for a homogeneous graph): see ``add_nodes``.
        self.type_nodes = self._new("type_nodes", max(1, node_types), np.int64)
        self.dead = self._new("dead", max(1, num_base_edges), np.uint8)
        #: Rows of tensors for new IDs: ``name -> (policy, rows)``, row ``k`` the ``k``-th added
        #: node (policy "node") or appended edge ("edge"); grown with the overlay.
        self.data: dict[str, tuple[str, np.ndarray]] = {}
        self.rows_meanwhile = None  # a list while a compaction folds it (overlay_data.note_rows)
        self.data_layout = 0
        self.node_capacity = 0
        self.add_indptr = np.zeros(1, np.int64)
        self.add_block = np.zeros(1, np.int64)
        self._grow_nodes(FIRST_CAPACITY)
        self.capacity = 0
        self.add_src = self.add_dst = self.add_order = np.empty(0, np.int64)
        self.add_dead = np.empty(0, np.uint8)
        self._grow(first_edge_capacity(num_base_edges))
        #: ``rid -> (first slot, count)`` of applied ``add_edges``: a resend answers the same IDs.
        self.answers: dict[str, tuple[int, int]] = {}

    # --- memory ------------------------------------------------------------------------
    def _new(self, name: str, size: int, dtype: Any) -> np.ndarray:
        data: SharedArray | np.ndarray
        if self.shared:
            data = SharedArray.create(f"{self.label}.{name}", (size,), dtype, final=False)
        else:
            data = np.zeros(size, dtype=dtype)
        old = self._arrays.get(name)
        if isinstance(old, SharedArray):
            old.close()  # readers' views keep their mapping until dropped
        self._arrays[name] = data
        return data.array if isinstance(data, SharedArray) else data

    def _grow(self, need: int) -> None:
        """Make room for ``need`` appended edges (doubling), copying what is there."""
        if need <= self.capacity:
            return
        cap = doubled(self.capacity, need, first_edge_capacity(self.num_base_edges))
        n = self.added
        grown = (
            ("add_src", np.int64),
            ("add_dst", np.int64),
            ("add_order", np.int64),
            ("add_dead", np.uint8),
        )
        kept = {name: getattr(self, name)[:n].copy() for name, _ in grown}
        for name, dtype in grown:
            arr = self._new(name, cap, dtype)
            arr[:n] = kept[name]
            setattr(self, name, arr)
        self.capacity = cap
        self.header[4] = cap
        self._grow_data("edge", self.slot_base + n)

    def _grow_nodes(self, need: int) -> None:
        """Room in the destination index for ``need`` added nodes (doubling)."""
        if need <= self.node_capacity:
            return
        cap = doubled(self.node_capacity, need)
        size = self.num_local_nodes + cap + 1
        flat = layout.grown(self.add_block, self.add_indptr, size)
        self.add_block = self._new("add_block", layout.blocks(size), np.int64)
        self.add_indptr = self._new("add_indptr", size, np.int64)
        layout.split(flat, self.add_block, self.add_indptr)
        for name, dtype in (("dead_deg", np.int64), ("touched", np.uint8)):
            kept = getattr(self, name, np.zeros(0, dtype))
            grown = self._new(name, self.num_local_nodes + cap, dtype)
            grown[: kept.size] = kept
            setattr(self, name, grown)
        self.node_capacity = cap
        self.header[6] = cap
        self._grow_data("node", self.nodes)

    @staticmethod
    def first_bytes(num_local_nodes: int, num_base_edges: int, edges: int = 0, nodes: int = 0) -> int:
        """Bytes a new overlay holds once it has room for ``edges`` and ``nodes``."""
        index = layout.index_bytes(num_local_nodes + doubled(0, nodes) + 1)
        room = doubled(0, edges, first_edge_capacity(num_base_edges))
        return len(HEADER) * 8 + max(1, num_base_edges) + index + room * _EDGE_BYTES

    def growth_bytes(self, edges: int = 0, nodes: int = 0) -> int:
        """Bytes more that ``edges`` more appended edges and ``nodes`` more added nodes would
        allocate (new arrays, before the old ones are freed): what the memory budget checks."""
        need = 0
        if self.added + edges > self.capacity:
            cap = doubled(self.capacity, self.added + edges, first_edge_capacity(self.num_base_edges))
            need += cap * _EDGE_BYTES + self.data_bytes("edge", self.slot_base + cap)
        if self.nodes + nodes > self.node_capacity:
            cap = doubled(self.node_capacity, self.nodes + nodes)
            need += layout.index_bytes(self.num_local_nodes + cap + 1) + self.data_bytes("node", cap)
        return need

    def params(self) -> dict[str, int]:
        """What a mapped view needs besides the arrays (``view``)."""
        names = ("part_id", "num_parts", "node_start", "num_local_nodes", "edge_base", "edge_start")
        return {
            name: int(getattr(self, name))
            for name in (*names, "num_base_edges", "node_base", "data_layout", "node_types")
        }

    @classmethod
    def view(cls, params: Mapping[str, Any], arrays: Mapping[str, SharedArray]) -> Overlay:
        """A read-only view of an owner's overlay mapped from its memfds (a co-located process):
        it reads under the owner's lock and never writes; ``stale`` once the owner grew it."""
        self = cls.__new__(cls)
        for name, value in params.items():
            setattr(self, name, int(value))
        self.label, self.shared, self.answers = "view", True, {}
        self._arrays = dict(arrays)
        for name in MAPPED:
            setattr(self, name, arrays[name].array)
        self.data = {}
        for key, sa in arrays.items():
            if key.startswith("data:"):
                _, policy, tensor = key.split(":", 2)
                self.data[tensor] = (policy, sa.array)
        self.capacity = int(self.add_src.size)
        self.node_capacity = int(self.add_indptr.size) - 1 - self.num_local_nodes
        return self

    @property
    def stale(self) -> bool:
        """True when the owner replaced the arrays (it grew them): this view must be re-mapped."""
        return (
            int(self.header[4]) != self.capacity
            or int(self.header[6]) != self.node_capacity
            or int(self.header[7]) != self.data_layout
        )

    @property
    def arrays(self) -> Mapping[str, SharedArray | np.ndarray]:
        """Every array as stored (memfds when shared), by name."""
        return self._arrays

    def close(self) -> None:
        for data in self._arrays.values():
            if isinstance(data, SharedArray):
                data.close()
        self._arrays.clear()

    # --- counts ------------------------------------------------------------------------
    @property
    def added(self) -> int:
        return int(self.header[0])

    @property
    def nodes(self) -> int:
        """Slots of added nodes (their local indices follow the base's: ``num_local_nodes + s``);
        with several node types some slots are not (yet) nodes (``add_nodes``)."""
        return int(self.header[5])

    @property
    def removed(self) -> int:
        return int(self.header[1] + self.header[2])

    def stats(self) -> dict[str, int]:
        """The overlay's size, for metrics: appended edges, removed edges, bytes held."""
        held = sum(int((d.array if isinstance(d, SharedArray) else d).nbytes) for d in self._arrays.values())
        return {
            "overlay_edges": self.added,
            "overlay_removed": self.removed,
            "overlay_nodes": int(self.type_nodes.sum()),
            "overlay_bytes": held,
        }

    # --- checks (nothing changes) ------------------------------------------------------
    def local_nodes(self, ids: np.ndarray) -> np.ndarray:
        """Local indices of owned nodes ``ids`` (base nodes, then added ones); ``OutOfRangeError``
        for a node another partition owns or that does not exist."""
        ids = np.asarray(ids, dtype=np.int64)
        local = ids - self.node_start
        if local.size and int(local.min()) >= 0 and int(local.max()) < self.num_local_nodes:
            return local  # base nodes only: the common request
        base = (local >= 0) & (local < self.num_local_nodes)
        rel = ids - self.node_base
        slot = rel // self.num_parts
        kind, k = slot % self.node_types, slot // self.node_types
        new = (rel >= 0) & (rel % self.num_parts == self.part_id) & (k < self.type_nodes[kind])
        if not np.all(base | new):
            bad = int(ids[~(base | new)][0])
            raise OutOfRangeError(f"node {bad} is not a node partition {self.part_id} holds")
        return np.where(base, local, self.num_local_nodes + slot)

    def global_nodes(self, local: np.ndarray) -> np.ndarray:
        """Global IDs of local node indices (``local_nodes``'s inverse)."""
        nl = self.num_local_nodes
        added = self.node_base + self.part_id + (local - nl) * self.num_parts
        return np.where(local < nl, self.node_start + local, added).astype(np.int64)

    def locate(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(base positions, appended slots)`` of owned live edges ``eids``, each sorted unique;
        ``OutOfRangeError`` for an ID another partition owns, ``UnknownEdgeError`` for one that
        is not a live edge (never added, or removed)."""
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
        slots = rel // self.num_parts
        n = self.added
        if slots.size and slots.max() >= n:
            bad = ids[above][slots >= n][0]
            raise UnknownEdgeError(f"edge {int(bad)} was never added (partition {self.part_id} has {n})")
        if base.size and np.any(self.dead[base]):
            bad = ids[~above][self.dead[base] != 0][0]
            raise UnknownEdgeError(f"edge {int(bad)} was removed")
        if slots.size and np.any(self.add_dead[slots]):
            bad = ids[above][self.add_dead[slots] != 0][0]
            raise UnknownEdgeError(f"edge {int(bad)} was removed")
        return np.unique(base), np.unique(slots)

    def csc(self, indptr: np.ndarray, indices: np.ndarray, eids: np.ndarray) -> tuple[np.ndarray, ...]:
        """The CSC this overlay's ``dead`` bytes refer to: the store's (``indptr``, ...) until a
        compaction folded the overlay into one of its own (``CompactedOverlay``)."""
        return indptr, indices, eids

    def positions(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(CSC position, appended index)`` of owned edge IDs ``ids`` (checked by ``locate``),
        -1 where the other one applies."""
        above = ids >= self.edge_base
        pos = np.where(above, -1, ids - self.edge_start).astype(np.int64)
        idx = np.where(above, (ids - self.edge_base) // self.num_parts - self.slot_base, -1)
        return pos, idx.astype(np.int64)

    def mapped_names(self) -> tuple[str, ...]:
        """The arrays a co-located process maps (``MAPPED``, plus a compacted CSC's)."""
        return MAPPED

    # --- updates (the owner, under the store's write lock) ------------------------------
    def append(self, src: np.ndarray, dst_local: np.ndarray, rid: str | None = None) -> int:
        """Append edges ``src -> node_start + dst_local`` (checked by the caller); their first
        slot. The destination index takes them in (linear in the appended edges)."""
        m = int(src.size)
        n = self.added
        self._grow(n + m)
        self.add_src[n : n + m] = src
        self.add_dst[n : n + m] = dst_local
        self.add_dead[n : n + m] = 0
        self.touched[dst_local] = 1
        self.header[0] = n + m
        self._reindex(n)
        if rid is not None:
            self.remember(rid, n, m)
        return n

    def add_starts(self, local: np.ndarray) -> np.ndarray:
        """Where local nodes' appended in-edges start in ``add_order`` (a node's run ends where
        the next node's starts; ``storage/overlay_layout.py``)."""
        return layout.starts(self.add_block, self.add_indptr, local)

    def _reindex(self, first: int) -> None:
        """Take appended edges ``first...`` into the destination index, in place: each after the
        earlier edges of its destination in ``add_order``, and the offsets moved by the new
        edges' running counts (``kernels/overlay_index.py``); nothing indexed is sorted again."""
        n = self.added
        dst = self.add_dst[:n]
        if first < n:
            new = np.argsort(dst[first:], kind="stable")  # by destination, then slot
            sorted_dst = dst[first:][new]
            at = self.add_starts(sorted_dst + 1)  # after the earlier edges of each
            from asyncgraph.kernels.overlay_index import INDEX, shift_offsets_numpy  # (a cycle)

            kernels = INDEX.kernels if INDEX.ready() else None  # loading: numpy's form meanwhile
            if kernels is not None:
                kernels.merge_order(self.add_order, first, at, first + new)
                kernels.shift_offsets(self.add_block, self.add_indptr, sorted_dst, INDEX_SHIFT)
            else:
                self.add_order[:n] = np.insert(self.add_order[:first], at, first + new)
                shift_offsets_numpy(self.add_block, self.add_indptr, sorted_dst, INDEX_SHIFT)
        self.header[3] += 1

    def add_nodes(self, num: int, rid: str | None = None, ntype: int = 0) -> int:
        """Add ``num`` nodes of node type ``ntype`` (no in-edges yet); the first one's slot.

        The ``k``-th node of type ``t`` added here takes slot ``k * T + t`` (``T`` node types;
        its global ID is ``N_base + p + slot * P``), so type, per-type rank and owner of every
        added ID are arithmetic; slots between them wait for the other types' nodes."""
        nt = self.node_types
        k0 = int(self.type_nodes[ntype])
        first = k0 * nt + ntype
        high = max(self.nodes, (k0 + num - 1) * nt + ntype + 1) if num else self.nodes
        self._grow_nodes(high)
        self.type_nodes[ntype] = k0 + num
        self.header[5] = high
        self.header[3] += 1  # the index holds them already: no in-edges, rows past the last edge
        if rid is not None:
            self.remember(f"nodes:{rid}", first, num)
        return first

    def match_nodes(self, type_nodes: np.ndarray) -> None:
        """Add nodes of each type until this overlay holds ``type_nodes[t]`` of type ``t``."""
        for t, count in enumerate(np.asarray(type_nodes, dtype=np.int64).tolist()):
            if count > int(self.type_nodes[t]):
                self.add_nodes(count - int(self.type_nodes[t]), ntype=t)

    def remember(self, rid: str, first: int, count: int) -> None:
        if len(self.answers) >= _MAX_ANSWERS:
            self.answers.pop(next(iter(self.answers)))
        self.answers[rid] = (first, count)

    def kill(self, base: np.ndarray, slots: np.ndarray, indptr: np.ndarray) -> None:
        """Mark live base positions ``base`` and appended ``slots`` removed (``locate``'s answer);
        ``indptr``: the store's (whose rows ``base`` are in; a compacted overlay reads its own)."""
        if base.size:
            rows = self.csc(indptr, indptr, indptr)[0]
            at = np.searchsorted(rows, base, side="right") - 1
            np.add.at(self.dead_deg, at, 1)
            self.touched[at] = 1
        if slots.size:
            np.add.at(self.dead_deg, self.add_dst[slots], 1)
        self.dead[base] = 1
        self.add_dead[slots] = 1
        self.header[1] += base.size
        self.header[2] += slots.size
        self.header[3] += 1

    # --- snapshots ---------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """What a snapshot keeps: the appended edges in slot order and the removed edges."""
        n = self.added
        return {
            "add_src": self.add_src[:n],
            "add_dst": self.add_dst[:n],
            "add_dead": self.add_dead[:n],
            "dead_base": np.flatnonzero(self.dead[: self.num_base_edges]).astype(np.int64),
            "nodes": np.array([self.nodes], dtype=np.int64),
            "type_nodes": self.type_nodes.copy(),
            **{  # rows of new IDs, flat: ``load`` is given their tensors' shapes
                self._data_key(policy, name): rows[: self.data_used(policy)].reshape(-1)
                for name, (policy, rows) in self.data.items()
            },
        }

    def load(self, state: Mapping[str, np.ndarray], answers: Mapping[str, Any], indptr: np.ndarray) -> None:
        """Make this (new) overlay hold a snapshot's ``state`` and request-id answers
        (``indptr``: the store's, as ``kill`` takes it)."""
        nodes = np.asarray(state.get("nodes", np.zeros(1, np.int64)))
        self.match_nodes(np.asarray(state.get("type_nodes", nodes[:1])))
        n = int(state["add_src"].size)
        if n:
            self.append(np.asarray(state["add_src"]), np.asarray(state["add_dst"]))
        slots = np.flatnonzero(np.asarray(state["add_dead"]))
        self.kill(np.asarray(state["dead_base"], dtype=np.int64), slots, indptr)
        for rid, (first, count) in answers.items():
            self.remember(str(rid), int(first), int(count))
