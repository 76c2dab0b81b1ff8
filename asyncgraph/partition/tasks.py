"""The chunk tasks of the out-of-core partitioner: shuffle, sort, copy rows (run on any worker).

Every task is a top-level function of picklable arguments that reads its inputs from files and
writes its outputs to files, so the same task runs inline, on a process pool or on a Dask
worker that sees the same storage. The relabelling map (``new_id.npy``) and the edge map
(``new_eid.npy``) are read through memory maps: their clean pages are not counted against the
memory limit. Each task returns ``(bytes read, bytes written)`` for the progress bar.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.partition.chunked import ChunkedGraph, check_ids, iter_edges, read_rows

__all__ = ["Ctx", "NpyWriter", "copy_edge_rows", "copy_node_rows", "shuffle_edges", "sort_part"]

IdArray = np.ndarray[Any, np.dtype[np.int64]]
REC = 3  # a spilled edge: (new dst, new src, original edge ID), int64 each
REC_BYTES = REC * 8


@dataclass(frozen=True)
class Ctx:
    """What every task needs to know about the run (small: sent with each task)."""

    graph: ChunkedGraph
    work: Path  # the run's work folder (spill files, maps, the output tree ``out/``)
    num_parts: int
    node_bounds: tuple[int, ...]
    edge_bounds: tuple[int, ...] = ()

    @property
    def out(self) -> Path:
        return self.work / "out"

    def spill_dir(self, p: int) -> Path:
        return self.work / "spill" / f"p{p}"

    def oeids(self, p: int) -> Path:
        return self.work / "sorted" / f"oeids{p}.npy"


class NpyWriter:
    """Writes an ``.npy`` file of known shape piece by piece (the header np.save would write)."""

    def __init__(self, path: Path, dtype: Any, shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.rows = shape[0]
        self.f = open(path, "wb")  # noqa: SIM115 (closed by close())
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(self.f, header)
        self.written = 0

    def write(self, arr: np.ndarray[Any, Any]) -> None:
        np.ascontiguousarray(arr, dtype=self.dtype).tofile(self.f)
        self.written += int(arr.shape[0])

    def close(self) -> None:
        self.f.close()
        if self.written != self.rows:
            raise RuntimeError(f"{self.path}: wrote {self.written} rows of {self.rows}")


def preallocate(path: Path, dtype: Any, shape: tuple[int, ...]) -> int:
    """Create a zero-filled (sparse) ``.npy`` of ``shape``; returns the data offset."""
    w = NpyWriter(path, dtype, shape)
    offset = w.f.tell()
    w.f.truncate(offset + int(np.prod(shape, dtype=np.int64)) * w.dtype.itemsize)
    w.f.close()
    return offset


def _part_of(bounds: tuple[int, ...], ids: IdArray) -> np.ndarray[Any, Any]:
    """The range of ``bounds`` holding each ID; int16 when few, so a stable argsort is a radix sort."""
    small = np.int16 if len(bounds) < 2**15 else np.int64
    part: np.ndarray[Any, Any] = np.searchsorted(np.asarray(bounds, dtype=np.int64), ids, side="right")
    part = part.astype(small)
    part -= 1
    return part


def shuffle_edges(ctx: Ctx, r: int, ci: int, lo: int, hi: int, block_rows: int, task: int) -> tuple[int, int]:
    """Relabel rows ``[lo, hi)`` of edge chunk ``ci`` of type ``r``; spill them by destination part.

    Appends ``(new dst, new src, original edge ID)`` records to ``spill/p<p>/<task>.bin``.
    """
    g = ctx.graph
    canon = g.canonical_etypes[r]
    chunk = g.edges[canon][ci]
    noff, eoff = g.node_offsets(), g.edge_offsets()
    st, dt = g.ntypes.index(canon[0]), g.ntypes.index(canon[2])
    new_id = np.load(ctx.work / "new_id.npy", mmap_mode="r")
    files: dict[int, Any] = {}
    read = written = 0
    try:
        for row0, block in iter_edges(chunk, lo, hi, block_rows, ":".join(canon)):
            k = block.shape[0]
            read += block.nbytes
            check_ids(block[:, 0], g.num_nodes[canon[0]], chunk, f"source ({canon[0]})")
            check_ids(block[:, 1], g.num_nodes[canon[2]], chunk, f"destination ({canon[2]})")
            nd = np.take(new_id, block[:, 1] + noff[dt])
            part = _part_of(ctx.node_bounds, nd)
            order = np.argsort(part, kind="stable")  # radix sort of int16 parts
            counts = np.bincount(part, minlength=ctx.num_parts)
            del part
            rec = np.empty((k, REC), dtype=np.int64)  # built directly in part order
            np.take(nd, order, out=rec[:, 0])
            del nd
            src = np.take(block[:, 0], order)
            src += noff[st]
            np.take(new_id, src, out=rec[:, 1])
            del src, block
            np.add(order, eoff[r] + chunk.start + row0, out=rec[:, 2])
            del order
            start = 0
            for p in np.flatnonzero(counts).tolist():
                if p not in files:
                    files[p] = open(ctx.spill_dir(int(p)) / f"{task}.bin", "wb")  # noqa: SIM115
                rec[start : start + counts[p]].tofile(files[p])
                start += int(counts[p])
            written += rec.nbytes
    finally:
        for f in files.values():
            f.close()
    return read, written


def _bits(x: int) -> int:
    return max(1, (max(x, 1) - 1).bit_length())


def _csc_block(rec: IdArray, n0: int, n_local: int, n: int) -> tuple[IdArray, IdArray, IdArray]:
    """Sort records (in original-edge-ID order) by (dst, src, eid): (in-degrees, src, eid).

    The sort is one ``np.sort`` of 64-bit keys ``(dst, src, rank)`` (``rank``: the record's
    position, so ties keep edge-ID order), ~80x faster than a three-key ``lexsort``. When those
    bits exceed 64 the records are first grouped by destination sub-range (a radix sort on a
    small int, stable) so that each sub-range's keys fit.
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
        cuts = _cuts(deg, 1 << (64 - bs - db), 1 << db)
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
        np.take(sub[:, 2], rank, out=eid_out[at:b])
        del sub, rank
        key >>= np.uint64(rb)
        key &= np.uint64((1 << bs) - 1)
        src_out[at:b] = key.view(np.int64)
        at = b
    return deg, src_out, eid_out


