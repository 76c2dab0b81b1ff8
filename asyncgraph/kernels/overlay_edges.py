"""``sample_edges`` over a live graph's base + overlay (issue 35): in- or out-edges, weighted by
an edge tensor (``prob``), never picking ``exclude``, with or without replacement.

Candidates are numbered in one space: positions ``0..E-1`` of the CSC the overlay refers to
(the partition's first CSC, or the one a compaction made: ``Overlay.csc``) that are not
removed, then ``E + i`` for the live appended edge at index ``i``. Each candidate's seed, edge
ID, weight and endpoints come from that CSC or the overlay's arrays, all vectorised (no loop
per node or edge); the draw is :func:`asyncgraph.kernels.edge_queries.choose`'s, so the
answer has the shape the client merges (``merge_samples``) and a server equals a standalone
process. A new edge with no row of ``prob`` weighs 0 (its row reads zeros), as in DGL.
Out-edges read an out-index over the CSC: the base's (``OutIndex``), or a
:class:`SourceIndex` over a compacted CSC (built once per compaction by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError
from asyncgraph.kernels.edge_queries import OutIndex, choose, segment_positions
from asyncgraph.names import edge_key
from asyncgraph.storage.overlay import new_edge_ids

if TYPE_CHECKING:
    from asyncgraph.storage.overlay import Overlay
    from asyncgraph.storage.store import PartitionStore

__all__ = ["SourceIndex", "live_out_degrees", "sample_edges_live"]

IdArray = np.ndarray


@dataclass(frozen=True)
class SourceIndex:
    """A CSC's positions grouped by global source, for any source ID (added nodes' too): the
    out-index of a compacted overlay's CSC, whose sources are not bounded by the base's nodes."""

    order: IdArray  # CSC positions, by source (stable: by position within one)
    sources: IdArray  # their sources, sorted

    @classmethod
    def build(cls, indices: np.ndarray) -> SourceIndex:
        order = np.argsort(indices, kind="stable").astype(np.int64, copy=False)
        return cls(order, np.asarray(indices, dtype=np.int64)[order])

    @property
    def nbytes(self) -> int:
        return int(self.order.nbytes + self.sources.nbytes)

    def ranges(self, gids: IdArray) -> tuple[IdArray, IdArray]:
        """``(start, count)`` in ``order`` of the positions whose source is each of ``gids``."""
        lo = np.searchsorted(self.sources, gids, side="left")
        hi = np.searchsorted(self.sources, gids, side="right")
        return lo.astype(np.int64, copy=False), (hi - lo).astype(np.int64, copy=False)


def _out_ranges(index: OutIndex | SourceIndex, gids: IdArray, n_base: int) -> tuple[IdArray, IdArray]:
    """``(start, count)`` in ``index.order`` of each of ``gids``'s out-edges in the CSC."""
    if isinstance(index, SourceIndex):
        return index.ranges(gids)
    base = gids < n_base  # the base CSC holds no edge from an added node
    safe = np.where(base, gids, 0)
    ptr = index.ptr
    return ptr[safe], np.where(base, ptr[safe + 1] - ptr[safe], 0)


def live_out_degrees(
    csc: tuple[np.ndarray, ...], overlay: Overlay, index: OutIndex | SourceIndex, gids: IdArray, n_base: int
) -> IdArray:
    """This partition's share of the out-degrees of ``gids`` over its CSC + overlay: the CSC's
    count by source, less its removed edges, plus live appended edges (sorted counts and a
    search: no loop per node or edge)."""
    nb = int(np.asarray(csc[0])[-1])
    deg = _out_ranges(index, gids, n_base)[1].astype(np.int64, copy=True)
    dead = np.flatnonzero(overlay.dead[:nb])
    deg -= _counts_of(np.asarray(csc[1])[dead], gids)
    n = overlay.added
    deg += _counts_of(overlay.add_src[:n][overlay.add_dead[:n] == 0], gids)
    return deg


