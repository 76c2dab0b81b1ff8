"""Degree queries and option-rich edge sampling over one partition's store (pure numpy).

A partition holds the in-edges of its nodes (CSC by destination owner), so in-degrees and
in-edge sampling are answered by the owner alone, while out-degrees and out-edge sampling need
every partition to look at its ``indices`` (global sources). ``OutIndex`` is the CSR view of
those sources (one stable argsort, built once per store and cached by the caller).

``sample_edges`` draws without replacement by exponential keys ``-log(u) / w`` (the ``fanout``
smallest per seed: uniform for ``w = 1``, Efraimidis-Spirakis weighted sampling otherwise), so
per-partition picks of one seed's out-edges merge exactly by keeping the smallest keys overall.
With replacement each seed gets ``fanout`` independent draws proportional to ``w`` and the
seed's weight total, so draws from several partitions merge exactly too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError
from asyncgraph.kernels.partition_sampling import keyed_rng
from asyncgraph.names import ETYPE, TYPE_EID, TYPED_SEP, edge_key, tensor_key
from asyncgraph.partition.typed import edge_type_key, typed_range
from asyncgraph.storage.store import PartitionStore

__all__ = [
    "OutIndex",
    "choose",
    "degrees",
    "merge_samples",
    "sample_edges",
    "segment_positions",
    "segment_topk",
]

IdArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OutIndex:
    """Local edge positions of this partition grouped by global source: CSR over all nodes."""

    ptr: IdArray  # [num_nodes + 1]
    order: IdArray  # local edge positions, sorted by source

    @classmethod
    def build(cls, store: PartitionStore) -> OutIndex:
        indices = np.asarray(store.indices)
        counts = np.bincount(indices, minlength=store.book.num_nodes)
        ptr = np.zeros(store.book.num_nodes + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        return cls(ptr, np.argsort(indices, kind="stable").astype(np.int64, copy=False))


def _check_nodes(ids: np.ndarray, num_nodes: int) -> IdArray:
    gids = as_id_array(ids)
    if gids.size and (int(gids.min()) < 0 or int(gids.max()) >= num_nodes):
        bad = int(gids.min()) if int(gids.min()) < 0 else int(gids.max())
        raise OutOfRangeError(f"node ID {bad} outside [0, {num_nodes})")
    return gids


def degrees(
    store: PartitionStore, out_index: OutIndex | None, ids: np.ndarray | None, edge_dir: str
) -> IdArray:
    """In-degrees of owned ``ids`` (all owned nodes when None) or this partition's share of the
    out-degrees of ``ids`` (of every node when None)."""
    indptr = np.asarray(store.indptr)
    if edge_dir == "in":
        local = np.arange(indptr.size - 1) if ids is None else store.book.nid2localnid(ids, store.part_id)
        deg: IdArray = (indptr[local + 1] - indptr[local]).astype(np.int64, copy=False)
        return deg
    if edge_dir != "out" or out_index is None:
        raise InvalidRequestError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
    ptr = out_index.ptr
    if ids is None:
        return np.diff(ptr)
    gids = _check_nodes(ids, store.book.num_nodes)
    return (ptr[gids + 1] - ptr[gids]).astype(np.int64, copy=False)


def segment_positions(starts: IdArray, counts: IdArray) -> tuple[IdArray, IdArray]:
    """(segment of each candidate, position in the concatenated ranges ``starts[i] + 0..counts[i]``)."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    seg = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    pos = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][seg] + starts[seg]
    return seg, pos


def segment_topk(seg: IdArray, keys: np.ndarray, k: int) -> IdArray:
    """Indices of the ``k`` smallest ``keys`` of each segment (all when ``k == -1``), by segment."""
    order = np.lexsort((keys, seg))
    if k < 0 or order.size == 0:
        return order.astype(np.int64, copy=False)
    sorted_seg = seg[order]
    first = np.searchsorted(sorted_seg, sorted_seg, side="left")
    rank = np.arange(order.size, dtype=np.int64) - first
    return order[rank < k].astype(np.int64, copy=False)


