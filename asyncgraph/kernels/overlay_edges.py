"""``sample_edges`` over a live graph's base + overlay (issue 35): in- or out-edges, weighted by
an edge tensor (``prob``), never picking ``exclude``, with or without replacement.

Candidates are numbered in one space: base CSC positions ``0..E-1`` (those not removed), then
``E + k`` for the live appended edge in slot ``k``. Each candidate's seed, edge ID, weight and
endpoints come from the base arrays or the overlay's, all vectorised (no loop per node or
edge); the draw is :func:`asyncgraph.kernels.edge_queries.choose`'s, so the answer has the
shape the client merges (``merge_samples``) and a server equals a standalone process. A new
edge with no row of ``prob`` weighs 0 (its row reads zeros), as in DGL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError
from asyncgraph.kernels.edge_queries import OutIndex, _candidates, choose
from asyncgraph.names import edge_key
from asyncgraph.storage.overlay import new_edge_ids

if TYPE_CHECKING:
    from asyncgraph.storage.overlay import Overlay
    from asyncgraph.storage.store import PartitionStore

__all__ = ["sample_edges_live"]

IdArray = np.ndarray


def _in_candidates(store: PartitionStore, overlay: Overlay, seeds: IdArray) -> tuple[IdArray, IdArray]:
    indptr = np.asarray(store.indptr)
    local = overlay.local_nodes(seeds)  # OutOfRangeError: not ours, or no such node
    base = np.minimum(local, overlay.num_local_nodes - 1) if overlay.num_local_nodes else local
    counts = np.where(local < overlay.num_local_nodes, indptr[base + 1] - indptr[base], 0)
    seg, j = _candidates(np.where(local < overlay.num_local_nodes, indptr[base], 0), counts)
    ap = overlay.add_indptr
    aseg, apos = _candidates(ap[local], ap[local + 1] - ap[local])
    slots = overlay.add_order[apos]
    return np.concatenate([seg, aseg]), np.concatenate([j, overlay.num_base_edges + slots])


def _out_candidates(
    store: PartitionStore, overlay: Overlay, out_index: OutIndex, seeds: IdArray
) -> tuple[IdArray, IdArray]:
    n_base = store.book.num_nodes
    base = seeds < n_base
    safe = np.where(base, seeds, 0)
    ptr = out_index.ptr
    seg, pos = _candidates(ptr[safe], np.where(base, ptr[safe + 1] - ptr[safe], 0))
    j = out_index.order[pos]
    # appended edges by source: every seed position whose ID is the edge's source
    n = overlay.added
    slots = np.flatnonzero(np.isin(overlay.add_src[:n], seeds))
    order = np.argsort(seeds, kind="stable")
    sorted_seeds = seeds[order]
    src = overlay.add_src[slots]
    lo = np.searchsorted(sorted_seeds, src, side="left")
    hi = np.searchsorted(sorted_seeds, src, side="right")
    which, at = _candidates(lo, hi - lo)
    aseg = order[at]
    return np.concatenate([seg, aseg]), np.concatenate([j, overlay.num_base_edges + slots[which]])


def _weights(store: PartitionStore, overlay: Overlay, prob: str | None, j: IdArray) -> np.ndarray | None:
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
    nb = overlay.num_base_edges
    w = np.zeros(j.size, np.float64)
    base = j < nb
    w[base] = rows[j[base]]
    area = overlay.data_rows(key, "edge", (), rows.dtype)
    if area is not None:
        w[~base] = area[j[~base] - nb]
    if w.size and (not np.isfinite(w).all() or float(w.min()) < 0):
        raise InvalidRequestError(f"prob: edge tensor {prob!r} holds negative or non-finite weights")
    return w


def sample_edges_live(
    store: PartitionStore,
    overlay: Overlay,
    out_index: OutIndex | None,
    seeds: np.ndarray,
    fanout: int,
    *,
    edge_dir: str,
    replace: bool,
    seed: int | None,
    prob: str | None,
    exclude: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """``edge_queries.sample_edges``'s answer over base + overlay (caller holds the read lock)."""
    if isinstance(fanout, bool) or int(fanout) < -1:
        raise InvalidRequestError(f"fanout must be -1 (all edges) or >= 0, got {fanout}")
    if replace and fanout < 0:
        raise InvalidRequestError("replace=True needs a fanout >= 0")
    gseeds = as_id_array(seeds, "seeds")
    if edge_dir == "in":
        seg, j = _in_candidates(store, overlay, gseeds)
    elif edge_dir == "out" and out_index is not None:
        if gseeds.size and int(gseeds.min()) < 0:
            raise OutOfRangeError(f"node ID {int(gseeds.min())} is negative")
        seg, j = _out_candidates(store, overlay, out_index, gseeds)
    else:
        raise InvalidRequestError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
    nb = overlay.num_base_edges
    base = j < nb
    live = np.where(
        base, overlay.dead[np.where(base, j, 0)] == 0, overlay.add_dead[np.where(base, 0, j - nb)] == 0
    )
    order = np.argsort(seg[live], kind="stable")  # by seed; base before appended within one
    seg, j = seg[live][order], j[live][order]
    base = j < nb
    eids = np.empty(j.size, np.int64)
    eids[base] = np.asarray(store.eids)[j[base]]
    eids[~base] = new_edge_ids(overlay.edge_base, overlay.part_id, overlay.num_parts, j[~base] - nb)
    if exclude is not None and exclude.size:
        keep = ~np.isin(eids, as_id_array(exclude, "exclude"))
        seg, j, eids = seg[keep], j[keep], eids[keep]
    w = _weights(store, overlay, prob, j)
    if w is not None:
        keep = w > 0
        seg, j, eids, w = seg[keep], j[keep], eids[keep], w[keep]
    seg, pick, keys, totals = choose(store.part_id, seg, w, int(fanout), replace, seed, gseeds.size)
    j, eids = j[pick], eids[pick]
    base = j < nb
    indptr = np.asarray(store.indptr)
    src = np.empty(j.size, np.int64)
    dst = np.empty(j.size, np.int64)
    src[base] = np.asarray(store.indices)[j[base]]
    dst[base] = np.searchsorted(indptr, j[base], side="right") - 1 + overlay.node_start
    slots = j[~base] - nb
    src[~base] = overlay.add_src[slots]
    dst[~base] = overlay.global_nodes(overlay.add_dst[slots])
    return {"src": src, "dst": dst, "eids": eids, "seed_pos": seg, "keys": keys, "totals": totals}