def _counts_of(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """How often each of ``ids`` occurs in ``values`` (sorted unique counts, then a search)."""
    if not values.size or not ids.size:
        return np.zeros(ids.size, np.int64)
    uniq, counts = np.unique(values, return_counts=True)
    pos = np.minimum(np.searchsorted(uniq, ids), uniq.size - 1)
    return np.where(uniq[pos] == ids, counts[pos], 0).astype(np.int64)


def _in_candidates(indptr: np.ndarray, overlay: Overlay, seeds: IdArray) -> tuple[IdArray, IdArray]:
    local = overlay.local_nodes(seeds)  # OutOfRangeError: not ours, or no such node
    inside = local < indptr.size - 1  # nodes added after the CSC was made have no row in it
    starts = np.zeros(local.size, np.int64)
    counts = np.zeros(local.size, np.int64)
    starts[inside] = indptr[local[inside]]
    counts[inside] = indptr[local[inside] + 1] - starts[inside]
    seg, j = segment_positions(starts, counts)
    first = overlay.add_starts(local)
    aseg, apos = segment_positions(first, overlay.add_starts(local + 1) - first)
    idx = overlay.add_order[apos]
    return np.concatenate([seg, aseg]), np.concatenate([j, int(indptr[-1]) + idx])


def _out_candidates(
    nb: int, overlay: Overlay, index: OutIndex | SourceIndex, seeds: IdArray, n_base: int
) -> tuple[IdArray, IdArray]:
    starts, counts = _out_ranges(index, seeds, n_base)
    seg, pos = segment_positions(starts, counts)
    j = index.order[pos]
    # appended edges by source: every seed position whose ID is the edge's source
    n = overlay.added
    idx = np.flatnonzero(np.isin(overlay.add_src[:n], seeds))
    order = np.argsort(seeds, kind="stable")
    sorted_seeds = seeds[order]
    src = overlay.add_src[idx]
    lo = np.searchsorted(sorted_seeds, src, side="left")
    hi = np.searchsorted(sorted_seeds, src, side="right")
    which, at = segment_positions(lo, hi - lo)
    aseg = order[at]
    return np.concatenate([seg, aseg]), np.concatenate([j, nb + idx[which]])


def _weights(store: PartitionStore, overlay: Overlay, prob: str | None, eids: IdArray) -> np.ndarray | None:
    """Each edge's weight: the tensor's row for a base edge ID, the append area's row (by global
    slot) for a new one, 0 for a new edge without a row."""
    if prob is None:
        return None
    key = edge_key(prob)
    if not store.has_tensor(key):
        raise InvalidRequestError(f"prob: no edge tensor {prob!r}")
    rows = store.local_rows(key)
    if rows.ndim != 1 or rows.dtype.kind not in "fiub":
        raise DTypeMismatchError(
            f"prob: edge tensor {prob!r} must be 1-D numbers, got {rows.dtype} {rows.shape}"
        )
    w = np.zeros(eids.size, np.float64)
    base = eids < overlay.edge_base
    w[base] = rows[eids[base] - overlay.edge_start]
    area = overlay.data_rows(key, "edge", (), rows.dtype)
    if area is not None:
        slot = (eids[~base] - overlay.edge_base) // overlay.num_parts
        held = slot < area.shape[0]
        w[np.flatnonzero(~base)[held]] = area[slot[held]]
    if w.size and (not np.isfinite(w).all() or float(w.min()) < 0):
        raise InvalidRequestError(f"prob: edge tensor {prob!r} holds negative or non-finite weights")
    return w


def sample_edges_live(
    store: PartitionStore,
    overlay: Overlay,
    out_index: OutIndex | SourceIndex | None,
    seeds: np.ndarray,
    fanout: int,
    *,
    edge_dir: str,
    replace: bool,
    seed: int | None,
    prob: str | None,
    exclude: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """``edge_queries.sample_edges``'s answer over the overlay's CSC + the overlay (caller holds
    the read lock); ``out_index``: an out-index over that CSC (``edge_dir="out"``)."""
    if isinstance(fanout, bool) or int(fanout) < -1:
        raise InvalidRequestError(f"fanout must be -1 (all edges) or >= 0, got {fanout}")
    if replace and fanout < 0:
        raise InvalidRequestError("replace=True needs a fanout >= 0")
    gseeds = as_id_array(seeds, "seeds")
    indptr, indices, csc_eids = (np.asarray(a) for a in overlay.csc(store.indptr, store.indices, store.eids))
    nb = int(indptr[-1])
    if edge_dir == "in":
        seg, j = _in_candidates(indptr, overlay, gseeds)
    elif edge_dir == "out" and out_index is not None:
        if gseeds.size and int(gseeds.min()) < 0:
            raise OutOfRangeError(f"node ID {int(gseeds.min())} is negative")
        seg, j = _out_candidates(nb, overlay, out_index, gseeds, store.book.num_nodes)
    else:
        raise InvalidRequestError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
    base = j < nb
    live = np.where(
        base, overlay.dead[np.where(base, j, 0)] == 0, overlay.add_dead[np.where(base, 0, j - nb)] == 0
    )
    order = np.argsort(seg[live], kind="stable")  # by seed; CSC before appended within one
    seg, j = seg[live][order], j[live][order]
    base = j < nb
    eids = np.empty(j.size, np.int64)
    eids[base] = csc_eids[j[base]]
    slots = overlay.slot_base + j[~base] - nb
    eids[~base] = new_edge_ids(overlay.edge_base, overlay.part_id, overlay.num_parts, slots)
    if exclude is not None and exclude.size:
        keep = ~np.isin(eids, as_id_array(exclude, "exclude"))
        seg, j, eids = seg[keep], j[keep], eids[keep]
    w = _weights(store, overlay, prob, eids)
    if w is not None:
        keep = w > 0
        seg, j, eids, w = seg[keep], j[keep], eids[keep], w[keep]
    seg, pick, keys, totals = choose(store.part_id, seg, w, int(fanout), replace, seed, gseeds.size)
    j, eids = j[pick], eids[pick]
    base = j < nb
    src = np.empty(j.size, np.int64)
    dst = np.empty(j.size, np.int64)
    src[base] = indices[j[base]]
    dst[base] = overlay.global_nodes(np.searchsorted(indptr, j[base], side="right") - 1)
    idx = j[~base] - nb
    src[~base] = overlay.add_src[idx]
    dst[~base] = overlay.global_nodes(overlay.add_dst[idx])
    return {"src": src, "dst": dst, "eids": eids, "seed_pos": seg, "keys": keys, "totals": totals}
