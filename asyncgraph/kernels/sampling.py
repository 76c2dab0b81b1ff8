"""Vectorised in-edge neighbour sampling over one partition's CSC structure (pure numpy).

A server owns the in-edges of its nodes as CSC: the in-edges of local row ``i`` are
``indices[indptr[i]:indptr[i+1]]`` (global source IDs) with global edge IDs in ``eids``. The
kernel samples, for each seed occurrence, a set of in-edge *positions* into that range and gathers
``indices``/``eids`` once at the end, so the output gather is the only pass over edge data.

Sampling without replacement takes every in-edge of a seed with ``deg <= fanout``; for the other
seeds it picks exactly ``fanout`` distinct positions in ``range(deg)`` with a cost that does not
depend on ``deg`` (a 100k-in-edge hub costs the same as a 20-in-edge node; nothing is sorted):

* ``fanout <= FLOYD_MAX_FANOUT``: Floyd's algorithm, vectorised across seeds. Step ``i`` draws
  ``t`` in ``[0, deg - fanout + i]`` for every seed at once and keeps ``deg - fanout + i`` instead
  when ``t`` was already taken; ``O(fanout**2)`` vector operations over the seeds, exact and uniform.
* larger fanouts (where ``fanout**2`` vector operations would cost too much): seeds with
  ``deg <= 4 * fanout`` give each in-edge a random key and keep the ``fanout`` smallest
  (``argpartition`` over a padded ``[seeds, max_deg]`` key matrix); hubs draw ``fanout``
  positions with replacement and redraw the duplicates in a few rounds (a collision has
  probability below ``1/4`` per draw, so the rounds shrink geometrically; the rare seed that
  still has duplicates after ``_MAX_REDRAW_ROUNDS`` rounds falls back to an exact segmented
  sort). Both are invariant under relabelling a seed's neighbours, so each ``fanout``-subset is
  equally likely.

With replacement every seed of degree > 0 gets ``fanout`` independent uniform draws.
Uniform integers in ``[0, n)`` come from ``floor(u * n)`` with 53-bit uniforms ``u`` (bias below
``n / 2**53``), which is several times faster than ``Generator.integers`` with per-element bounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError, ShapeMismatchError
from asyncgraph.kernels import compiled

__all__ = ["in_degrees", "sample_csc"]

IdArray = npt.NDArray[np.int64]

# Fanouts up to this use vectorised Floyd; larger ones use keys + top-k or redraw rounds.
FLOYD_MAX_FANOUT = 32
# For fanouts above FLOYD_MAX_FANOUT: deg <= _MID_FACTOR * fanout -> keys + top-k, else redraw.
_MID_FACTOR = 4
# Redraw rounds before the exact fallback; with collision probability <= 1/4 per draw a seed
# survives 32 rounds with probability < 4**-32, so the fallback is there for correctness only.
_MAX_REDRAW_ROUNDS = 32


def _check_index_array(arr: Any, name: str) -> npt.NDArray[np.integer[Any]]:
    """Validate a structure array: 1-D integers (no copy; callers gather then cast)."""
    a = np.asarray(arr)
    if a.dtype.kind not in "iu":
        raise DTypeMismatchError(f"{name} must be integers, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ShapeMismatchError(f"{name} must be one-dimensional, got shape {a.shape}")
    return a


def _check_seeds(indptr: npt.NDArray[np.integer[Any]], local_seeds: Any) -> IdArray:
    """Validate seeds as int64 row numbers in ``[0, n)`` where ``n = len(indptr) - 1``."""
    seeds = as_id_array(local_seeds, "local_seeds")
    n = indptr.size - 1
    if n < 0:
        raise ShapeMismatchError("indptr must have at least one entry")
    if seeds.size:
        lo, hi = int(seeds.min()), int(seeds.max())
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise OutOfRangeError(f"local seed {bad} out of range [0, {n})")
    return seeds


def _check_fanout(fanout: Any) -> int:
    """Fanout must be an integer >= -1 (-1 means all in-edges)."""
    if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)):
        raise DTypeMismatchError(f"fanout must be an integer, got {type(fanout).__name__}")
    f = int(fanout)
    if f < -1:
        raise InvalidRequestError(f"fanout must be -1 (all in-edges) or >= 0, got {f}")
    return f


def in_degrees(indptr: np.ndarray, local_seeds: np.ndarray) -> np.ndarray:
    """In-degree (int64) of each local seed row; validates like ``sample_csc``."""
    ip = _check_index_array(indptr, "indptr")
    seeds = _check_seeds(ip, local_seeds)
    return (ip[seeds + 1] - ip[seeds]).astype(np.int64, copy=False)


def _segment_ranks(counts: IdArray) -> tuple[IdArray, IdArray, IdArray]:
    """For segments of the given lengths: (segment id per slot, rank within segment, offsets)."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    seg = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    rank = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][seg]
    return seg, rank, offsets


