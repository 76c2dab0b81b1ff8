"""Node assignment: which partition owns each node (METIS or a balanced random split).

METIS runs on the symmetrised graph and is followed by repair passes that even out node
counts, ``balance_ntypes`` categories and, if asked, in-edges per part. Everything is
vectorised numpy: loops run over parts, categories and steps, never over nodes or edges.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import numpy.typing as npt

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.book import IdArray
from asyncgraph.partition.graph import Graph, to_numpy

__all__ = ["METHODS", "Stage", "assign_parts", "balance_categories", "symmetric_csr"]

METHODS = ("metis", "random")

Stage = Callable[[str], AbstractContextManager[None]]
"""Times a named stage of the pipeline: ``with stage("metis"): ...``."""


def assign_parts(
    graph: Graph,
    num_parts: int,
    method: str,
    categories: IdArray | None,
    balance_edges: bool,
    seed: int,
    stage: Stage,
) -> IdArray:
    """The partition of every node (int64, ``[num_nodes]``) by ``method`` (one of ``METHODS``)."""
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    if method == "metis":
        return _metis_assign(graph, num_parts, categories, balance_edges, seed, stage)
    with stage("random assignment"):
        return _random_assign(graph.num_nodes, num_parts, seed, categories)


def balance_categories(balance_ntypes: Any, num_nodes: int) -> IdArray | None:
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
    stage: Stage,
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


def own_part_neighbours(parts: IdArray, xadj: IdArray, adjncy: IdArray, step: int = 1 << 22) -> IdArray:
    """Neighbours of each node in its own part, over node ranges of ~``step`` adjacency entries
    (a few bytes an entry at a time, not ~50: the out-of-core path's structure is memory-mapped)."""
    n = parts.size
    score = np.zeros(n, dtype=np.int64)
    a = 0
    while a < n:
        b = max(a + 1, int(np.searchsorted(xadj, xadj[a] + step, side="right")) - 1)
        b = min(n, b)
        lo, hi = int(xadj[a]), int(xadj[b])
        rows = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(xadj[a : b + 1]))
        same = parts[rows] == parts[np.asarray(adjncy[lo:hi])]
        score[a:b] = np.bincount(rows[same] - a, minlength=b - a)
        a = b
    return score


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
    score = own_part_neighbours(parts, xadj, adjncy)
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
