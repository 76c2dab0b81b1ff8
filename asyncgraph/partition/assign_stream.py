"""The ``assign`` stage of the out-of-core partitioner: node -> part, then the relabelling.

Methods: ``random`` (the same seeded balanced split as :func:`partition_graph`, from a
permutation and a small int part array), ``metis`` (the in-memory METIS path on the structure
alone: edges are read chunk by chunk, features are never loaded), ``kaminpar`` (KaMinPar,
the same structure written to a file it reads; METIS' repair passes after it), ``fennel`` (restreaming
Fennel over the edge chunks, :mod:`asyncgraph.partition.fennel`, for structure that does not
fit) and DGL's assignment files (``<ntype>.txt``, one part ID a line, any external
partitioner's output, kept as given).
The relabelling orders nodes by (part, type, ID) exactly as :func:`partition_graph` does and
writes ``orig_nids.npy`` (into the output tree) and its inverse ``new_id.npy`` (for the tasks).
"""

from __future__ import annotations

import json
import re
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.assign import _balance_in_edges, _metis_assign, _rebalance
from asyncgraph.partition.chunked import ChunkedGraph, check_ids, iter_edges, read_rows
from asyncgraph.partition.fennel import fennel_assign, random_parts
from asyncgraph.partition.graph import Graph
from asyncgraph.partition.layout import ORIG_NIDS_FILE

__all__ = ["assign_chunked"]

IdArray = np.ndarray[Any, np.dtype[np.int64]]
MASKS = ("train_mask", "val_mask", "test_mask")


def _train_categories(g: ChunkedGraph) -> IdArray | None:
    """0 train, 1 val, 2 test, 3 other per node of a homogeneous graph (None without masks)."""
    (t,) = g.ntypes
    feats = g.node_data.get(t, {})
    present = [m for m in MASKS if m in feats]
    if not present:
        return None
    cat = np.full(g.num_nodes[t], len(MASKS), dtype=np.int64)
    for code in range(len(MASKS) - 1, -1, -1):  # train wins over val over test
        for ch in feats.get(MASKS[code], []):
            mask = read_rows(ch, 0, ch.rows).astype(bool).reshape(-1)
            cat[ch.start : ch.start + ch.rows][mask] = code
    return cat


def check_assignment_meta(folder: Path, k: int) -> None:
    """``--assignment``'s ``partition_meta.json`` (DGL's ``random_partition.py`` writes one; ParMETIS
    does not) must say ``num_parts == k``: before, a 2-way assignment with ``--num-parts 4`` gave
    two empty partitions and training ran."""
    meta = folder / "partition_meta.json"
    if not meta.is_file():
        return
    if meta.stat().st_size > 1 << 20:
        raise InvalidRequestError(f"{meta}: larger than 1 MiB; not DGL's partition_meta.json")
    try:
        doc = json.loads(meta.read_bytes())
    except ValueError as exc:
        raise InvalidRequestError(f"{meta}: not JSON ({type(exc).__name__})") from None
    num = doc.get("num_parts") if isinstance(doc, dict) else None
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise InvalidRequestError(f"{meta}: num_parts is not a positive integer")
    if num != k:
        raise InvalidRequestError(f"{meta} says num_parts {num} but --num-parts is {k}: pass --num-parts "
                                  f"{num}, or the assignment of a {k}-way partitioning")  # fmt: skip


def _file_parts(g: ChunkedGraph, folder: Path, k: int) -> np.ndarray[Any, Any]:
    """Parts from DGL's partition-assignment files ``<ntype>.txt`` (checked: count and range)."""
    if not folder.is_dir():
        raise InvalidRequestError(f"--assignment {folder} is not a folder of <ntype>.txt files")
    out = []
    for t in g.ntypes:
        f = folder / f"{t}.txt"
        if not f.is_file():
            raise InvalidRequestError(f"{f}: missing assignment file for node type {t!r}")
        try:
            arr = np.loadtxt(f, dtype=np.int64, ndmin=1)
        except ValueError as exc:  # its message quotes the line: only the position is shown
            at = re.search(r"at row (\d+)", str(exc))
            where = f" (near row {at[1]})" if at else ""
            raise InvalidRequestError(f"{f}: not one integer part ID a line{where}") from None
        if arr.ndim != 1 or arr.size != g.num_nodes[t]:
            raise InvalidRequestError(
                f"{f}: holds {arr.size} part IDs but node type {t!r} has {g.num_nodes[t]} nodes"
            )
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= k):
            raise InvalidRequestError(f"{f}: part ID {int(arr.min()) if arr.min() < 0 else int(arr.max())} "
                                      f"is outside [0, {k}) (num_parts)")  # fmt: skip
        out.append(arr.astype(np.int16 if k < 2**15 else np.int64))
    top = max((int(a.max()) for a in out if a.size), default=-1)
    if top + 1 < k:  # the last parts would be empty: an assignment made for fewer parts
        raise InvalidRequestError(f"--assignment {folder}: part IDs 0..{top} ({top + 1} parts) but "
                                  f"--num-parts is {k}; the parts above {top} would be empty")  # fmt: skip
    return np.concatenate(out)