def _uniform_below(high: IdArray, rng: np.random.Generator, shape: tuple[int, ...] | None = None) -> IdArray:
    """Uniform int64 in ``[0, high)`` (elementwise, ``high >= 1``, broadcast to ``shape``)."""
    u = rng.random(shape if shape is not None else high.shape)
    out = (u * high).astype(np.int64)
    return np.minimum(out, high - 1, out=out)  # guard the float rounding of u * high up to high


def _floyd(deg: IdArray, k: int, rng: np.random.Generator) -> IdArray:
    """Uniform k-subsets of ``range(deg[i])`` per row (all deg > k), shape ``[m, k]``, unsorted.

    Floyd's algorithm run for all rows at once: for ``j = deg-k, ..., deg-1`` draw ``t`` in
    ``[0, j]`` and add ``t``, or ``j`` if ``t`` is already in the set. Every step's draws are made
    up front (one ``[k, m]`` batch of uniforms, the same stream as drawing step by step), so a
    step is one broadcast membership test against the earlier steps' rows plus one ``copyto``:
    about ``3 k`` numpy calls in all, which is what small batches of seeds pay for. (Resolving
    all steps at once with a ``[k, k, m]`` comparison needs fewer calls but measured slower.)
    """
    m = deg.size
    top = (deg - k)[None, :] + np.arange(k, dtype=np.int64)[:, None]  # j per step
    chosen = (rng.random((k, m)) * (top + 1)).astype(np.int64)
    np.minimum(chosen, top, out=chosen)  # guard the float rounding of u * (j + 1) up to j + 1
    hit = np.empty((k, m), dtype=bool)
    for i in range(1, k):
        np.equal(chosen[:i], chosen[i], out=hit[:i])
        np.copyto(chosen[i], top[i], where=hit[:i].any(axis=0))
    return chosen.T


def _topk_padded(deg: IdArray, k: int, rng: np.random.Generator) -> IdArray:
    """Uniform k-subsets of ``range(deg[i])`` per row (all deg > k), sorted, shape ``[m, k]``.

    Random keys in a ``[m, max(deg)]`` matrix (padding keyed 2.0, never chosen), then the k
    smallest per row. Meant for rows whose degrees are within a small factor of k.
    """
    width = int(deg.max())
    keys = rng.random((deg.size, width))
    keys[np.arange(width, dtype=np.int64)[None, :] >= deg[:, None]] = 2.0
    chosen = np.argpartition(keys, k - 1, axis=1)[:, :k]  # width > k since every deg > k
    return np.sort(chosen, axis=1).astype(np.int64, copy=False)


def _topk_segmented(deg: IdArray, k: int, rng: np.random.Generator) -> IdArray:
    """Exact fallback for any degrees > k: random keys + segmented sort, ``O(sum(deg))``."""
    seg, rank, offsets = _segment_ranks(deg)
    keys = rng.random(seg.size)
    order = np.lexsort((keys, seg))  # grouped by segment, by key within it
    keep = np.zeros(seg.size, dtype=bool)
    keep[order[rank < k]] = True  # slot j of the sorted order has rank[j] within its segment
    picked = np.flatnonzero(keep)  # grouped by segment, ascending within it
    return (picked - offsets[:-1][seg[picked]]).reshape(deg.size, k)


def _sample_redraw(deg: IdArray, k: int, rng: np.random.Generator) -> IdArray:
    """Uniform k-subsets of ``range(deg[i])`` for rows with ``deg >> k``, sorted, ``[m, k]``.

    Draw k positions with replacement, then repeatedly redraw every duplicate (keeping one copy).
    """
    draws = _uniform_below(deg[:, None], rng, (deg.size, k))
    draws.sort(axis=1)
    rows = np.arange(deg.size, dtype=np.int64)  # rows (of ``draws``) that may still hold duplicates
    for _ in range(_MAX_REDRAW_ROUNDS):
        sub = draws[rows]
        dup = np.zeros(sub.shape, dtype=bool)
        dup[:, 1:] = sub[:, 1:] == sub[:, :-1]
        has_dup = dup.any(axis=1)
        if not has_dup.any():
            return draws
        rows, sub, dup = rows[has_dup], sub[has_dup], dup[has_dup]
        r_idx, c_idx = np.nonzero(dup)
        sub[r_idx, c_idx] = _uniform_below(deg[rows[r_idx]], rng)
        sub.sort(axis=1)
        draws[rows] = sub
    sub = draws[rows]
    bad = (sub[:, 1:] == sub[:, :-1]).any(axis=1)
    if bad.any():
        draws[rows[bad]] = _topk_segmented(deg[rows[bad]], k, rng)
    return draws