def _weights(
    store: PartitionStore, prob: str | None, local_eids: IdArray, typed: bool = False
) -> np.ndarray | None:
    if prob is None:
        return None
    key = edge_key(prob)
    if not store.has_tensor(key):
        raise InvalidRequestError(f"prob: no edge tensor {prob!r}")
    if not typed and typed_range(store.book, store.part_id, key) is not None:
        raise InvalidRequestError(f"prob: {prob!r} holds one edge type's weights: name it for that type only")
    rows = store.local_rows(key)
    if rows.ndim != 1 or rows.dtype.kind not in "fiub":
        raise DTypeMismatchError(
            f"prob: edge tensor {prob!r} must be 1-D numbers, got {rows.dtype} {rows.shape}"
        )
    w = np.asarray(rows[local_eids], dtype=np.float64)
    if w.size and (not np.isfinite(w).all() or float(w.min()) < 0):
        raise InvalidRequestError(f"prob: edge tensor {prob!r} holds negative or non-finite weights")
    return w


def _typed_weights(store: PartitionStore, probs: list[str | None], local_eids: IdArray) -> np.ndarray:
    """Each candidate's weight from its edge type's tensor (``probs[t]``; None: weight 1)."""
    key = tensor_key("edge", ETYPE)
    if not store.has_tensor(key):
        raise InvalidRequestError("etype_probs need a heterogeneous partition (no _ETYPE tensor)")
    et = np.asarray(store.local_rows(key))[local_eids]
    w = np.ones(local_eids.size, dtype=np.float64)
    for t, name in enumerate(probs):  # one pass per edge type (a handful), vectorised inside
        if name is not None:
            sel = np.flatnonzero(et == t)
            rows = local_eids[sel]
            c = store.book.canonical_etypes[t]
            if typed_range(store.book, store.part_id, edge_key(name)) is not None:
                # stored per type (``"src:rel:dst/w"``): rows by the part's per-type edge IDs
                if name.removeprefix("edge:").partition(TYPED_SEP)[0] != edge_type_key(c):
                    raise InvalidRequestError(f"prob: {name!r} is not a tensor of edge type {c}")
                type_eid = np.asarray(store.local_rows(tensor_key("edge", TYPE_EID)))[rows]
                rows = type_eid - int(store.book.etype_bounds(c)[store.part_id])
            typed = _weights(store, name, rows, typed=True)
            assert typed is not None
            w[sel] = typed
    return w