def _structure(g: ChunkedGraph, block_rows: int) -> Graph:
    """The homogeneous structure alone (src, dst), read chunk by chunk."""
    noff = g.node_offsets()
    e = int(g.edge_offsets()[-1])
    src = np.empty(e, dtype=np.int64)
    dst = np.empty(e, dtype=np.int64)
    pos = 0
    for c in g.canonical_etypes:
        st, dt = g.ntypes.index(c[0]), g.ntypes.index(c[2])
        for ch in g.edges[c]:
            for _, blk in iter_edges(ch, 0, ch.rows, block_rows, ":".join(c)):
                check_ids(blk[:, 0], g.num_nodes[c[0]], ch, f"source ({c[0]})")
                check_ids(blk[:, 1], g.num_nodes[c[2]], ch, f"destination ({c[2]})")
                k = blk.shape[0]
                np.add(blk[:, 0], noff[st], out=src[pos : pos + k])
                np.add(blk[:, 1], noff[dt], out=dst[pos : pos + k])
                pos += k
    return Graph(int(noff[-1]), src, dst)


# KaMinPar's graph at its peak, a symmetric adjacency entry (fitted on measured peaks, see
# stream.py): ~12 B as given; renumbered by decreasing degree it ran 18-36% faster but took up to
# ~12.9 B on R-MAT 2^24 (6.06 GiB of a 6 GiB limit against 4.75 GiB unordered), so the degree
# order is used only where 16 B an entry fits.
KAMINPAR_ENTRY_BYTES = 12
KAMINPAR_ORDERED_ENTRY_BYTES = 16
KAMINPAR_PRESET = "jet"  # R-MAT 4-way, 2 threads: 2^18 cut 20.5% in 3.3 s (fm 17.4%, 4.8 s; METIS 25.9%)


def _lean_symmetric_csr(g: ChunkedGraph, block_rows: int, in_deg: IdArray | None) -> tuple[IdArray, IdArray]:
    """The undirected simple CSR of :func:`symmetric_csr`, built in ~16 B an input edge.

    Keys ``u * n + v`` of both directions are written chunk by chunk straight into one array
    (no ``src``/``dst`` copies), sorted in place, de-duplicated in place piece by piece, and
    turned into ``adjncy`` in place; ``in_deg`` (if given) collects in-degrees on the way.
    """
    noff = g.node_offsets()
    n = int(noff[-1])
    keys = np.empty(2 * int(g.edge_offsets()[-1]), dtype=np.int64)
    pos = 0
    for c in g.canonical_etypes:
        st, dt = g.ntypes.index(c[0]), g.ntypes.index(c[2])
        for ch in g.edges[c]:
            for _, blk in iter_edges(ch, 0, ch.rows, block_rows, ":".join(c)):
                check_ids(blk[:, 0], g.num_nodes[c[0]], ch, f"source ({c[0]})")
                check_ids(blk[:, 1], g.num_nodes[c[2]], ch, f"destination ({c[2]})")
                src = blk[:, 0] + noff[st]
                dst = blk[:, 1] + noff[dt]
                if in_deg is not None:
                    in_deg += np.bincount(dst, minlength=n)
                keep = src != dst
                src, dst = src[keep], dst[keep]
                k = src.size
                np.multiply(src, n, out=keys[pos : pos + k])
                keys[pos : pos + k] += dst
                np.multiply(dst, n, out=keys[pos + k : pos + 2 * k])
                keys[pos + k : pos + 2 * k] += src
                pos += 2 * k
    keys = keys[:pos]
    keys.sort()
    w, last, step = 0, -1, max(1, block_rows)
    for a in range(0, pos, step):
        piece = keys[a : a + step]
        uniq = np.empty(piece.size, dtype=bool)
        uniq[0] = piece[0] != last
        np.not_equal(piece[1:], piece[:-1], out=uniq[1:])
        last = int(piece[-1])
        sel = piece[uniq]
        keys[w : w + sel.size] = sel
        w += sel.size
    adj = keys[:w]
    xadj = np.searchsorted(adj, np.arange(n + 1, dtype=np.int64) * n).astype(np.int64)
    np.remainder(adj, n, out=adj)
    return xadj, adj


