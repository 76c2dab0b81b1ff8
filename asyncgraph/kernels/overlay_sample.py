"""Reads of a live partition, base CSC + overlay (``storage/overlay.py``), in numba kernels.

A seed's live in-edges are its base positions whose ``dead`` byte is 0, then its live appended
edges (in slot order). A row with no tombstones (``dead_deg`` 0, most rows) is read in place:
its ``t``-th candidate is arithmetic, so sampling it costs ``fanout`` steps like the static
kernel; only rows with removed edges copy their live candidates first. Uniform sampling draws
numpy's uniforms from the request's keyed generator (``keyed_rng(seed, part)``), so a served
and a standalone partition holding the same overlay return the same sample. Without
replacement it runs Floyd's algorithm over the live candidates (as the base kernel does over a
CSC row); with replacement ``fanout`` independent picks; ``fanout = -1`` (or a live degree
within the fanout) every live edge. The caller holds the store's read lock. Without numba
(``ASYNCGRAPH_NO_JIT``) the same functions run as Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from asyncgraph.kernels.jit import disabled
from asyncgraph.storage.overlay import INDEX_SHIFT, MAPPED, Overlay

__all__ = ["live_degrees", "sample_live", "warm_up"]


def _jit(fn: Callable[..., Any], inline: Literal["never", "always"] = "never") -> Callable[..., Any]:
    if disabled():
        return fn
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return fn
    compiled: Callable[..., Any] = numba.njit(cache=True, nogil=True, inline=inline)(fn)
    return compiled


def _inlined(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A small helper compiled into its callers (no call per candidate)."""
    return _jit(fn, inline="always")


@_inlined
def _add_start(add_block: np.ndarray, add_indptr: np.ndarray, v: int) -> int:  # pragma: no cover - compiled
    """Where node ``v``'s appended in-edges start in ``add_order`` (two-level offsets)."""
    return int(add_block[v >> INDEX_SHIFT] + add_indptr[v])


@_jit
def _live_counts(
    indptr: np.ndarray,
    dead_deg: np.ndarray,
    touched: np.ndarray,
    add_block: np.ndarray,
    add_indptr: np.ndarray,
    local: np.ndarray,
) -> np.ndarray:  # pragma: no cover - compiled
    out = np.empty(local.size, np.int64)
    rows = indptr.size - 1  # an added node past them: no base edges
    for i in range(local.size):
        v = local[i]
        d = 0
        if v < rows:
            d = indptr[v + 1] - indptr[v]
        if touched[v]:
            d += _add_start(add_block, add_indptr, v + 1) - _add_start(add_block, add_indptr, v) - dead_deg[v]
        out[i] = d
    return out


@_inlined
def _candidate(
    direct: bool, cand: np.ndarray, start: int, base_deg: int, add_order: np.ndarray, first: int, t: int
) -> int:  # pragma: no cover - compiled
    """The ``t``-th live candidate of a row: base position ``j`` as ``j``, appended slot ``k``
    as ``-(k + 1)``; a row without tombstones is read in place, others from ``cand``."""
    if not direct:
        return int(cand[t])
    if t < base_deg:
        return start + t
    return -(int(add_order[first + t - base_deg]) + 1)