def _cuts(deg: IdArray, max_edges: int, max_nodes: int) -> IdArray:
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


def spill_files(folder: Path) -> list[Path]:
    """A part's spill files in task order, i.e. in original edge-ID order (``<task>.bin``)."""
    return sorted(folder.glob("*.bin"), key=lambda f: int(f.stem))


def _records(files: list[Path], rows: int) -> Any:
    """Iterate the records of spill files in pieces of at most ``rows`` records."""
    for f in files:
        total = f.stat().st_size // REC_BYTES
        for a in range(0, total, rows):
            k = min(rows, total - a)
            yield np.fromfile(f, dtype=np.int64, count=k * REC, offset=a * REC_BYTES).reshape(k, REC)


def sort_part(ctx: Ctx, p: int, cap_edges: int) -> tuple[int, int]:
    """Sort partition ``p``'s spilled edges into CSC and write indptr/indices/eids and its eid map.

    When its edges exceed ``cap_edges`` they are first split by destination range into bucket
    files of at most ``cap_edges`` edges each (a destination's edges never straddle buckets),
    which are sorted one at a time and appended: an external sort whose output is the same.
    """
    g = ctx.graph
    n, e = int(g.node_offsets()[-1]), int(g.edge_offsets()[-1])
    n0, n1 = ctx.node_bounds[p], ctx.node_bounds[p + 1]
    e0, e1 = ctx.edge_bounds[p], ctx.edge_bounds[p + 1]
    files = spill_files(ctx.spill_dir(p))
    pdir = ctx.out / f"part{p}"
    rows = max(1, cap_edges)
    if e1 - e0 <= cap_edges:
        return _sort_in_memory(ctx, p, files, n, e)
    in_deg = np.zeros(n1 - n0, dtype=np.int64)
    for rec in _records(files, rows):
        in_deg += np.bincount(rec[:, 0] - n0, minlength=n1 - n0)
    # destination ranges of at most cap_edges edges each (one node may exceed it alone)
    cuts = _cuts(in_deg, cap_edges, in_deg.size).tolist()
    bdir = ctx.work / "buckets" / f"p{p}"
    bdir.mkdir(parents=True, exist_ok=True)
    bounds = np.asarray(cuts, dtype=np.int64) + n0
    handles = [open(bdir / f"{i}.bin", "wb") for i in range(len(cuts) - 1)]  # noqa: SIM115
    try:
        for rec in _records(files, rows):
            b = _part_of(tuple(int(x) for x in bounds), rec[:, 0])
            order = np.argsort(b, kind="stable")
            counts = np.bincount(b, minlength=len(handles))
            rec = rec[order]
            start = 0
            for i in np.flatnonzero(counts):
                rec[start : start + counts[i]].tofile(handles[i])
                start += int(counts[i])
    finally:
        for h in handles:
            h.close()
    buckets = [[bdir / f"{i}.bin"] for i in range(len(cuts) - 1)]
    indptr = np.zeros(n1 - n0 + 1, dtype=np.int64)
    np.cumsum(in_deg, out=indptr[1:])
    np.save(pdir / "indptr.npy", indptr)
    del indptr, in_deg
    ind = NpyWriter(pdir / "indices.npy", np.int64, (e1 - e0,))
    oe = NpyWriter(ctx.oeids(p), np.int64, (e1 - e0,))
    for bi, bucket in enumerate(buckets):
        parts = [np.fromfile(f, dtype=np.int64).reshape(-1, REC) for f in bucket]
        rec = np.concatenate(parts) if len(parts) != 1 else parts[0]
        del parts
        b0, b1 = int(bounds[bi]), int(bounds[bi + 1])
        _, src, eid = _csc_block(rec, b0, b1 - b0, n)
        del rec
        ind.write(src)
        oe.write(eid)
    ind.close()
    oe.close()
    _write_eids(pdir, e0, e1, rows)
    return (e1 - e0) * REC_BYTES, (e1 - e0) * 24 + (n1 - n0 + 1) * 8


