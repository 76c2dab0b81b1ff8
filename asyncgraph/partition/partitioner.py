"""Offline partitioning: split a :class:`~asyncgraph.graph.Graph` into range-owned partitions.

Pipeline (all vectorised numpy, no Python loop over nodes or edges):

1. assign every node a partition (METIS on the symmetrised graph, or a balanced random split);
2. relabel nodes so partition ``p`` owns the contiguous new IDs ``[start_p, end_p)`` (stable by
   original ID inside a part);
3. give every edge to the partition of its destination and relabel edges in CSC order (by new
   destination, then new source), so partition ``p`` owns a contiguous edge-ID range and its
   ``eids`` are ``edge_start + arange``;
4. write ``<graph_name>.json`` plus ``part<p>/`` folders (layout in docs/design.md) into a
   temporary sibling folder that is renamed into place only when everything is written.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from asyncgraph.errors import InvalidRequestError
from asyncgraph.graph import Graph, to_numpy
from asyncgraph.partition.config import PartitionConfig, PartSpec, TensorSpec

logger = logging.getLogger("asyncgraph.partition")

IdArray = npt.NDArray[np.int64]
METHODS = ("metis", "random")

# Rows gathered per write when copying tensors into partition files (bounds the extra memory).
_CHUNK_BYTES = 64 << 20


class _Stages:
    """Times named stages; logs each (``extra={"stage", "seconds"}``) and prints if asked."""

    def __init__(self, progress: bool) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.progress:
            print(f"{name}…", end="", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        self.timings[name] = self.timings.get(name, 0.0) + dt
        if self.progress:
            print(f" {dt:.2f} s", file=sys.stderr, flush=True)
        logger.info("%s: %.3f s", name, dt, extra={"stage": name, "seconds": dt})


# --- validation ----------------------------------------------------------------------------------
def _check_out_path(out_path: Path, overwrite: bool) -> None:
    """Reject an out_path we must not replace (before anything is written)."""
    if out_path.exists() or out_path.is_symlink():
        if not out_path.is_dir():
            raise InvalidRequestError(f"out_path {out_path} exists and is not a directory")
        if not overwrite and any(out_path.iterdir()):
            raise InvalidRequestError(
                f"out_path {out_path} exists and is not empty; pass overwrite=True to replace it"
            )
    parent = out_path.parent
    if parent.exists() and not parent.is_dir():
        raise InvalidRequestError(f"parent of out_path {out_path} is not a directory")


def _balance_categories(balance_ntypes: Any, num_nodes: int) -> IdArray | None:
    """Validate ``balance_ntypes`` and map its values to dense categories ``0..k-1``."""
    if balance_ntypes is None:
        return None
    arr = to_numpy(balance_ntypes, "balance_ntypes")
    if arr.ndim != 1 or arr.shape[0] != num_nodes:
        raise InvalidRequestError(
            f"balance_ntypes must be one category per node: expected shape ({num_nodes},), got {arr.shape}"
        )
    if arr.dtype.kind not in "iub":
        raise InvalidRequestError(f"balance_ntypes must hold integer categories, got dtype {arr.dtype}")
    _, inverse = np.unique(arr, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64, copy=False)


# --- node assignment -----------------------------------------------------------------------------
def symmetric_csr(num_nodes: int, src: IdArray, dst: IdArray) -> tuple[IdArray, IdArray]:
    """CSR (xadj, adjncy) of the undirected simple graph: both directions, no self loops/dups."""
    n = np.int64(num_nodes)
    keep = src != dst
    s = src[keep]
    d = dst[keep]
    del keep
    keys = np.empty(2 * s.size, dtype=np.int64)
    np.multiply(s, n, out=keys[: s.size])
    keys[: s.size] += d
    np.multiply(d, n, out=keys[s.size :])
    keys[s.size :] += s
    del s, d
    keys.sort()
    if keys.size:
        uniq = np.empty(keys.size, dtype=bool)
        uniq[0] = True
        np.not_equal(keys[1:], keys[:-1], out=uniq[1:])
        keys = keys[uniq]
        del uniq
    xadj = np.searchsorted(keys, np.arange(num_nodes + 1, dtype=np.int64) * n).astype(np.int64)
    np.remainder(keys, n, out=keys)  # in place: keys becomes adjncy
    return xadj, keys


def _metis_assign(
    graph: Graph,
    num_parts: int,
    categories: IdArray | None,
    balance_edges: bool,
    seed: int,
    stage: _Stages,
) -> IdArray:
    """METIS k-way assignment (min edge cut), then node-count, category and in-degree repair.

    METIS gets no vertex weights: pymetis (2025.2) always calls METIS with ``ncon=1``, so an
    ``(n, ncon)`` multi-constraint array is read as ``n`` scrambled single weights (node ``i``
    weighing ``vw.flat[i]``), which balanced neither node counts, categories nor in-degrees and
    cost edge cut. Balance is instead enforced afterwards: :func:`_rebalance` (node counts,
    categories) and, with ``balance_edges``, :func:`_balance_in_edges` (in-edges per part).
    """
    import pymetis

    n = graph.num_nodes
    with stage("symmetrising"):
        xadj, adjncy = symmetric_csr(n, graph.src, graph.dst)
    with stage("metis"):
        opts = pymetis.Options()
        opts.seed = int(seed)
        result = pymetis.part_graph(
            num_parts,
            adjacency=pymetis.CSRAdjacency(adj_starts=xadj, adjacent=adjncy),
            # Recursive bisection up to 8 parts (METIS' advice): on power-law graphs it cut 3-4x
            # fewer edges than k-way and ran ~2x faster.
            recursive=num_parts <= 8,
            options=opts,
        )
        parts = np.asarray(result.vertex_part, dtype=np.int64)
    with stage("rebalance"):
        cats = np.zeros(n, dtype=np.int64) if categories is None else categories
        _rebalance(parts, cats, num_parts, xadj, adjncy)
    if balance_edges:
        with stage("edge balance"):
            in_deg = np.bincount(graph.dst, minlength=n).astype(np.int64, copy=False)
            _balance_in_edges(parts, cats, in_deg, num_parts, xadj, adjncy)
            del in_deg
    del xadj, adjncy
    return parts


def _move(
    parts: IdArray, score: IdArray, pool: npt.NDArray[np.bool_], src_part: int, dst_part: int, k: int
) -> int:
    """Move up to ``k`` nodes of ``pool`` from ``src_part`` to ``dst_part``, loosest-bound first."""
    cand = np.flatnonzero(pool & (parts == src_part))
    k = min(k, cand.size)
    if k > 0:
        parts[cand[np.argpartition(score[cand], k - 1)[:k]]] = dst_part
    return k


def _rebalance(parts: IdArray, categories: IdArray, num_parts: int, xadj: IdArray, adjncy: IdArray) -> None:
    """Repair METIS' balance in place: node counts to within 3%, categories to within one node.

    METIS honours each constraint only approximately: multi-constraint runs on small power-law
    graphs came out >10% off in node count, and a small category (PubMed's 60 train nodes) is
    several nodes off. First, parts over ``1.03 * mean`` nodes hand nodes of the most common
    ("filler") category to parts under the mean. Then, for every other category, a part with a
    surplus swaps its extra nodes of that category for filler nodes of a part with a deficit
    (node counts unchanged). Moved nodes are those with the fewest neighbours in their own part,
    so the edge cut barely changes. Loops run over categories and parts, never over nodes.
    """
    n = parts.size
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(xadj))
    same = parts[rows] == parts[adjncy]
    score = np.bincount(rows[same], minlength=n)  # neighbours in the node's own part
    del rows, same
    totals = np.bincount(categories)
    filler = int(np.argmax(totals))
    is_filler = categories == filler
    sizes = np.bincount(parts, minlength=num_parts)
    limit = int(np.ceil(1.03 * n / num_parts))
    floor = n // num_parts
    for p in np.flatnonzero(sizes > limit):
        for q in np.flatnonzero(sizes < floor):
            want = int(min(sizes[p] - limit, floor - sizes[q]))
            moved = _move(parts, score, is_filler, int(p), int(q), want)
            sizes[p] -= moved
            sizes[q] += moved
            if sizes[p] <= limit:
                break
    for c in range(totals.size):
        if c == filler:
            continue
        counts = np.bincount(parts[categories == c], minlength=num_parts)
        total = int(totals[c])
        target = np.full(num_parts, total // num_parts, dtype=np.int64)
        target[np.argsort(-counts, kind="stable")[: total % num_parts]] += 1  # fewest moves
        surplus = counts - target
        for p in np.flatnonzero(surplus > 0):
            for q in np.flatnonzero(surplus < 0):
                k = int(min(surplus[p], -surplus[q], np.count_nonzero(is_filler & (parts == q))))
                k = _move(parts, score, categories == c, int(p), int(q), k)
                _move(parts, score, is_filler, int(q), int(p), k)  # swap back: counts unchanged
                surplus[p] -= k
                surplus[q] += k
                if surplus[p] == 0:
                    break


# In-edge repair: out-of-band parts are brought to within this fraction of the mean in-edge count
# (the guarantee is 10%; the margin absorbs the overshoot of a step's last swap), in this many
# steps: the cut cost of a move is re-estimated between steps, so hubs that neighbour each other
# tend to move together (6 steps cut ~12% fewer edges than 1 on the synthetic graphs).
_EDGE_BAND = 0.05
_EDGE_STEPS = 6


def _balance_in_edges(
    parts: IdArray, categories: IdArray, in_deg: IdArray, num_parts: int, xadj: IdArray, adjncy: IdArray
) -> None:
    """Bring every part's in-edge count to within ``_EDGE_BAND`` of the mean, in place.

    METIS minimises the cut with no regard to degree, so on power-law graphs the densely linked
    hubs land in one part (synth17 2-way: 87% of the in-edges). Parts exchange nodes in pairs of
    the same category (node and category counts stay exactly as :func:`_rebalance` left them): a
    node of the heavy part for a lower-in-degree node of the light part. Heavy-side nodes are
    chosen by cut cost per moved in-edge (neighbours in their part minus neighbours in the target,
    over in-degree), light-side ones by lowest in-degree; pairs are taken cheapest-first until
    the in-edges to move are reached. Loops run over steps and pairs of parts, never over nodes.
    """
    mean = float(in_deg.sum()) / num_parts
    lo, hi = (1 - _EDGE_BAND) * mean, (1 + _EDGE_BAND) * mean
    load = np.bincount(parts, weights=in_deg, minlength=num_parts)
    if mean == 0 or (load.max() <= hi and load.min() >= lo):
        return
    # Final loads: clipped into the band, then evened out so they sum to the total again.
    target = np.clip(load, lo, hi)
    excess = float(target.sum() - in_deg.sum())
    room = target - mean if excess > 0 else mean - target
    np.maximum(room, 0, out=room)
    if room.sum() > 0:
        target -= np.sign(excess) * room * (abs(excess) / room.sum())
    n = parts.size
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(xadj))
    ncat = int(categories.max(initial=-1)) + 1
    small: npt.NDArray[np.integer[Any]] = parts.astype(np.int16) if num_parts < 2**15 else parts.copy()
    for step in range(_EDGE_STEPS):
        frac = 1.0 / (_EDGE_STEPS - step)
        delta = (load - target) * frac  # > 0: give this step; < 0: take
        donors = [int(p) for p in np.argsort(-delta, kind="stable") if delta[p] > 0]
        takers = [int(q) for q in np.argsort(delta, kind="stable") if delta[q] < 0]
        i = j = 0
        while i < len(donors) and j < len(takers):  # greedy transport: <= k swaps per step
            p, q = donors[i], takers[j]
            want = min(delta[p], -delta[q])
            moved = _swap_by_degree(parts, small, categories, ncat, in_deg, rows, adjncy, p, q, want)
            load[p] -= moved
            load[q] += moved
            delta[p] -= want
            delta[q] += want
            if delta[p] <= 0:
                i += 1
            if delta[q] >= 0:
                j += 1


def _swap_by_degree(
    parts: IdArray,
    small_parts: npt.NDArray[np.integer[Any]],
    categories: IdArray,
    ncat: int,
    in_deg: IdArray,
    rows: IdArray,
    adjncy: IdArray,
    p: int,
    q: int,
    want: float,
) -> int:
    """Swap same-category node pairs between parts ``p`` and ``q`` moving ~``want`` in-edges p→q.

    Returns the in-edges actually moved (at least ``want`` unless candidates run out).
    """
    n = parts.size
    nbr_part = small_parts[adjncy]  # int16 when it fits: the gather over all edges is ~3x faster
    in_p = np.bincount(rows[nbr_part == p], minlength=n)
    in_q = np.bincount(rows[nbr_part == q], minlength=n)
    del nbr_part
    s = np.flatnonzero(parts == p)
    t = np.flatnonzero(parts == q)
    cost_s = in_p[s] - in_q[s]  # symmetric edges that become cut (minus those that stop being)
    cost_t = in_q[t] - in_p[t]
    del in_p, in_q
    # Per category: heavy side cheapest per moved in-edge first, light side lowest in-degree first.
    order_s = np.lexsort((-in_deg[s], cost_s / np.maximum(in_deg[s], 1), categories[s]))
    order_t = np.lexsort((cost_t, in_deg[t], categories[t]))
    s, cost_s = s[order_s], cost_s[order_s]
    t, cost_t = t[order_t], cost_t[order_t]
    count_s = np.bincount(categories[s], minlength=ncat)
    count_t = np.bincount(categories[t], minlength=ncat)
    pairs = np.minimum(count_s, count_t)
    rank_s = np.arange(s.size) - np.repeat(np.cumsum(count_s) - count_s, count_s)
    rank_t = np.arange(t.size) - np.repeat(np.cumsum(count_t) - count_t, count_t)
    keep_s = rank_s < pairs[categories[s]]
    keep_t = rank_t < pairs[categories[t]]
    s, cost_s, t, cost_t = s[keep_s], cost_s[keep_s], t[keep_t], cost_t[keep_t]  # aligned pairs
    gain = in_deg[s] - in_deg[t]
    useful = gain > 0
    s, t, gain = s[useful], t[useful], gain[useful]
    cost = (cost_s + cost_t)[useful]
    order = np.argsort(cost / gain, kind="stable")
    moved = np.cumsum(gain[order])
    k = min(int(np.searchsorted(moved, want, side="left")) + 1, order.size)
    if k == 0:
        return 0
    chosen = order[:k]
    parts[s[chosen]] = q
    parts[t[chosen]] = p
    small_parts[s[chosen]] = q
    small_parts[t[chosen]] = p
    return int(moved[k - 1])


def _random_assign(num_nodes: int, num_parts: int, seed: int, categories: IdArray | None) -> IdArray:
    """Balanced random assignment: a seeded permutation dealt out round-robin.

    Part sizes differ by at most one; with ``categories`` the permutation is first grouped by
    category (stable), so every category is also spread evenly (within one node per part).
    """
    perm = np.random.default_rng(seed).permutation(num_nodes)
    if categories is not None:
        perm = perm[np.argsort(categories[perm], kind="stable")]
    parts = np.empty(num_nodes, dtype=np.int64)
    parts[perm] = np.arange(num_nodes, dtype=np.int64) % num_parts
    return parts


def _csc_order(num_nodes: int, new_dst: IdArray, new_src: IdArray) -> tuple[IdArray, IdArray]:
    """Edge order by (new dst, new src, original edge ID): returns (orig_eids, sorted new src).

    When ``dst | src | eid`` fit in 64 bits they are packed into one uint64 and value-sorted,
    which is several times faster than a stable ``argsort`` and needs no gather afterwards.
    """
    num_edges = int(new_dst.size)
    bits_n = max(1, (num_nodes - 1).bit_length())
    bits_e = max(1, (num_edges - 1).bit_length())
    if 2 * bits_n + bits_e <= 64:
        packed = new_dst.astype(np.uint64)
        packed <<= np.uint64(bits_n)
        packed |= new_src.astype(np.uint64, copy=False)
        packed <<= np.uint64(bits_e)
        packed |= np.arange(num_edges, dtype=np.uint64)
        packed.sort()
        orig_eids = (packed & np.uint64((1 << bits_e) - 1)).view(np.int64)
        packed >>= np.uint64(bits_e)
        packed &= np.uint64((1 << bits_n) - 1)
        return orig_eids, packed.view(np.int64)
    key = new_dst * np.int64(num_nodes)
    key += new_src
    orig = np.argsort(key, kind="stable").astype(np.int64, copy=False)
    key = key[orig]
    np.remainder(key, np.int64(num_nodes), out=key)
    return orig, key


# --- writing -------------------------------------------------------------------------------------
def _write_rows(path: Path, source: np.ndarray[Any, Any], rows: IdArray) -> None:
    """Write ``source[rows]`` to an ``.npy`` file in bounded chunks (never the whole gather)."""
    shape = (int(rows.size), *source.shape[1:])
    row_bytes = max(1, int(np.prod(source.shape[1:], dtype=np.int64)) * source.dtype.itemsize)
    chunk = max(1, _CHUNK_BYTES // row_bytes)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(source.dtype), "fortran_order": False, "shape": shape}
        )
        buf = np.empty((min(chunk, max(1, rows.size)), *source.shape[1:]), dtype=source.dtype)
        for start in range(0, rows.size, chunk):
            idx = rows[start : start + chunk]
            out = buf[: idx.size]
            np.take(source, idx, axis=0, out=out, mode="clip")  # idx validated: clip avoids buffering
            out.tofile(f)  # buf is C-contiguous, so this writes the rows in order


def _spec(arr: np.ndarray[Any, Any]) -> TensorSpec:
    """The config entry of a tensor: dtype name and row shape."""
    return TensorSpec(dtype=np.dtype(arr.dtype).name, row_shape=[int(x) for x in arr.shape[1:]])


@overload
def partition_graph(
    graph: Graph,
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = ...,
    balance_ntypes: Any = ...,
    balance_edges: bool = ...,
    return_mapping: Literal[False] = ...,
    seed: int = ...,
    overwrite: bool = ...,
    progress: bool = ...,
) -> None: ...


@overload
def partition_graph(
    graph: Graph,
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = ...,
    balance_ntypes: Any = ...,
    balance_edges: bool = ...,
    *,
    return_mapping: Literal[True],
    seed: int = ...,
    overwrite: bool = ...,
    progress: bool = ...,
) -> tuple[IdArray, IdArray]: ...


@overload
def partition_graph(
    graph: Graph,
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = ...,
    balance_ntypes: Any = ...,
    balance_edges: bool = ...,
    return_mapping: bool = ...,
    seed: int = ...,
    overwrite: bool = ...,
    progress: bool = ...,
) -> tuple[IdArray, IdArray] | None: ...


def partition_graph(
    graph: Graph,
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = "metis",
    balance_ntypes: Any = None,
    balance_edges: bool = False,
    return_mapping: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = False,
) -> tuple[IdArray, IdArray] | None:
    """Partition ``graph`` into ``num_parts`` range-owned partitions written under ``out_path``.

    ``part_method`` is ``"metis"`` (min edge cut, node counts within 3% of the mean;
    ``balance_ntypes`` categories evened to within one node per part, ``balance_edges`` in-edges
    per part to within 5% of the mean, both by repair passes after METIS) or ``"random"``
    (seeded balanced split). Each edge belongs to its destination's partition. With
    ``return_mapping`` returns ``(orig_nids, orig_eids)`` (numpy int64): ``orig_nids[new] == old``.
    Invalid arguments raise ``InvalidRequestError`` (a ``ValueError``) before anything is written;
    a failed run leaves ``out_path`` as it was.
    """
    # ---- validate everything before touching the disk ----
    if not isinstance(graph, Graph):
        raise InvalidRequestError(f"graph must be an asyncgraph.graph.Graph, got {type(graph).__name__}")
    if not isinstance(graph_name, str) or not graph_name or "/" in graph_name or graph_name.startswith("."):
        raise InvalidRequestError(
            f"graph_name {graph_name!r} is not valid: it must be a non-empty file name "
            "(no '/', no leading '.')"
        )
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise InvalidRequestError(f"num_parts must be an int, got {type(num_parts).__name__}")
    num_parts = int(num_parts)
    n = graph.num_nodes
    if num_parts < 1 or num_parts > n:
        raise InvalidRequestError(f"num_parts must be in [1, num_nodes={n}], got {num_parts}")
    if part_method not in METHODS:
        raise InvalidRequestError(f"unknown part_method {part_method!r}; expected one of {list(METHODS)}")
    categories = _balance_categories(balance_ntypes, n)
    out = Path(out_path)
    _check_out_path(out, overwrite)

    stage = _Stages(progress)
    # ---- 1. node -> partition ----
    if num_parts == 1:
        parts = np.zeros(n, dtype=np.int64)
    elif part_method == "metis":
        parts = _metis_assign(graph, num_parts, categories, balance_edges, seed, stage)
    else:
        with stage("random assignment"):
            parts = _random_assign(n, num_parts, seed, categories)

    # ---- 2./3. relabel nodes and edges ----
    with stage("relabelling"):
        small = parts.astype(np.int16 if num_parts < 2**15 else np.int64)
        del parts
        orig_nids = np.argsort(small, kind="stable").astype(np.int64, copy=False)  # radix for int16
        node_bounds = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(np.bincount(small, minlength=num_parts), out=node_bounds[1:])
        del small
        new_id = np.empty(n, dtype=np.int64)
        new_id[orig_nids] = np.arange(n, dtype=np.int64)
        new_dst = new_id[graph.dst]
        in_deg = np.bincount(new_dst, minlength=n)
        orig_eids, new_src = _csc_order(n, new_dst, new_id[graph.src])
        del new_id, new_dst
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(in_deg, out=indptr[1:])
        del in_deg
        edge_bounds = indptr[node_bounds]

    # ---- 4. write into a temporary sibling, then rename into place ----
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        tmp.mkdir()
        specs: list[PartSpec] = []
        for p in range(num_parts):
            n0, n1 = int(node_bounds[p]), int(node_bounds[p + 1])
            e0, e1 = int(edge_bounds[p]), int(edge_bounds[p + 1])
            with stage(f"writing part {p}"):
                pdir = tmp / f"part{p}"
                (pdir / "node_feat").mkdir(parents=True)
                (pdir / "edge_feat").mkdir()
                np.save(pdir / "indptr.npy", indptr[n0 : n1 + 1] - e0)
                np.save(pdir / "indices.npy", new_src[e0:e1])
                np.save(pdir / "eids.npy", np.arange(e0, e1, dtype=np.int64))
                for name, arr in graph.ndata.items():
                    _write_rows(pdir / "node_feat" / f"{name}.npy", arr, orig_nids[n0:n1])
                for name, arr in graph.edata.items():
                    _write_rows(pdir / "edge_feat" / f"{name}.npy", arr, orig_eids[e0:e1])
            specs.append(PartSpec(part_id=p, node_range=(n0, n1), edge_range=(e0, e1), path=f"part{p}"))
        del new_src, indptr
        config = PartitionConfig(
            graph_name=graph_name,
            num_nodes=n,
            num_edges=graph.num_edges,
            num_parts=num_parts,
            part_method=part_method,
            parts=specs,
            node_feats={k: _spec(v) for k, v in graph.ndata.items()},
            edge_feats={k: _spec(v) for k, v in graph.edata.items()},
        )
        (tmp / f"{graph_name}.json").write_text(config.model_dump_json(indent=2))
        with stage("committing"):
            _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if return_mapping:
        return orig_nids, orig_eids
    return None


def _commit(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` folder to ``out``, replacing an existing (empty or old) one."""
    if not (out.exists() or out.is_symlink()):
        os.rename(tmp, out)
        return
    trash = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
    os.rename(out, trash)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(trash, out)
        raise
    shutil.rmtree(trash, ignore_errors=True)