@_jit
def _pick(
    indptr: np.ndarray,
    indices: np.ndarray,
    eids: np.ndarray,
    dead: np.ndarray,
    dead_deg: np.ndarray,
    touched: np.ndarray,
    add_block: np.ndarray,
    add_indptr: np.ndarray,
    add_order: np.ndarray,
    add_src: np.ndarray,
    add_dead: np.ndarray,
    first_new: int,
    stride: int,
    local: np.ndarray,
    global_seeds: np.ndarray,
    degs: np.ndarray,
    fanout: int,
    replace: bool,
    u: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    total = 0
    widest = 0
    for i in range(local.size):
        d = degs[i]
        if touched[local[i]] and dead_deg[local[i]] > 0:
            widest = max(widest, d)
        if fanout < 0 or (not replace and d <= fanout):
            total += d
        elif d > 0:
            total += fanout
    src = np.empty(total, np.int64)
    dst = np.empty(total, np.int64)
    eid = np.empty(total, np.int64)
    cand = np.empty(widest, np.int64)  # rows with tombstones: their live candidates, copied
    chosen = np.empty(max(fanout, 0), np.int64)
    rows = indptr.size - 1
    p = 0
    r = 0  # next uniform
    for i in range(local.size):
        d = degs[i]
        if d == 0:
            continue
        v = local[i]
        start, end = (indptr[v], indptr[v + 1]) if v < rows else (0, 0)
        if touched[v] == 0:  # the base row alone (most rows): the static kernel's steps
            g = global_seeds[i]
            if fanout < 0 or (not replace and d <= fanout):
                for j in range(d):
                    src[p] = start + j
                    dst[p] = g
                    p += 1
            elif replace:
                for _ in range(fanout):
                    t = int(u[r] * d)
                    r += 1
                    src[p] = start + (t if t < d else d - 1)
                    dst[p] = g
                    p += 1
            else:
                for step in range(fanout):
                    top = d - fanout + step  # Floyd's j
                    t = int(u[r] * (top + 1))
                    r += 1
                    pick = start + (t if t <= top else top)
                    for q in range(step):
                        if chosen[q] == pick:
                            pick = start + top
                            break
                    chosen[step] = pick
                    src[p] = pick
                    dst[p] = g
                    p += 1
            continue
        first = 0
        direct = True
        if touched[v]:
            first = _add_start(add_block, add_indptr, v)
            direct = dead_deg[v] == 0
        if not direct:
            n = 0
            for j in range(start, end):
                if dead[j] == 0:
                    cand[n] = j
                    n += 1
            for q in range(first, _add_start(add_block, add_indptr, v + 1)):
                k = add_order[q]
                if add_dead[k] == 0:
                    cand[n] = -(k + 1)
                    n += 1
        base_deg = end - start
        take = d
        picked = False  # True: the edges are chosen[:take], else candidates 0..d-1
        if fanout >= 0 and replace:
            take = fanout
            picked = True
            for step in range(fanout):
                t = int(u[r] * d)
                r += 1
                if t > d - 1:  # the float rounding of u * d up to d
                    t = d - 1
                chosen[step] = _candidate(direct, cand, start, base_deg, add_order, first, t)
        elif fanout >= 0 and d > fanout:
            take = fanout
            picked = True
            for step in range(fanout):
                top = d - fanout + step  # Floyd's j
                t = int(u[r] * (top + 1))
                r += 1
                if t > top:
                    t = top
                pick = _candidate(direct, cand, start, base_deg, add_order, first, t)
                for s in range(step):
                    if chosen[s] == pick:
                        pick = _candidate(direct, cand, start, base_deg, add_order, first, top)
                        break
                chosen[step] = pick
        for step in range(take):  # the picks' codes first; ``src`` holds them until the gather
            c = chosen[step] if picked else _candidate(direct, cand, start, base_deg, add_order, first, step)
            src[p] = c
            dst[p] = global_seeds[i]
            p += 1
    # one tight gather loop: the reads of ``indices``/``eids`` are cache misses, and a short
    # loop body keeps many in flight (as the static kernel, ``compiled.edges``)
    for q in range(total):
        c = src[q]
        if c >= 0:
            src[q] = indices[c]
            eid[q] = eids[c]
        else:
            k = -c - 1
            src[q] = add_src[k]
            eid[q] = first_new + k * stride
    return src, dst, eid


def live_degrees(indptr: np.ndarray, overlay: Overlay, local: np.ndarray) -> np.ndarray:
    """Live in-degrees of owned local nodes ``local`` (int64); ``indptr``: the store's (a
    compacted overlay reads its own)."""
    out: np.ndarray = _live_counts(
        np.asarray(overlay.csc(indptr, indptr, indptr)[0], dtype=np.int64),
        overlay.dead_deg,
        overlay.touched,
        overlay.add_block,
        overlay.add_indptr,
        np.asarray(local, dtype=np.int64),
    )
    return out


def sample_live(
    indptr: np.ndarray,
    indices: np.ndarray,
    eids: np.ndarray,
    overlay: Overlay,
    local: np.ndarray,
    global_seeds: np.ndarray,
    fanout: int,
    replace: bool,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global ``(src, dst, eids)`` of a uniform sample of the live in-edges of ``local``."""
    local = np.asarray(local, dtype=np.int64)
    indptr, indices, eids = overlay.csc(indptr, indices, eids)  # a compacted overlay's own CSC
    indptr = np.asarray(indptr, dtype=np.int64)
    degs = live_degrees(indptr, overlay, local)
    fan = int(fanout)
    if fan < 0:
        draws = 0
    elif replace:
        draws = fan * int(np.count_nonzero(degs))
    else:
        draws = fan * int(np.count_nonzero(degs > fan))
    u = rng.random(draws)
    n = overlay.added
    out: tuple[np.ndarray, np.ndarray, np.ndarray] = _pick(
        indptr,
        np.asarray(indices, dtype=np.int64),
        np.asarray(eids, dtype=np.int64),
        overlay.dead,
        overlay.dead_deg,
        overlay.touched,
        overlay.add_block,
        overlay.add_indptr,
        overlay.add_order[:n],
        overlay.add_src[:n],
        overlay.add_dead[:n],
        overlay.edge_base + overlay.part_id + overlay.slot_base * overlay.num_parts,
        overlay.num_parts,
        local,
        np.asarray(global_seeds, dtype=np.int64),
        degs,
        fan,
        bool(replace),
        u,
    )
    return out


def warm_up() -> None:
    """Compile (or load from numba's cache) the live sampling kernels for the array kinds their
    readers pass (numba types read-only and writable arrays apart): read-only base and overlay
    (a co-located process's mapped views), read-only base with the owner's overlay, and both
    writable; so the first sample of a graph that became live compiles nothing under the lock
    and in front of its requests. Types, not values, pick the code: an empty overlay does."""
    if disabled():
        return
    overlay = Overlay(
        "warm-up", part_id=0, num_parts=1, node_start=0, num_local_nodes=2, edge_base=2,
        edge_start=0, num_base_edges=2, node_base=2, shared=False,
    )  # fmt: skip
    arrays = [getattr(overlay, name) for name in MAPPED]
    for base_writable, overlay_writable in ((False, False), (False, True), (True, True)):
        indptr, indices, eids = np.array([0, 1, 2]), np.array([1, 0]), np.arange(2)
        for a in (indptr, indices, eids):
            a.flags.writeable = base_writable
        for a in arrays:
            a.flags.writeable = overlay_writable
        seeds, rng = np.arange(2), np.random.default_rng(0)
        sample_live(indptr, indices, eids, overlay, seeds, seeds, 1, False, rng)
    for a in arrays:
        a.flags.writeable = True
