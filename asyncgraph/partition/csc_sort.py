"""The ``sort`` stage of the out-of-core partitioner: each part's edges into CSC, in balanced tasks.

The shuffle spills a part's records grouped by *destination range* (``Ctx.ranges`` equal-width
node ranges per part) and saves, per task, the record count of every (block, part, range) in
``spill/<task>.counts.npy``. :func:`plan_sort` cuts each part into groups of consecutive ranges
of at most a target number of edges; :func:`sort_range` reads a group's records (one
contiguous run per spill block), sorts them by (dst, src, edge ID) and writes its slice of the
part's ``indptr``/``indices``/``eids`` and of its edge-ID map at offsets known in advance. So a
heavy part's sort spreads over all workers and needs no merge: groups concatenate in
destination order. A group over the worker's share (a range holding a giant hub) is sorted
externally, through destination buckets on disk.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from asyncgraph.partition.tasks import REC, Ctx, IdArray, _part_of, _write_rows_at

__all__ = ["csc_block", "plan_sort", "sort_range"]

Slice = tuple[int, int, int]  # (shuffle task, first record in its spill file, records)


def _bits(x: int) -> int:
    return max(1, (max(x, 1) - 1).bit_length())


def cuts_by_degree(deg: IdArray, max_edges: int, max_nodes: int) -> IdArray:
    """Node cut points: ranges of at most ``max_edges`` edges and ``max_nodes`` nodes (a node
    with more edges than ``max_edges`` forms a range of its own)."""
    cum = np.cumsum(deg)
    cuts = [0]
    while cuts[-1] < deg.size:
        a = cuts[-1]
        base = int(cum[a - 1]) if a else 0
        nxt = int(np.searchsorted(cum, base + max_edges, side="right"))
        cuts.append(min(deg.size, a + max_nodes, max(nxt, a + 1)))
    return np.asarray(cuts, dtype=np.int64)


def csc_block(rec: np.ndarray[Any, Any], n0: int, n_local: int, n: int) -> tuple[IdArray, IdArray, IdArray]:
    """Sort records (in original-edge-ID order) by (dst, src, eid): (in-degrees, src, eid).

    The sort is one ``np.sort`` of 64-bit keys ``(dst, src, rank)`` (``rank``: the record's
    position, so ties keep edge-ID order), ~80x faster than a three-key ``lexsort``. When those
    bits exceed 64 the records are first grouped by destination sub-range (a stable radix sort
    on a small int) so that each sub-range's keys fit.
    """
    k = rec.shape[0]
    deg = np.bincount(rec[:, 0] - n0, minlength=n_local)
    src_out = np.empty(k, dtype=np.int64)
    eid_out = np.empty(k, dtype=np.int64)
    if k == 0:
        return deg, src_out, eid_out
    bs = _bits(n)
    order: IdArray | None = None
    if _bits(n_local) + bs + _bits(k) <= 64:
        cuts = np.array([0, n_local], dtype=np.int64)
    else:  # sub-ranges of at most 2**rb edges and 2**db nodes (a lone hub: its own range)
        db = (64 - bs) // 2
        cuts = cuts_by_degree(deg, 1 << (64 - bs - db), 1 << db)
        order = np.argsort(_part_of(tuple((cuts + n0).tolist()), rec[:, 0]), kind="stable")
    ends = np.cumsum(np.add.reduceat(deg, cuts[:-1]))
    at = 0
    for i in range(cuts.size - 1):
        b = int(ends[i])
        if b == at:
            continue
        sub = rec[at:b] if order is None else rec[order[at:b]]
        rb = _bits(b - at)
        key = (sub[:, 0] - (n0 + cuts[i])).astype(np.uint64)
        key <<= np.uint64(bs)
        key |= sub[:, 1].astype(np.uint64)
        key <<= np.uint64(rb)
        key |= np.arange(b - at, dtype=np.uint64)
        key.sort()
        rank = (key & np.uint64((1 << rb) - 1)).view(np.int64)
        eid_out[at:b] = np.take(sub[:, 2], rank)
        del sub, rank
        key >>= np.uint64(rb)
        key &= np.uint64((1 << bs) - 1)
        src_out[at:b] = key.view(np.int64)
        at = b
    return deg, src_out, eid_out


def load_counts(ctx: Ctx, tasks: int) -> list[IdArray]:
    """Every shuffle task's record counts, ``(blocks, parts, ranges)`` each."""
    return [np.load(ctx.work / "spill" / f"{t}.counts.npy") for t in range(tasks)]


def part_sizes(counts: list[IdArray], num_parts: int) -> list[int]:
    """Records spilled for each part."""
    tot = sum((c.sum(axis=(0, 2)) for c in counts), np.zeros(num_parts, dtype=np.int64))
    return [int(x) for x in tot]