def write_parhip(path: Path, xadj: IdArray, adj: IdArray, rows: int = 1 << 22,
                 order: IdArray | None = None) -> None:  # fmt: skip
    """An undirected CSR in ParHIP's binary format (version 3: no weights, 64-bit IDs),
    written piece by piece (no whole-array copies).

    ``order`` (a permutation of the nodes): node ``order[i]`` is written as node ``i``, its
    neighbours renumbered to match; pieces of ~``rows`` adjacency entries are gathered at a time.
    """
    n = xadj.size - 1
    head = np.uint64((3 + n + 1) * 8)
    if order is None:
        with open(path, "wb") as f:
            np.array([3, n, adj.size], dtype=np.uint64).tofile(f)
            for a in range(0, xadj.size, rows):
                (xadj[a : a + rows].astype(np.uint64) * np.uint64(8) + head).tofile(f)
            for a in range(0, adj.size, rows):
                adj[a : a + rows].astype(np.uint64).tofile(f)
        return
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    new_x = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.diff(xadj)[order], out=new_x[1:])
    with open(path, "wb") as f:
        np.array([3, n, adj.size], dtype=np.uint64).tofile(f)
        for a in range(0, new_x.size, rows):
            (new_x[a : a + rows].astype(np.uint64) * np.uint64(8) + head).tofile(f)
        r0 = 0
        while r0 < n:  # one piece of whole rows, ~rows entries (one row at least)
            r1 = min(n, max(r0 + 1, int(np.searchsorted(new_x, new_x[r0] + rows, side="right")) - 1))
            counts = new_x[r0 + 1 : r1 + 1] - new_x[r0:r1]
            idx = np.repeat(xadj[order[r0:r1]] - new_x[r0:r1], counts)
            idx += np.arange(new_x[r0], new_x[r1], dtype=np.int64)
            rank[adj[idx]].astype(np.uint64).tofile(f)
            r0 = r1


