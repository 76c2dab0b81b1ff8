"""The chunk tasks of the out-of-core partitioner: shuffle, sort, copy rows (on any worker, or
a part's pinned one).

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
from asyncgraph.partition.chunked_checks import native
from asyncgraph.partition.layout import ORIG_EIDS_FILE

__all__ = ["Ctx", "NpyWriter", "copy_edge_rows", "copy_node_rows", "shuffle_edges"]

IdArray = np.ndarray[Any, np.dtype[np.int64]]
REC = 3  # a spilled edge: (new dst, new src, original edge ID)
COMPACT_BELOW = 2**32  # node and edge counts below this: spill records are 3 x uint32 (12 B)
RANGES = 128  # destination ranges per part (at least): the sort stage's unit of work
RANGE_EDGES = 1 << 20  # more ranges for big parts: ~1M edges a range on average


@dataclass(frozen=True)
class Ctx:
    """What every task needs to know about the run (small: sent with each task)."""

    graph: ChunkedGraph
    work: Path  # the run's work folder (spill files, maps, the output tree ``out/``)
    num_parts: int
    node_bounds: tuple[int, ...]
    edge_bounds: tuple[int, ...] = ()
    part_build: tuple[str, ...] = ()  # per part: where its files are built ("": under out/)
    type_counts: tuple[tuple[int, ...], ...] = ()  # heterogeneous: per part, nodes of each type

    @property
    def out(self) -> Path:
        return self.work / "out"

    def pdir(self, p: int) -> Path:
        """The folder partition ``p``'s files are written to during the run."""
        if self.part_build and self.part_build[p]:
            return Path(self.part_build[p])
        return self.out / f"part{p}"

    def spill_dir(self, p: int) -> Path:
        return self.work / "spill" / f"p{p}"

    @property
    def oeids_file(self) -> Path:
        """``orig_eids.npy`` of the output: the sort tasks write each part's slice in place."""
        return self.out / ORIG_EIDS_FILE

    def oeids(self, p: int) -> np.ndarray[Any, Any]:
        """Partition ``p``'s original edge IDs in new-ID order (a read-only memory map)."""
        e0, e1 = self.edge_bounds[p], self.edge_bounds[p + 1]
        arr: np.ndarray[Any, Any] = np.load(self.oeids_file, mmap_mode="r")
        return arr[e0:e1]

    @property
    def rec_dtype(self) -> np.dtype[Any]:
        """uint32 fields (12 B a spilled edge) when every ID fits, else int64 (24 B)."""
        small = max(int(self.graph.node_offsets()[-1]), int(self.graph.edge_offsets()[-1])) < COMPACT_BELOW
        return np.dtype(np.uint32 if small else np.int64)

    @property
    def rec_bytes(self) -> int:
        return REC * self.rec_dtype.itemsize

    @property
    def ranges(self) -> int:
        """Destination ranges per part in the spill (see :mod:`asyncgraph.partition.csc_sort`)."""
        per_part = -(-int(self.graph.edge_offsets()[-1]) // (self.num_parts * RANGE_EDGES))
        return max(1, min(max(RANGES, per_part), (2**15 - 1) // self.num_parts))

    def range_width(self, p: int) -> int:
        """Nodes per destination range of part ``p``."""
        return max(1, -(-(self.node_bounds[p + 1] - self.node_bounds[p]) // self.ranges))

    def bucket_of(self, nd: IdArray) -> np.ndarray[Any, Any]:
        """``part * ranges + range`` of each new destination ID (int16 when it fits)."""
        part = _part_of(self.node_bounds, nd)
        bounds = np.asarray(self.node_bounds, dtype=np.int64)
        widths = np.asarray([self.range_width(p) for p in range(self.num_parts)], dtype=np.int64)
        local = nd - bounds[part]
        local //= widths[part]
        local += part.astype(np.int64) * self.ranges
        out: np.ndarray[Any, Any] = local.astype(part.dtype)
        return out


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

    Appends ``(new dst, new src, original edge ID)`` records to ``spill/p<p>/<task>.bin``, each
    block's records grouped by destination range (in edge-ID order within a range), and saves
    the records per (block, part, range) in ``spill/<task>.counts.npy`` for the sort stage.
    """
    g = ctx.graph
    canon = g.canonical_etypes[r]
    chunk = g.edges[canon][ci]
    noff, eoff = g.node_offsets(), g.edge_offsets()
    st, dt = g.ntypes.index(canon[0]), g.ntypes.index(canon[2])
    new_id = np.load(ctx.work / "new_id.npy", mmap_mode="r")
    files: dict[int, Any] = {}
    read = written = 0
    nr = ctx.ranges
    counts_all: list[np.ndarray[Any, Any]] = []
    try:
        for row0, block in iter_edges(chunk, lo, hi, block_rows, ":".join(canon)):
            k = block.shape[0]
            read += block.nbytes
            check_ids(block[:, 0], g.num_nodes[canon[0]], chunk, f"source ({canon[0]})")
            check_ids(block[:, 1], g.num_nodes[canon[2]], chunk, f"destination ({canon[2]})")
            nd = np.take(new_id, block[:, 1] + noff[dt])
            bucket = ctx.bucket_of(nd)  # (part, destination range)
            order = np.argsort(bucket, kind="stable")  # radix sort of int16 buckets
            fine = np.bincount(bucket, minlength=ctx.num_parts * nr).reshape(ctx.num_parts, nr)
            counts_all.append(fine)
            counts = fine.sum(axis=1)
            del bucket
            rec = np.empty((k, REC), dtype=ctx.rec_dtype)  # built directly in part order
            rec[:, 0] = np.take(nd, order)
            del nd
            src = np.take(block[:, 0], order)
            src += noff[st]
            rec[:, 1] = np.take(new_id, src)
            del src, block
            order += eoff[r] + chunk.start + row0
            rec[:, 2] = order
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
    shape = (len(counts_all), ctx.num_parts, nr)
    np.save(ctx.work / "spill" / f"{task}.counts.npy",
            np.stack(counts_all) if counts_all else np.zeros(shape, dtype=np.int64))  # fmt: skip
    return read, written


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


def copy_node_rows(ctx: Ctx, key: str, name: str, ci: int, lo: int, hi: int,
                   parts: tuple[int, ...] | None = None) -> tuple[int, int]:  # fmt: skip
    """Copy rows ``[lo, hi)`` of node-data chunk ``ci`` of ``key/name`` into the parts' files.

    Nodes are ordered by (part, type, ID) in the output, so a chunk's rows of one part land in
    one contiguous run: each part's rows are gathered from the memory-mapped chunk and written
    with one ``pwrite``. ``parts``: write only these parts' rows (``--part-worker``: one task
    per pinned part, on its worker), reading only those rows; None: every part.
    """
    g = ctx.graph
    chunk = g.node_data[key][name][ci]
    v0 = int(g.node_offsets()[g.ntypes.index(key)]) + chunk.start
    new = np.asarray(np.load(ctx.work / "new_id.npy", mmap_mode="r")[v0 + lo : v0 + hi])
    part = _part_of(ctx.node_bounds, new)
    order = np.argsort(part, kind="stable")
    counts = np.bincount(part, minlength=ctx.num_parts)
    if chunk.fmt == "numpy":  # a memory map: only the rows gathered are read
        src, base = np.load(chunk.path, mmap_mode="r"), lo
    else:  # parquet: the task's rows, decoded batch by batch
        src, base = read_rows(chunk, lo, hi), 0
    first = np.cumsum(counts) - counts
    moved = 0
    t = g.ntypes.index(key)
    for p in np.flatnonzero(counts).tolist():
        if parts is not None and p not in parts:
            continue
        a, k = int(first[p]), int(counts[p])
        rows = native(np.take(src, order[a : a + k] + base, axis=0))  # raw bytes are written: native order
        start = int(new[order[a]]) - ctx.node_bounds[p]
        path = ctx.pdir(p) / "node_feat" / f"{name}.npy"
        if not g.is_homogeneous:  # stored per type: rows of this part's nodes of the type only
            start -= sum(ctx.type_counts[p][:t])
            path = ctx.pdir(p) / "node_feat" / key / f"{name}.npy"
        _write_rows_at(path, start, rows)
        moved += rows.nbytes
    return moved, moved


def copy_edge_rows(ctx: Ctx, key: int, name: str, ci: int, lo: int, hi: int,
                   parts: tuple[int, ...] | None = None) -> tuple[int, int]:  # fmt: skip
    """Copy rows ``[lo, hi)`` of edge-data chunk ``ci`` of edge type ``key`` into the parts' files.

    Edge rows land at scattered positions (CSC order), so they are written through a memory map.
    ``parts``: write only these parts' rows (``--part-worker``); the piece is still read whole.
    """
    g = ctx.graph
    canon = g.canonical_etypes[key]
    chunk = g.edge_data[canon][name][ci]
    rows = read_rows(chunk, lo, hi)
    e = np.arange(lo, hi, dtype=np.int64) + (int(g.edge_offsets()[key]) + chunk.start)
    new = np.asarray(np.load(ctx.work / "new_eid.npy", mmap_mode="r")[e])
    part = _part_of(ctx.edge_bounds, new)
    typed = None if g.is_homogeneous else np.asarray(np.load(ctx.work / "type_row.npy", mmap_mode="r")[e])
    written = 0
    for p in np.unique(part).tolist():
        if parts is not None and p not in parts:
            continue
        sel = part == p
        if typed is None:
            out = np.load(ctx.pdir(p) / "edge_feat" / f"{name}.npy", mmap_mode="r+")
            out[new[sel] - ctx.edge_bounds[p]] = rows[sel]
        else:  # stored per type: row = the edge's rank among the part's edges of its type
            out = np.load(ctx.pdir(p) / "edge_feat" / ":".join(canon) / f"{name}.npy", mmap_mode="r+")
            out[typed[sel]] = rows[sel]
        out.flush()
        del out
        written += int(np.count_nonzero(sel)) * (rows.nbytes // max(1, rows.shape[0]))
    return rows.nbytes, written


def map_edges(ctx: Ctx, p: int, rows: int) -> tuple[int, int]:
    """Fill ``new_eid.npy`` (original edge ID -> new edge ID) for partition ``p``'s edges, and
    for a heterogeneous graph ``type_row.npy`` (-> the edge's rank among the part's edges of
    its type, in new-ID order: its row in the part's per-type edge tensors)."""
    e0, e1 = ctx.edge_bounds[p], ctx.edge_bounds[p + 1]
    src = ctx.oeids(p)
    inv = np.load(ctx.work / "new_eid.npy", mmap_mode="r+")
    hetero = not ctx.graph.is_homogeneous
    typed = np.load(ctx.work / "type_row.npy", mmap_mode="r+") if hetero else None
    eoff = ctx.graph.edge_offsets()
    running = np.zeros(eoff.size - 1, dtype=np.int64)
    for a in range(0, e1 - e0, rows):
        b = min(e1 - e0, a + rows)
        orig = np.asarray(src[a:b])
        inv[orig] = np.arange(e0 + a, e0 + b, dtype=np.int64)
        if typed is not None:
            et = np.searchsorted(eoff, orig, side="right").astype(np.int64) - 1
            order = np.argsort(et, kind="stable")
            counts = np.bincount(et, minlength=running.size)
            rank = np.empty(et.size, dtype=np.int64)
            rank[order] = np.arange(et.size, dtype=np.int64) - (np.cumsum(counts) - counts)[et[order]]
            typed[orig] = rank + running[et]
            running += counts
    inv.flush()
    del inv
    if typed is not None:
        typed.flush()
        del typed
    return (e1 - e0) * 8, (e1 - e0) * (16 if hetero else 8)


def write_type_tensors(ctx: Ctx, p: int, rows: int, before: list[int]) -> tuple[int, int]:
    """Heterogeneous graphs: partition ``p``'s ``_TYPE`` (edge type) and ``_TYPE_EID`` tensors.

    ``_TYPE_EID`` of an edge is its rank among the edges of its type in new-ID order, so it
    starts at ``before[r]`` (type-``r`` edges of earlier parts) and counts up within the part.
    """
    from asyncgraph.names import ETYPE, TYPE_EID

    e0, e1 = ctx.edge_bounds[p], ctx.edge_bounds[p + 1]
    eoff = ctx.graph.edge_offsets()
    num_r = eoff.size - 1
    oeids = ctx.oeids(p)
    d = ctx.pdir(p) / "edge_feat"
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
