"""Per-edge-type sampling over a live heterogeneous partition, base + overlay (issue 35).

Every live in-edge of the seeds (``sample_edges_live`` with fanout -1: removed edges and
``exclude`` dropped, ``prob`` weights of 0 dropped) is a candidate; its relation and per-type
ID are rows of ``_ETYPE`` / ``_TYPE_EID`` read by edge ID (a new edge's rows are in the
overlay). Each seed keeps up to ``etype_fanouts[t]`` candidates of each type ``t``: the smallest
Exp(1)/weight keys from the request's keyed generator, as ``edge_queries._sample_typed`` does
over a static partition, so a served partition equals a standalone one fed the same updates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import InvalidRequestError, LiveGraphError
from asyncgraph.kernels.overlay_edges import sample_edges_live
from asyncgraph.kernels.partition_sampling import keyed_rng
from asyncgraph.names import ETYPE, TYPE_EID, edge_key, tensor_key
from asyncgraph.partition.typed import typed_range
from asyncgraph.storage.overlay_rows import rows_of

if TYPE_CHECKING:
    from asyncgraph.storage.overlay import Overlay
    from asyncgraph.storage.store import PartitionStore

__all__ = ["edge_rows", "sample_typed_live"]


def edge_rows(store: PartitionStore, overlay: Overlay, key: str, eids: np.ndarray) -> np.ndarray:
    """Rows of 1-D edge tensor ``key`` of owned live edges ``eids`` (new edges: the overlay's)."""
    acc = store.access(key)
    if acc.row_shape or acc.policy != "edge":
        raise InvalidRequestError(f"{key!r} must be a 1-D edge tensor, got rows of shape {acc.row_shape}")
    return rows_of(overlay, acc, key, eids)


def _weights(
    store: PartitionStore, overlay: Overlay, probs: list[str | None], et: np.ndarray, eids: np.ndarray
) -> np.ndarray:
    """Each candidate's weight from its type's edge tensor (``probs[t]``; None: weight 1)."""
    w = np.ones(eids.size, dtype=np.float64)
    for t, name in enumerate(probs):  # one pass per edge type (a handful), vectorised inside
        if name is None:
            continue
        key = edge_key(name)
        if typed_range(store.book, store.part_id, key) is not None:
            raise LiveGraphError(
                f"prob {name!r}: a per-type weight tensor does not cover a live graph's new edges; "
                "give the weights as an edge tensor over all edges"
            )
        sel = np.flatnonzero(et == t)
        w[sel] = edge_rows(store, overlay, key, eids[sel])
    if w.size and (not np.isfinite(w).all() or float(w.min()) < 0):
        raise InvalidRequestError("prob: the weights hold negative or non-finite values")
    return w


def sample_typed_live(
    store: PartitionStore,
    overlay: Overlay,
    seeds: np.ndarray,
    etype_fanouts: np.ndarray,
    *,
    seed: int | None,
    prob: str | None,
    etype_probs: list[str | None] | None,
    exclude: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """In-edges of owned ``seeds``, up to ``etype_fanouts[t]`` of each edge type ``t`` a seed
    (-1: all): ``src``, ``dst``, ``eids``, ``seed_pos``, ``etype``, ``type_eid`` (caller holds
    the store's read lock)."""
    fan = as_id_array(etype_fanouts, "etype_fanouts")
    if fan.size != len(store.book.canonical_etypes):
        raise InvalidRequestError(f"need one fanout per edge type ({len(store.book.canonical_etypes)})")
    if fan.size and int(fan.min()) < -1:
        raise InvalidRequestError(f"fanouts must be -1 (all edges) or >= 0, got {fan.tolist()}")
    every = sample_edges_live(
        store, overlay, None, seeds, -1, edge_dir="in", replace=False, seed=seed, prob=prob, exclude=exclude
    )
    eids, seg = every["eids"], every["seed_pos"]
    et = edge_rows(store, overlay, tensor_key("edge", ETYPE), eids).astype(np.int64)
    keys = -np.log1p(-keyed_rng(seed, store.part_id).random(eids.size))
    if etype_probs is not None:
        keys /= _weights(store, overlay, list(etype_probs), et, eids)
    elif prob is not None:
        keys /= _weights(store, overlay, [prob] * fan.size, et, eids)
    group = seg * np.int64(max(1, fan.size)) + et
    order = np.lexsort((keys, group))
    sg = group[order]
    rank = np.arange(order.size, dtype=np.int64) - np.searchsorted(sg, sg, side="left")
    k = fan[et[order]]
    pick = np.sort(order[(k < 0) | (rank < k)])  # by seed, then candidate order
    type_eid = edge_rows(store, overlay, tensor_key("edge", TYPE_EID), eids[pick]).astype(np.int64)
    return {
        "src": every["src"][pick],
        "dst": every["dst"][pick],
        "eids": eids[pick],
        "seed_pos": seg[pick],
        "etype": et[pick],
        "type_eid": type_eid,
    }