def sample_edges(
    store: PartitionStore,
    out_index: OutIndex | None,
    seeds: np.ndarray,
    fanout: int,
    *,
    edge_dir: str = "in",
    replace: bool = False,
    seed: int | None = None,
    prob: str | None = None,
    exclude: np.ndarray | None = None,
    etype_fanouts: np.ndarray | None = None,
    etype_probs: list[str | None] | None = None,
) -> dict[str, np.ndarray]:
    """Sample edges of global ``seeds`` held here: in-edges of owned seeds, or this partition's
    out-edges of any seeds. Returns global ``src``, ``dst``, ``eids``, each edge's ``seed_pos``
    (index into ``seeds``) and ``keys``; with replacement also each seed's weight ``totals``.

    With ``etype_fanouts`` (heterogeneous partitions, in-edges, no replacement) each seed keeps up
    to ``etype_fanouts[t]`` in-edges of each edge type ``t`` (-1: all), the type read from the
    partition's ``_ETYPE`` edge tensor; the result adds each edge's ``etype`` and ``type_eid``."""
    if isinstance(fanout, bool) or int(fanout) < -1:
        raise InvalidRequestError(f"fanout must be -1 (all edges) or >= 0, got {fanout}")
    if replace and fanout < 0:
        raise InvalidRequestError("replace=True needs a fanout >= 0")
    indptr = np.asarray(store.indptr)
    gseeds = as_id_array(seeds, "seeds")
    if edge_dir == "in":
        local = store.book.nid2localnid(gseeds, store.part_id)
        seg, j = segment_positions(indptr[local], indptr[local + 1] - indptr[local])
    elif edge_dir == "out" and out_index is not None:
        gseeds = _check_nodes(gseeds, store.book.num_nodes)
        ptr = out_index.ptr
        seg, pos = segment_positions(ptr[gseeds], ptr[gseeds + 1] - ptr[gseeds])
        j = out_index.order[pos]
    else:
        raise InvalidRequestError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
    eids_all = np.asarray(store.eids)
    if exclude is not None and exclude.size:
        keep = ~np.isin(eids_all[j], as_id_array(exclude, "exclude"))
        seg, j = seg[keep], j[keep]
    w = _weights(store, prob, j) if etype_probs is None else _typed_weights(store, etype_probs, j)
    if w is not None:
        keep = w > 0
        seg, j, w = seg[keep], j[keep], w[keep]
    if etype_fanouts is not None:
        rng = keyed_rng(seed, store.part_id)
        return _sample_typed(store, seg, j, w, etype_fanouts, edge_dir, replace, rng)
    seg, pick, keys, totals = choose(store.part_id, seg, w, int(fanout), replace, seed, gseeds.size)
    j = j[pick]
    src = np.asarray(store.indices)[j].astype(np.int64, copy=False)
    dst = (np.searchsorted(indptr, j, side="right") - 1 + store.node_range[0]).astype(np.int64)
    eids = eids_all[j].astype(np.int64, copy=False)
    return {"src": src, "dst": dst, "eids": eids, "seed_pos": seg, "keys": keys, "totals": totals}


def choose(
    part_id: int,
    seg: IdArray,
    w: np.ndarray | None,
    fanout: int,
    replace: bool,
    seed: int | None,
    num_seeds: int,
) -> tuple[IdArray, IdArray, np.ndarray, np.ndarray]:
    """The draw of ``sample_edges`` over candidates grouped by seed (``seg``, sorted) with
    weights ``w`` (None: uniform): ``(seg, picked candidate indices, keys, totals)``. Without
    replacement the ``fanout`` smallest Exp(1)/w keys of each seed (Efraimidis-Spirakis);
    with replacement ``fanout`` draws by weight, and each seed's weight total (to merge)."""
    rng = keyed_rng(seed, part_id)
    totals = np.zeros(0)
    if not replace:
        keys = -np.log1p(-rng.random(seg.size))  # Exp(1); log1p(-u) avoids log(0)
        if w is not None:
            keys /= w
        pick = segment_topk(seg, keys, fanout)
        return seg[pick], pick, keys[pick], totals
    weights = w if w is not None else np.ones(seg.size)
    totals = np.bincount(seg, weights=weights, minlength=num_seeds).astype(np.float64)
    nz = np.flatnonzero(totals > 0)
    if nz.size and fanout > 0:
        cum = np.cumsum(weights)
        first = np.searchsorted(seg, nz, side="left")
        last = np.searchsorted(seg, nz, side="right") - 1
        start = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0.0)
        u = start[:, None] + rng.random((nz.size, fanout)) * totals[nz][:, None]
        idx = np.searchsorted(cum, u.ravel(), side="right")
        idx = np.clip(idx, np.repeat(first, fanout), np.repeat(last, fanout)).astype(np.int64)
        return seg[idx], idx, np.zeros(idx.size), totals
    return seg[:0], np.empty(0, np.int64), np.zeros(0), totals