def plan_sort(ctx: Ctx, counts: list[IdArray], target: int) -> list[tuple[Any, ...]]:
    """``sort_range`` tasks: per part, consecutive destination ranges of ~``target`` edges,
    largest first (no lone tail)."""
    nr = ctx.ranges
    # groups small enough that (dst, src, rank) keys fit 64 bits: one np.sort per group
    target = max(1, min(target, 1 << 23))
    max_nodes = 1 << max(1, 64 - _bits(int(ctx.graph.node_offsets()[-1])) - _bits(target))
    out: list[tuple[Any, ...]] = []
    for p in range(ctx.num_parts):
        nodes = ctx.node_bounds[p + 1] - ctx.node_bounds[p]
        width = ctx.range_width(p)
        per_range = sum((c[:, p, :].sum(axis=0) for c in counts), np.zeros(nr, dtype=np.int64))
        # (task, block) -> the first record of each range in that task's spill file of part p
        starts = []
        for t, c in enumerate(counts):
            blk = c[:, p, :]
            flat = np.concatenate([[0], np.cumsum(blk.reshape(-1))])[:-1].reshape(blk.shape)
            starts.append((t, blk, flat))
        r0, e_off = 0, 0
        while r0 < nr and r0 * width < max(nodes, 1):
            r1, k = r0 + 1, int(per_range[r0])
            while (r1 < nr and r1 * width < nodes and k + int(per_range[r1]) <= target
                   and (r1 + 1 - r0) * width <= max_nodes):  # fmt: skip
                k += int(per_range[r1])
                r1 += 1
            slices = [(t, int(flat[j, r0]), int(blk[j, r0:r1].sum()))
                      for t, blk, flat in starts for j in range(blk.shape[0])
                      if blk[j, r0:r1].any()]  # fmt: skip
            lo, hi = r0 * width, min(nodes, r1 * width)
            out.append((ctx, p, lo, hi, e_off, slices))
            e_off += k
            r0 = r1
    out.sort(key=lambda a: -sum(s[2] for s in a[5]))
    return out


def _read_slices(ctx: Ctx, p: int, slices: list[Slice], rows: int) -> Any:
    """The records of ``slices`` in order, in pieces of at most ``rows`` records."""
    for t, first, count in slices:
        path = ctx.spill_dir(p) / f"{t}.bin"
        for a in range(0, count, rows):
            k = min(rows, count - a)
            at = (first + a) * ctx.rec_bytes
            yield np.fromfile(path, dtype=ctx.rec_dtype, count=k * REC, offset=at).reshape(k, REC)


def sort_range(ctx: Ctx, p: int, lo: int, hi: int, e_off: int, slices: list[Slice],
               cap_edges: int) -> tuple[int, int]:  # fmt: skip
    """Sort part ``p``'s edges into local destinations ``[lo, hi)``; write them at ``e_off``."""
    n = int(ctx.graph.node_offsets()[-1])
    n0 = ctx.node_bounds[p] + lo
    e0 = ctx.edge_bounds[p]
    k = sum(s[2] for s in slices)
    d = ctx.pdir(p)
    if k <= cap_edges:
        rec = np.empty((k, REC), dtype=ctx.rec_dtype)
        at = 0
        for t, first, count in slices:
            with open(ctx.spill_dir(p) / f"{t}.bin", "rb") as f:
                f.seek(first * ctx.rec_bytes)
                f.readinto(memoryview(rec[at : at + count].reshape(-1)).cast("B"))  # type: ignore[arg-type]
            at += count
        deg, src, eid = csc_block(rec, n0, hi - lo, n)
        del rec
        _write_rows_at(d / "indices.npy", e_off, src)
        _write_rows_at(ctx.oeids_file, e0 + e_off, eid)
        del src, eid
    else:
        deg = _sort_external(ctx, p, lo, hi, e_off, slices, cap_edges, n)
    indptr = np.cumsum(deg)
    indptr += e_off
    if hi > lo:
        _write_rows_at(d / "indptr.npy", lo + 1, indptr)
    step = 1 << 22
    for a in range(e_off, e_off + k, step):
        _write_rows_at(d / "eids.npy", a, np.arange(e0 + a, e0 + min(e_off + k, a + step), dtype=np.int64))
    return k * ctx.rec_bytes, k * 24 + (hi - lo) * 8


def _sort_external(ctx: Ctx, p: int, lo: int, hi: int, e_off: int, slices: list[Slice], cap: int,
                   n: int) -> IdArray:  # fmt: skip
    """A group over ``cap`` edges: split into destination buckets on disk, sort each in turn."""
    n0 = ctx.node_bounds[p] + lo
    deg = np.zeros(hi - lo, dtype=np.int64)
    for rec in _read_slices(ctx, p, slices, cap):
        deg += np.bincount(rec[:, 0] - n0, minlength=hi - lo)
    cuts = cuts_by_degree(deg, cap, deg.size)
    bdir = ctx.work / "buckets" / f"p{p}.{lo}"
    bdir.mkdir(parents=True, exist_ok=True)
    bounds = tuple((cuts + n0).tolist())
    handles = [open(bdir / f"{i}.bin", "wb") for i in range(cuts.size - 1)]  # noqa: SIM115
    try:
        for rec in _read_slices(ctx, p, slices, cap):
            b = _part_of(bounds, rec[:, 0])
            counts = np.bincount(b, minlength=len(handles))
            rec = rec[np.argsort(b, kind="stable")]
            start = 0
            for i in np.flatnonzero(counts).tolist():
                rec[start : start + counts[i]].tofile(handles[i])
                start += int(counts[i])
    finally:
        for h in handles:
            h.close()
    at = e_off
    for i in range(cuts.size - 1):
        path = bdir / f"{i}.bin"
        rec = np.fromfile(path, dtype=ctx.rec_dtype).reshape(-1, REC)
        os.unlink(path)
        _, src, eid = csc_block(rec, bounds[i], bounds[i + 1] - bounds[i], n)
        _write_rows_at(ctx.pdir(p) / "indices.npy", at, src)
        _write_rows_at(ctx.oeids_file, ctx.edge_bounds[p] + at, eid)
        at += rec.shape[0]
    return deg