def _write_eids(pdir: Path, e0: int, e1: int, rows: int) -> None:
    eids = NpyWriter(pdir / "eids.npy", np.int64, (e1 - e0,))
    for a in range(e0, e1, max(1, rows)):
        eids.write(np.arange(a, min(e1, a + rows), dtype=np.int64))
    eids.close()


def _sort_in_memory(ctx: Ctx, p: int, files: list[Path], n: int, e: int) -> tuple[int, int]:
    """Partition ``p``'s edges fit a worker's share: one read, one sort, in-degrees from the result."""
    n0, n1 = ctx.node_bounds[p], ctx.node_bounds[p + 1]
    e0, e1 = ctx.edge_bounds[p], ctx.edge_bounds[p + 1]
    rec = np.empty((e1 - e0, REC), dtype=np.int64)
    at = 0
    for f in files:
        k = f.stat().st_size // REC_BYTES
        with open(f, "rb") as fh:
            fh.readinto(memoryview(rec[at : at + k].reshape(-1)).cast("B"))  # type: ignore[arg-type]
        at += k
    deg, src, eid = _csc_block(rec, n0, n1 - n0, n)
    del rec
    pdir = ctx.out / f"part{p}"
    indptr = np.zeros(n1 - n0 + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    del deg
    np.save(pdir / "indptr.npy", indptr)
    np.save(pdir / "indices.npy", src)
    np.save(ctx.oeids(p), eid)
    _write_eids(pdir, e0, e1, 1 << 22)
    return (e1 - e0) * REC_BYTES, (e1 - e0) * 24 + (n1 - n0 + 1) * 8


def _write_rows_at(path: Path, start: int, rows: np.ndarray[Any, Any]) -> None:
    """Write ``rows`` (C-contiguous) at row ``start`` of an existing ``.npy``: one ``pwrite``."""
    with open(path, "r+b") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            np.lib.format.read_array_header_1_0(f)
        else:
            np.lib.format.read_array_header_2_0(f)
        row_bytes = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
        data = memoryview(rows.reshape(-1)).cast("B")  # type: ignore[arg-type]
        os.pwrite(f.fileno(), data, f.tell() + start * row_bytes)


def copy_node_rows(ctx: Ctx, key: str, name: str, ci: int, lo: int, hi: int) -> tuple[int, int]:
    """Copy rows ``[lo, hi)`` of node-data chunk ``ci`` of ``key/name`` into the parts' files.

    Nodes are ordered by (part, type, ID) in the output, so a chunk's rows of one part land in
    one contiguous run: the rows are gathered once from the memory-mapped chunk in part order
    and written with one ``pwrite`` per part.
    """
    g = ctx.graph
    chunk = g.node_data[key][name][ci]
    v0 = int(g.node_offsets()[g.ntypes.index(key)]) + chunk.start
    new = np.asarray(np.load(ctx.work / "new_id.npy", mmap_mode="r")[v0 + lo : v0 + hi])
    part = _part_of(ctx.node_bounds, new)
    order = np.argsort(part, kind="stable")
    counts = np.bincount(part, minlength=ctx.num_parts)
    src = np.load(chunk.path, mmap_mode="r")
    order += lo
    rows = np.take(src, order, axis=0)
    del src
    first = np.cumsum(counts) - counts
    for p in np.flatnonzero(counts).tolist():
        a, k = int(first[p]), int(counts[p])
        start = int(new[order[a] - lo]) - ctx.node_bounds[p]
        _write_rows_at(ctx.out / f"part{p}" / "node_feat" / f"{name}.npy", start, rows[a : a + k])
    return rows.nbytes, rows.nbytes


def copy_edge_rows(ctx: Ctx, key: int, name: str, ci: int, lo: int, hi: int) -> tuple[int, int]:
    """Copy rows ``[lo, hi)`` of edge-data chunk ``ci`` of edge type ``key`` into the parts' files.

    Edge rows land at scattered positions (CSC order), so they are written through a memory map.
    """
    g = ctx.graph
    canon = g.canonical_etypes[key]
    chunk = g.edge_data[canon][name][ci]
    rows = read_rows(chunk, lo, hi)
    e = np.arange(lo, hi, dtype=np.int64) + (int(g.edge_offsets()[key]) + chunk.start)
    new = np.asarray(np.load(ctx.work / "new_eid.npy", mmap_mode="r")[e])
    part = _part_of(ctx.edge_bounds, new)
    for p in np.unique(part).tolist():
        sel = part == p
        out = np.load(ctx.out / f"part{p}" / "edge_feat" / f"{name}.npy", mmap_mode="r+")
        out[new[sel] - ctx.edge_bounds[p]] = rows[sel]
        out.flush()
        del out
    return rows.nbytes, rows.nbytes


def map_edges(ctx: Ctx, p: int, rows: int) -> tuple[int, int]:
    """Fill ``new_eid.npy`` (original edge ID -> new edge ID) for partition ``p``'s edges."""
    e0, e1 = ctx.edge_bounds[p], ctx.edge_bounds[p + 1]
    src = np.load(ctx.oeids(p), mmap_mode="r")
    inv = np.load(ctx.work / "new_eid.npy", mmap_mode="r+")
    for a in range(0, e1 - e0, rows):
        b = min(e1 - e0, a + rows)
        inv[np.asarray(src[a:b])] = np.arange(e0 + a, e0 + b, dtype=np.int64)
    inv.flush()
    del inv
    return (e1 - e0) * 8, (e1 - e0) * 8


def write_type_tensors(ctx: Ctx, p: int, rows: int, before: list[int]) -> tuple[int, int]:
    """Heterogeneous graphs: partition ``p``'s ``_TYPE`` (edge type) and ``_TYPE_EID`` tensors.

    ``_TYPE_EID`` of an edge is its rank among the edges of its type in new-ID order, so it
    starts at ``before[r]`` (type-``r`` edges of earlier parts) and counts up within the part.
    """
    from asyncgraph.names import ETYPE, TYPE_EID

    e0, e1 = ctx.edge_bounds[p], ctx.edge_bounds[p + 1]
    eoff = ctx.graph.edge_offsets()
    num_r = eoff.size - 1
    oeids = np.load(ctx.oeids(p), mmap_mode="r")
    d = ctx.out / f"part{p}" / "edge_feat"
    et_w = NpyWriter(d / f"{ETYPE}.npy", np.int64, (e1 - e0,))
    te_w = NpyWriter(d / f"{TYPE_EID}.npy", np.int64, (e1 - e0,))
    running = np.asarray(before, dtype=np.int64).copy()
    for a in range(0, e1 - e0, rows):
        et = np.searchsorted(eoff, np.asarray(oeids[a : a + rows]), side="right").astype(np.int64) - 1
        order = np.argsort(et, kind="stable")
        counts = np.bincount(et, minlength=num_r)
        first = np.cumsum(counts) - counts
        rank = np.empty(et.size, dtype=np.int64)
        rank[order] = np.arange(et.size, dtype=np.int64) - first[et[order]]
        et_w.write(et)
        te_w.write(rank + running[et])
        running += counts
    et_w.close()
    te_w.close()
    return (e1 - e0) * 8, (e1 - e0) * 16