def _sample_typed(
    store: PartitionStore,
    seg: IdArray,
    j: IdArray,
    w: np.ndarray | None,
    etype_fanouts: np.ndarray,
    edge_dir: str,
    replace: bool,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Per-edge-type fanouts: group candidates by (seed, edge type), keep the smallest keys."""
    if edge_dir != "in" or replace:
        raise InvalidRequestError("per-edge-type fanouts need edge_dir='in' and replace=False")
    key = tensor_key("edge", ETYPE)
    if not store.has_tensor(key):
        raise InvalidRequestError("per-edge-type fanouts need a heterogeneous partition (no _ETYPE tensor)")
    fan = as_id_array(etype_fanouts, "etype_fanouts")
    et = np.asarray(store.local_rows(key))[j].astype(np.int64, copy=False)
    if et.size and int(et.max()) >= fan.size:
        raise InvalidRequestError(f"etype_fanouts has {fan.size} entries; edge type {int(et.max())} exists")
    if fan.size and int(fan.min()) < -1:
        raise InvalidRequestError(f"fanouts must be -1 (all edges) or >= 0, got {fan.tolist()}")
    keys = -np.log1p(-rng.random(j.size))
    if w is not None:
        keys /= w
    group = seg * np.int64(max(1, fan.size)) + et
    order = np.lexsort((keys, group))
    sg = group[order]
    rank = np.arange(order.size, dtype=np.int64) - np.searchsorted(sg, sg, side="left")
    k = fan[et[order]]
    pick = np.sort(order[(k < 0) | (rank < k)])  # by seed, then CSC position
    seg, j, et = seg[pick], j[pick], et[pick]
    indptr = np.asarray(store.indptr)
    tkey = tensor_key("edge", TYPE_EID)
    return {
        "src": np.asarray(store.indices)[j].astype(np.int64, copy=False),
        "dst": (np.searchsorted(indptr, j, side="right") - 1 + store.node_range[0]).astype(np.int64),
        "eids": np.asarray(store.eids)[j].astype(np.int64, copy=False),
        "seed_pos": seg,
        "etype": et,
        "type_eid": np.asarray(store.local_rows(tkey))[j].astype(np.int64, copy=False),
    }


def merge_samples(
    parts: list[dict[str, np.ndarray]], num_seeds: int, fanout: int, replace: bool, seed: int | None
) -> tuple[IdArray, IdArray, IdArray]:
    """Merge every partition's out-edge samples of the same seeds into one exact sample.

    Without replacement the ``fanout`` smallest keys per seed win; with replacement slot ``i``
    of a seed takes partition ``p``'s ``i``-th draw with probability ``totals_p / total``.
    """
    cat = {k: np.concatenate([p[k] for p in parts]) for k in ("src", "dst", "eids", "seed_pos", "keys")}
    if not replace:
        pick = segment_topk(cat["seed_pos"].astype(np.int64), cat["keys"], fanout)
        return cat["src"][pick], cat["dst"][pick], cat["eids"][pick]
    totals = np.stack([p["totals"] for p in parts]).reshape(len(parts), num_seeds)
    total = totals.sum(axis=0)
    nz = np.flatnonzero(total > 0)
    if nz.size == 0 or fanout == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    rng = np.random.default_rng(None if seed is None else [seed, 0x5EED])
    cum = np.cumsum(totals[:, nz], axis=0)  # [P, m]
    u = rng.random((nz.size, fanout)) * total[nz][:, None]
    choice = np.minimum((u[None, :, :] >= cum[:, :, None]).sum(axis=0), len(parts) - 1)  # [m, fanout]
    row = np.cumsum(totals > 0, axis=1) - 1  # each seed's row among partition p's drawn seeds
    base = np.zeros(len(parts), dtype=np.int64)
    np.cumsum([p["src"].size for p in parts[:-1]], out=base[1:])
    flat = base[choice] + row[choice, nz[:, None]] * fanout + np.arange(fanout, dtype=np.int64)[None, :]
    flat = flat.ravel()
    return cat["src"][flat], cat["dst"][flat], cat["eids"][flat]
