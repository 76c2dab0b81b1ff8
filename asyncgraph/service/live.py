"""A partition's live structure (issue 35): its overlay's updates and the reads of base + overlay.

``PartitionService`` holds one ``LiveStructure``; the overlay is made on the first update, so
a graph nobody updates keeps today's kernels and their exact answers. Updates are checked in
full before anything changes (``OutOfRangeError`` for a node that does not exist or a
destination another partition owns, ``UnknownEdgeError`` for an edge that is not live) and
applied under the store's write lock; reads of the overlay hold its read lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import InvalidRequestError, LiveGraphError, OutOfRangeError, ShapeMismatchError
from asyncgraph.kernels import compiled
from asyncgraph.kernels.edge_queries import OutIndex
from asyncgraph.kernels.overlay_edges import SourceIndex, live_out_degrees, sample_edges_live
from asyncgraph.kernels.overlay_sample import live_degrees, sample_live
from asyncgraph.kernels.overlay_typed import sample_typed_live
from asyncgraph.kernels.partition_sampling import keyed_rng
from asyncgraph.kernels.sampling import FLOYD_MAX_FANOUT, sample_csc
from asyncgraph.protocol.ops import SampleEdgesArgs
from asyncgraph.service.limits import WorkLimits
from asyncgraph.service.live_typed import check_unique_adds, edge_types_of, node_type_of, type_eid_rows
from asyncgraph.storage.compaction import CompactedOverlay
from asyncgraph.storage.overlay import Overlay, new_edge_ids
from asyncgraph.storage.overlay_data import OverlayMovedError
from asyncgraph.storage.overlay_rows import (
    check_row_data,
    load_row_data,
    write_row_data,
)
from asyncgraph.storage.store import PartitionStore

__all__ = ["MAX_ADDED_NODES", "LiveStructure", "OverlayMovedError"]

#: Most nodes one ``add_nodes`` request may add (the destination index grows with them).
MAX_ADDED_NODES = 1 << 22


class LiveStructure:
    """One partition's overlay and the ops over base + overlay."""

    def __init__(self, store: PartitionStore) -> None:
        self.store = store
        store.book.grows = True  # added IDs map by their arithmetic (partition/added_ids.py)
        #: The IDs removed while a compaction folds (``service/live_compact.py``); None: none runs.
        self.removed_meanwhile: list[np.ndarray] | None = None
        #: The out-index over a compacted overlay's CSC, and that overlay (built on the first
        #: out-edge read after each compaction; the base's ``OutIndex`` serves until one).
        self._folded_out: tuple[Overlay, SourceIndex] | None = None

    @property
    def overlay(self) -> Overlay | None:
        """The store's overlay (kept on the store, so that its export can share it)."""
        return self.store.overlay

    @property
    def active(self) -> bool:
        """True once an update was applied: reads must include the overlay."""
        return self.overlay is not None

    def stats(self) -> dict[str, int]:
        """The overlay's size (a metric: when it holds a large share of the partition's edges,
        partition again): appended and removed edges, bytes held."""
        overlay = self.overlay
        if overlay is None:
            return {
                "overlay_edges": 0,
                "overlay_removed": 0,
                "overlay_nodes": 0,
                "overlay_dead": 0,
                "overlay_bytes": 0,
                "compactions": 0,
            }
        return {**overlay.stats(), "overlay_dead": overlay.removed, "compactions": overlay.compactions}

    def check_mapped(self, op: str) -> None:
        """``LiveGraphError`` on a store mapped from an owner whose graph is live (a replica
        server): the overlay is not mapped here yet, so the base alone would answer wrongly."""
        if getattr(self.store, "live_elsewhere", False):
            raise LiveGraphError(f"{op}: this process does not map the partition's overlay; ask its primary")

    def refuse(self, op: str) -> None:
        """``LiveGraphError`` for an op without a live form, once the graph was updated."""
        if self.overlay is not None:
            raise LiveGraphError(
                f"{op} does not read a live graph's added and removed edges yet (issue 35); "
                f"partition {self.store.part_id} has {self.overlay.added} added and "
                f"{self.overlay.removed} removed"
            )

    def held_bytes(self) -> int:
        """Bytes the overlay holds (counted against the server's memory budget)."""
        if self.overlay is None:
            return 0
        folded = self._folded_out
        index_bytes = folded[1].nbytes if folded is not None and folded[0] is self.overlay else 0
        return self.overlay.stats()["overlay_bytes"] + index_bytes

    def _out_index(self, overlay: Overlay, base: Callable[[], OutIndex]) -> OutIndex | SourceIndex:
        """The out-index over ``overlay``'s CSC: the base's (``base()``, the service's) until a
        compaction made a CSC of its own, then one over that CSC, built once per compaction
        (16 B per folded edge, counted in ``held_bytes``; ``MemoryBudgetError``, nothing built,
        when that does not fit in the store's memory budget)."""
        if not isinstance(overlay, CompactedOverlay):
            return base()
        folded = self._folded_out
        if folded is None or folded[0] is not overlay:
            store = self.store
            if store.rules.memory_budget:
                tensors = sum(size for _, size in store.local_sizes().values())
                need = 16 * overlay.folded_edges
                store.rules.check_room("out-edge reads (an out-index over the compacted CSC)", need, tensors)
            folded = (overlay, SourceIndex.build(overlay.csc_indices[: overlay.folded_edges]))
            self._folded_out = folded
        return folded[1]

    def _check_room(self, what: str, edges: int = 0, nodes: int = 0) -> None:
        """``MemoryBudgetError`` (nothing changes) when the overlay's growth would pass the
        store's memory budget (``--memory-budget``; its tensors and the overlay count)."""
        store = self.store
        if not store.rules.memory_budget:
            return
        overlay = self.overlay
        if overlay is None:
            lo, hi = store.node_range
            elo, ehi = store.edge_range
            need = Overlay.first_bytes(hi - lo, ehi - elo, edges, nodes)
        else:
            need = overlay.growth_bytes(edges, nodes)
        if need:
            tensors = sum(size for _, size in store.local_sizes().values())
            store.rules.check_room(f"{what} (the live graph's overlay)", need, tensors)

    @property
    def label(self) -> str:
        """The overlay's memfd label prefix."""
        return f"asyncgraph.{self.store.graph_name}.p{self.store.part_id}.overlay"

    def params(self) -> dict[str, int]:
        """``Overlay``'s keyword arguments for this partition (besides label and sharing)."""
        store, book = self.store, self.store.book
        lo, hi = store.node_range
        elo, ehi = store.edge_range
        return {
            "part_id": store.part_id,
            "num_parts": book.num_partitions(),
            "node_start": lo,
            "num_local_nodes": hi - lo,
            "edge_base": book.num_edges,
            "edge_start": elo,
            "num_base_edges": ehi - elo,
            "node_base": book.num_nodes,
            "node_types": len(book.ntypes) if book.is_hetero else 1,
        }

    @property
    def sharing(self) -> bool:
        """Whether the overlay's arrays are memfds (a shared owner store)."""
        return self.store.shared and not self.store.attached

    def _made(self) -> Overlay:
        store = self.store
        if store.overlay is None:
            made = store.overlay = Overlay(self.label, shared=self.sharing, **self.params())
            store.catalog_changed()  # co-located readers re-sync: the graph is live now
            return made
        return store.overlay

    # --- updates -----------------------------------------------------------------------
    def local_nodes(self, ids: Any) -> np.ndarray:
        """Local indices of owned nodes ``ids`` (added ones included); ``OutOfRangeError``."""
        gids = as_id_array(ids, "ids")
        if self.overlay is None:  # no node was added: the book's range
            return np.asarray(self.store.book.nid2localnid(gids, self.store.part_id), dtype=np.int64)
        return self.overlay.local_nodes(gids)

    def check_add(self, src: Any, dst: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(src, local dst)`` of edges to append here, checked (nothing changes on error).

        A source above the base another partition added cannot be checked here (its owner
        knows); the client checks it with that owner before sending (``client/live.py``)."""
        s, d = as_id_array(src, "src"), as_id_array(dst, "dst")
        if s.shape != d.shape:
            raise ShapeMismatchError(f"add_edges: {s.size} sources and {d.size} destinations")
        n = self.store.book.num_nodes
        if s.size and int(s.min()) < 0:
            raise OutOfRangeError(f"add_edges: source {int(s.min())} is not a node")
        book = self.store.book
        mine = (s >= n) & ((s - n) % book.num_partitions() == self.store.part_id)
        if mine.any():
            self.local_nodes(s[mine])  # our added nodes: they must exist
        local = self.local_nodes(d)  # OutOfRangeError: not ours, or no such node
        return s.astype(np.int64, copy=False), local

    def add_edges(
        self, src: Any, dst: Any, rid: str | None = None, data: Mapping[str, Any] | None = None
    ) -> np.ndarray:
        """Append edges ``src -> dst`` (every ``dst`` owned here) with rows ``data`` of edge
        tensors (others: zeros); their new global IDs."""
        s, local = self.check_add(src, dst)
        rows = check_row_data(self.store, "add_edges", "edge", int(s.size), data)
        etypes = edge_types_of(self.store, s, as_id_array(dst, "dst"), rows)  # heterogeneous: checked
        if not self.store.multigraph:
            check_unique_adds(self.store, self.overlay, s, as_id_array(dst, "dst"), etypes)
        self._check_room("add_edges", edges=int(s.size))
        overlay = self._made()
        layout = overlay.capacity, overlay.data_layout
        with self.store.lock.write():
            first = overlay.append(s, local, rid)
            typed = [] if etypes is None else [type_eid_rows(self.store, etypes, first)]
            write_row_data(overlay, [*rows, *typed], first)
        if (overlay.capacity, overlay.data_layout) != layout:
            self.store.catalog_changed()  # new memfds: co-located readers map them again
        return self.ids_of(first, int(s.size))

    def add_nodes(
        self, num: int, rid: str | None = None, data: Mapping[str, Any] | None = None
    ) -> np.ndarray:
        """Add ``num`` nodes owned here (no edges yet) with rows ``data`` of node tensors
        (others: zeros); their new global IDs ``N_base + p + k * P``."""
        if not 0 <= num <= MAX_ADDED_NODES:
            raise InvalidRequestError(f"add_nodes: num must be 0 to {MAX_ADDED_NODES}, got {num}")
        rows = check_row_data(self.store, "add_nodes", "node", num, data)
        ntype = node_type_of(self.store, rows, num)
        self._check_room("add_nodes", nodes=num * (len(self.store.book.ntypes) if ntype else 1))
        overlay = self._made()
        layout = overlay.node_capacity, overlay.data_layout
        with self.store.lock.write():
            first = overlay.add_nodes(num, rid, ntype)
            write_row_data(overlay, rows, first, overlay.node_types)
        if (overlay.node_capacity, overlay.data_layout) != layout:
            self.store.catalog_changed()
        return self.node_ids_of(first, num)

    def node_ids_of(self, first: int, count: int) -> np.ndarray:
        """Global IDs of ``count`` added nodes of one type from slot ``first`` (``add_nodes``)."""
        book, part = self.store.book, self.store.part_id
        slots = first + np.arange(count, dtype=np.int64) * self._made().node_types
        return (book.num_nodes + part + slots * book.num_partitions()).astype(np.int64)

    def answered_nodes(self, rid: str) -> np.ndarray | None:
        """The IDs an applied ``add_nodes`` with request id ``rid`` answered, if still known."""
        got = self.overlay.answers.get(f"nodes:{rid}") if self.overlay is not None else None
        return None if got is None else self.node_ids_of(*got)

    def answered(self, rid: str) -> np.ndarray | None:
        """The IDs an applied ``add_edges`` with request id ``rid`` answered, if still known."""
        got = self.overlay.answers.get(rid) if self.overlay is not None else None
        return None if got is None else self.ids_of(*got)

    def ids_of(self, first: int, count: int) -> np.ndarray:
        store = self.store
        slots = np.arange(first, first + count, dtype=np.int64)
        return new_edge_ids(store.book.num_edges, store.part_id, store.book.num_partitions(), slots)

    def remove_edges(self, eids: Any) -> None:
        """Remove live edges ``eids`` owned here (duplicates allowed; each removed once)."""
        ids = as_id_array(eids, "eids")
        overlay = self._made()
        base, slots = overlay.locate(ids)  # raises before anything changes
        with self.store.lock.write():
            overlay.kill(base, slots, self.store.indptr)
        if self.removed_meanwhile is not None:  # a compaction folds: it marks them too
            self.removed_meanwhile.append(ids.astype(np.int64))

    # --- reads of base + overlay (only when ``active``), under the store's read lock ------
    def _current(self) -> Overlay:
        overlay = self.overlay
        assert overlay is not None
        if overlay.stale:
            raise OverlayMovedError(
                f"partition {self.store.part_id}'s overlay grew since this process mapped it; "
                "map it again (the owner answers meanwhile)"
            )
        return overlay

    def sample(
        self,
        seeds: np.ndarray,
        fanout: int,
        replace: bool,
        seed: int | None,
        limits: WorkLimits | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        store = self.store
        rng = keyed_rng(seed, store.part_id)
        with store.lock.read():
            overlay = self._current()
            local = overlay.local_nodes(seeds)
            if limits is not None and isinstance(fanout, int):
                deg = live_degrees(store.indptr, overlay, local)
                most = int(deg.sum()) if fanout < 0 else int(np.minimum(deg, fanout).sum())
                if replace and fanout >= 0:
                    most = int(np.count_nonzero(deg)) * fanout
                limits.check_sample(local.size, fanout, most)
            indptr, indices, eids = overlay.csc(store.indptr, store.indices, store.eids)
            if not (overlay.added or overlay.removed) and local.size and int(local.max()) < indptr.size - 1:
                # nothing added or removed since the CSC was made (a compaction): its static kernels
                return _sample_csc(indptr, indices, eids, local, seeds, fanout, replace, rng)
            return sample_live(
                store.indptr, store.indices, store.eids, overlay, local, seeds, int(fanout), replace, rng
            )

    def in_degrees(self, ids: np.ndarray | None) -> np.ndarray:
        store = self.store
        with store.lock.read():
            overlay = self._current()
            if ids is None:  # the base nodes, as the book numbers them (added ones: by ID)
                local = np.arange(overlay.num_local_nodes, dtype=np.int64)
            else:
                local = overlay.local_nodes(as_id_array(ids, "ids"))
            return live_degrees(store.indptr, overlay, local)

    def out_degrees(self, base_index: Callable[[], OutIndex], ids: np.ndarray | None) -> np.ndarray:
        """This partition's share of the out-degrees of ``ids`` (None: every base node) over
        its CSC + overlay: the CSC's count by source (``base_index()``, the out-index over base
        edges, or one over a compaction's CSC), less its removed edges, plus live appended
        edges. Added nodes of other partitions count what this one holds from them (their
        owner checked they exist: the client asks it)."""
        store = self.store
        with store.lock.read():
            overlay = self._current()
            n_base = store.book.num_nodes
            gids = np.arange(n_base, dtype=np.int64) if ids is None else as_id_array(ids, "ids")
            if gids.size and int(gids.min()) < 0:
                raise OutOfRangeError(f"node ID {int(gids.min())} is negative")
            mine = (gids >= n_base) & ((gids - n_base) % overlay.num_parts == overlay.part_id)
            if mine.any():
                overlay.local_nodes(gids[mine])  # our added nodes: they must exist
            csc = overlay.csc(store.indptr, store.indices, store.eids)
            return live_out_degrees(csc, overlay, self._out_index(overlay, base_index), gids, n_base)

    def sample_typed(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        """``sample_edges`` with a fanout per edge type over base + overlay (``overlay_typed``)."""
        assert args.etype_fanouts is not None
        with self.store.lock.read():
            overlay = self._current()
            return sample_typed_live(
                self.store,
                overlay,
                args.seeds,
                args.etype_fanouts,
                seed=args.seed,
                prob=args.prob,
                etype_probs=args.etype_probs,
                exclude=args.exclude,
            )

    def sample_edges(
        self, base_index: Callable[[], OutIndex], args: SampleEdgesArgs
    ) -> dict[str, np.ndarray]:
        """``sample_edges`` (in- or out-edges, ``prob``, ``exclude``) over the overlay's CSC +
        the overlay (``base_index()``: the out-index over base edges, for out-edges)."""
        with self.store.lock.read():
            overlay = self._current()
            out_index = self._out_index(overlay, base_index) if args.edge_dir == "out" else None
            return sample_edges_live(
                self.store,
                overlay,
                out_index,
                args.seeds,
                args.fanout,
                edge_dir=args.edge_dir,
                replace=args.replace,
                seed=args.seed,
                prob=args.prob,
                exclude=args.exclude,
            )

    def find_edges(self, eids: Any) -> tuple[np.ndarray, np.ndarray]:
        store, overlay = self.store, self.overlay
        assert overlay is not None
        ids = as_id_array(eids, "eids").astype(np.int64, copy=False)
        with store.lock.read():
            overlay = self._current()
            overlay.locate(ids)  # owned and live, else a typed error
            indptr, indices, _ = overlay.csc(store.indptr, store.indices, store.eids)
            pos, idx = overlay.positions(ids)
            folded = pos >= 0  # in the CSC (the base's, or a compaction's)
            src = np.empty(ids.size, np.int64)
            dst = np.empty(ids.size, np.int64)
            src[folded] = indices[pos[folded]]
            dst[folded] = overlay.global_nodes(np.searchsorted(indptr, pos[folded], side="right") - 1)
            src[~folded] = overlay.add_src[idx[~folded]]
            dst[~folded] = overlay.global_nodes(overlay.add_dst[idx[~folded]])
        return src, dst

    # --- snapshots ---------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, list[int]]] | None:
        """The overlay's arrays and request-id answers, for a snapshot (None: never updated)."""
        if self.overlay is None:
            return None
        answers = {rid: [first, count] for rid, (first, count) in self.overlay.answers.items()}
        return self.overlay.state(), answers

    def load(self, state: Mapping[str, np.ndarray], answers: Mapping[str, Any]) -> None:
        """Replace the overlay with a snapshot's (an empty state leaves none)."""
        if self.store.overlay is not None:
            self.store.overlay.close()
            self.store.overlay = None
        if "compaction" in state:  # a compacted overlay: its CSC and ID maps
            with self.store.lock.write():
                params = self.params()
                compacted = CompactedOverlay.from_state(self.label, params, self.sharing, state, answers)
                load_row_data(self.store, compacted, state)  # its rows of new IDs, by slot
                self.store.overlay = compacted
            self.store.catalog_changed()
            return
        overlay = self._made()
        with self.store.lock.write():
            overlay.load(state, answers, self.store.indptr)
            load_row_data(self.store, overlay, state)


def _sample_csc(
    indptr: np.ndarray,
    indices: np.ndarray,
    eids: np.ndarray,
    local: np.ndarray,
    seeds: np.ndarray,
    fanout: int,
    replace: bool,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sample_partition`` over a CSC of the caller's (the same kernels, the same answers)."""
    global_seeds = np.asarray(seeds, dtype=np.int64)
    if (
        not replace
        and type(fanout) is int
        and 0 < fanout <= FLOYD_MAX_FANOUT
        and all(type(a) is np.ndarray and a.dtype == np.int64 for a in (indptr, indices, eids, local))
        and compiled.ready()
    ):
        src, dst, out = compiled.uniform_edges(indptr, indices, eids, local, global_seeds, fanout, rng)
        return src, dst, out
    src, pos, out = sample_csc(indptr, indices, eids, local, fanout, replace, rng)
    return src, global_seeds[pos], out