def _numpy_positions(
    ip: npt.NDArray[np.integer[Any]], seeds: IdArray, k: int, replace: bool, rng: np.random.Generator
) -> tuple[IdArray, IdArray]:
    """``(pos, seg)`` of ``sample_csc`` with vectorised numpy: in-edge positions and the seed
    position of each, grouped by seed in order (``k`` is -1 or > 0, seeds non-empty)."""
    starts = ip[seeds].astype(np.int64, copy=False)
    deg = ip[seeds + 1].astype(np.int64, copy=False) - starts
    if k == -1 or not replace:
        counts = deg if k == -1 else np.minimum(deg, k)
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        seg = np.repeat(np.arange(seeds.size, dtype=np.int64), counts)
        # Position of every in-edge of every seed: right for seeds that keep all their in-edges.
        pos = np.repeat(starts - offsets[:-1], counts)
        pos += np.arange(int(offsets[-1]), dtype=np.int64)
        if k != -1:
            slots = np.arange(k, dtype=np.int64)[None, :]
            if k <= FLOYD_MAX_FANOUT:
                groups = [(np.flatnonzero(deg > k), _floyd)]
            else:
                groups = [
                    (np.flatnonzero((deg > k) & (deg <= _MID_FACTOR * k)), _topk_padded),
                    (np.flatnonzero(deg > _MID_FACTOR * k), _sample_redraw),
                ]
            for rows, method in groups:
                if rows.size:
                    picked = method(deg[rows], k, rng)
                    pos[offsets[rows][:, None] + slots] = starts[rows][:, None] + picked
    else:
        rows = np.flatnonzero(deg > 0)
        seg = np.repeat(rows, k)
        pos = (starts[rows][:, None] + _uniform_below(deg[rows][:, None], rng, (rows.size, k))).ravel()

    return pos, seg


def sample_csc(
    indptr: np.ndarray,
    indices: np.ndarray,
    eids: np.ndarray,
    local_seeds: np.ndarray,
    fanout: int,
    replace: bool,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample in-edges of seeds from one partition's CSC structure.

    indptr int64 ``[n+1]`` over owned nodes, indices int64 (global src IDs), eids int64 (global
    edge IDs); local_seeds int64 row numbers into indptr (may contain duplicates; each occurrence
    is sampled independently). Returns ``(src_global, seed_pos, eids)`` where ``seed_pos[k]`` is
    the position in local_seeds of edge k's destination (int64), grouped by seed position in
    order.

    ``fanout == -1`` takes every in-edge (``replace`` is ignored, as in DGL), ``fanout == 0``
    nothing. Without replacement a seed with in-degree ``<= fanout`` keeps all its in-edges,
    others get a uniform subset of exactly ``fanout`` distinct in-edges; with replacement every
    seed of degree > 0 gets exactly ``fanout`` independent uniform draws. Same ``rng`` state,
    same result. Raises ``DTypeMismatchError`` (non-integer arrays or fanout),
    ``OutOfRangeError`` (seed outside ``[0, n)``), ``ShapeMismatchError`` (inconsistent arrays),
    ``InvalidRequestError`` (fanout < -1).
    """
    ip = _check_index_array(indptr, "indptr")
    ind = _check_index_array(indices, "indices")
    eid = _check_index_array(eids, "eids")
    seeds = _check_seeds(ip, local_seeds)
    k = _check_fanout(fanout)
    if ind.size != eid.size:
        raise ShapeMismatchError(f"indices ({ind.size}) and eids ({eid.size}) differ in length")
    if int(ip[-1]) > ind.size:
        raise ShapeMismatchError(f"indptr ends at {int(ip[-1])} but there are {ind.size} edges")
    if not isinstance(rng, np.random.Generator):
        raise InvalidRequestError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")

    empty = np.empty(0, dtype=np.int64)
    if seeds.size == 0 or k == 0:
        return empty, empty.copy(), empty.copy()

    if not replace and 0 < k <= FLOYD_MAX_FANOUT and compiled.ready():
        # Two compiled passes giving the numpy path's exact output (see compiled.py).
        ip64 = ip if ip.dtype == np.int64 else ip.astype(np.int64)
        pos, seg = compiled.uniform_positions(ip64, seeds, k, rng)
    else:
        pos, seg = _numpy_positions(ip, seeds, k, replace, rng)

    src = ind[pos].astype(np.int64, copy=False)
    out_eids = eid[pos].astype(np.int64, copy=False)
    return src, seg, out_eids