def _kaminpar_parts(g: ChunkedGraph, k: int, cats: IdArray | None, balance_edges: bool, seed: int,
                    work: Path, block_rows: int, threads: int, compress: bool, room: int,
                    progress: bool = False) -> IdArray:  # fmt: skip
    """KaMinPar (``jet`` preset, 3% imbalance) on the symmetric structure, then the METIS repairs.

    KaMinPar's Python binding reads graphs from files only: the CSR is built lean
    (:func:`_lean_symmetric_csr`), written in ParHIP's format into the work folder and freed
    before KaMinPar loads it. ``room`` (the bytes the limit leaves KaMinPar's graph) picks the
    form on the real entry count: renumbered by decreasing degree (fastest, most memory), as
    given, or compressed (~40% less memory, ~2.4x slower at 2^20). The repair passes read the
    file back through a memory map (clean file pages: not counted against the limit), on its
    numbering, and the parts are mapped back.
    """
    import kaminpar

    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return clock[-1] - clock[-2]

    n = int(g.node_offsets()[-1])
    in_deg = np.zeros(n, dtype=np.int64) if balance_edges else None
    xadj, adj = _lean_symmetric_csr(g, min(block_rows, 1 << 21), in_deg)
    entries = int(adj.size)
    t_csr = lap()
    path = work / "structure.parhip"
    # Highest degree first: KaMinPar ran 18-21% faster with an equal or lower cut (jet, 2
    # threads: partition_bench's 2^22 graph 42.9 -> 33.8 s, R-MAT 2^20 16.0 -> 13.1 s) where
    # the limit has room for it; the plain graph where that fits on the real entry count.
    order: IdArray | None = None
    if room >= KAMINPAR_ORDERED_ENTRY_BYTES * entries:
        order = np.argsort(-np.diff(xadj), kind="stable")
        compress, how = False, "plain graph in degree order"
    else:
        compress = compress and room < KAMINPAR_ENTRY_BYTES * entries
        how = "compressed graph" if compress else "plain graph"
    write_parhip(path, xadj, adj, min(block_rows, 1 << 21), order)
    del xadj, adj
    t_write = lap()
    kaminpar.reseed(seed)
    kg = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP, compress=compress)
    t_load = lap()
    solver = kaminpar.KaMinPar(max(1, threads), kaminpar.context_by_name(KAMINPAR_PRESET))
    parts_w = np.asarray(solver.compute_partition(kg, k, 0.03), dtype=np.int64)  # written IDs
    del kg, solver
    t_part = lap()
    raw = np.memmap(path, dtype=np.uint64, mode="r")
    xadj_m = ((raw[3 : 3 + n + 1] - np.uint64((3 + n + 1) * 8)) // np.uint64(8)).astype(np.int64)
    adj_m = raw[3 + n + 1 :].view(np.int64)
    cat_w = np.zeros(n, dtype=np.int64) if cats is None else cats if order is None else cats[order]
    _rebalance(parts_w, cat_w, k, xadj_m, adj_m)  # the repairs run on the file's numbering
    if in_deg is not None:
        _balance_in_edges(parts_w, cat_w, in_deg if order is None else in_deg[order], k, xadj_m, adj_m)
    del raw, adj_m, xadj_m, cat_w
    path.unlink()
    if order is None:
        parts = parts_w
    else:
        parts = np.empty(n, dtype=np.int64)
        parts[order] = parts_w
    if progress:  # where the assign stage's time goes: KaMinPar itself or the structure around it
        print(f"kaminpar: {how}, {entries // 2:,} undirected edges; symmetric CSR {t_csr:.1f} s, ParHIP file "
              f"{t_write:.1f} s, load {t_load:.1f} s, partition {t_part:.1f} s, repairs {lap():.1f} s",
              file=sys.stderr)  # fmt: skip
    return parts


def assign_chunked(g: ChunkedGraph, num_parts: int, work: Path, opts: dict[str, Any], assignment: Any,
                   plan: Any, progress: bool) -> tuple[list[int], list[list[int]]]:  # fmt: skip
    """Assign and relabel; returns (node bounds, per-part per-type node counts)."""
    noff = g.node_offsets()
    n, num_t = int(noff[-1]), len(g.ntypes)
    hetero = not g.is_homogeneous
    ntype = np.repeat(np.arange(num_t, dtype=np.int64), np.diff(noff)) if hetero else None
    cats: IdArray | None = None
    if opts["train"] and not hetero:
        cats = _train_categories(g)
        if cats is None and progress:
            print("--balance-train: no train/val/test masks in the input; balancing node counts only",
                  file=sys.stderr)  # fmt: skip
    elif hetero:
        cats = ntype  # partition_graph evens every node type across parts
    if assignment is not None:
        parts = _file_parts(g, Path(assignment), num_parts)
        if progress and (opts["train"] or opts["edges"]):
            print("--assignment: parts are kept as given; --balance-train/--balance-edges do not apply",
                  file=sys.stderr)  # fmt: skip
    elif num_parts == 1:
        parts = np.zeros(n, dtype=np.int16)
    elif opts["method"] == "random":
        parts = random_parts(n, num_parts, int(opts["seed"]), cats)
    elif opts["method"] == "fennel":
        if progress and (opts["train"] or opts["edges"] or hetero):
            print("--method fennel balances node counts only (not categories, types or in-edges)",
                  file=sys.stderr)  # fmt: skip
        parts = fennel_assign(g, num_parts, int(opts["seed"]), plan.edge_rows)
    elif opts["method"] == "kaminpar":
        if progress:
            print(f"kaminpar: {KAMINPAR_PRESET} preset, {plan.workers} threads", file=sys.stderr)
        parts = _kaminpar_parts(g, num_parts, cats, bool(opts["edges"]), int(opts["seed"]), work,
                                plan.edge_rows, plan.workers, plan.compress, plan.kaminpar_room,
                                progress)  # fmt: skip
    else:
        graph = _structure(g, plan.edge_rows)
        parts = _metis_assign(graph, num_parts, cats, bool(opts["edges"]), int(opts["seed"]),
                              lambda name: nullcontext())  # fmt: skip
        del graph
    del cats
    small = parts.astype(np.int16 if num_parts < 2**15 else np.int64)
    del parts
    bounds = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(small, minlength=num_parts), out=bounds[1:])
    tcounts = [[int(bounds[p + 1] - bounds[p])] for p in range(num_parts)]
    if ntype is not None:
        small = small.astype(np.int64) * num_t + ntype
        del ntype
        tcounts = np.bincount(small, minlength=num_parts * num_t).reshape(num_parts, num_t).tolist()
    orig = np.argsort(small, kind="stable").astype(np.int64, copy=False)
    del small
    np.save(work / "out" / ORIG_NIDS_FILE, orig)
    new_id = np.empty(n, dtype=np.int64)
    step = 1 << 22
    for a in range(0, n, step):
        b = min(n, a + step)
        new_id[orig[a:b]] = np.arange(a, b, dtype=np.int64)
    del orig
    np.save(work / "new_id.npy", new_id)
    return bounds.tolist(), tcounts
