"""Parallel edges of a graph declared without them (``partition_graph(..., multigraph=False)``).

Vectorised: the edges are sorted by ``(relation, src, dst)`` and equal neighbours compared, so a
check costs a sort of the edges it looks at, no loop per edge.
"""

from __future__ import annotations

import numpy as np

from asyncgraph.errors import DuplicateEdgeError

__all__ = ["check_simple", "repeated_new_edge"]


def _repeats(src: np.ndarray, dst: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, same)``: the sort order and whether each sorted edge equals the one before."""
    order = np.lexsort((dst, src, rel))
    s, d, r = src[order], dst[order], rel[order]
    same = np.zeros(order.size, bool)
    same[1:] = (s[1:] == s[:-1]) & (d[1:] == d[:-1]) & (r[1:] == r[:-1])
    return order, same


def check_simple(src: np.ndarray, dst: np.ndarray, rel: np.ndarray | None = None) -> None:
    """``DuplicateEdgeError`` naming a repeated edge ``src -> dst`` (of one relation ``rel``)."""
    r = np.zeros(src.size, np.int64) if rel is None else np.asarray(rel, np.int64)
    order, same = _repeats(np.asarray(src, np.int64), np.asarray(dst, np.int64), r)
    if same.any():
        i = int(order[int(np.flatnonzero(same)[0])])
        raise DuplicateEdgeError(
            f"multigraph=False, but edge {int(src[i])} -> {int(dst[i])} occurs more than once"
        )


def repeated_new_edge(
    old: tuple[np.ndarray, np.ndarray, np.ndarray], new: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> int | None:
    """The index of a new edge ``(src, dst, rel)`` that repeats an old one or an earlier new
    one, or None (old edges are taken to be unique among themselves)."""
    n_old = old[0].size
    src, dst, rel = (
        np.concatenate([np.asarray(a, np.int64), np.asarray(b, np.int64)])
        for a, b in zip(old, new, strict=True)
    )
    order, same = _repeats(src, dst, rel)
    # a run of equal edges: every member after the first repeats it; report a new one
    at = np.flatnonzero(same)
    if not at.size:
        return None
    hit = np.maximum(order[at], order[at - 1])  # the later of the pair: new if either is new
    hit = hit[hit >= n_old]
    return int(hit.min()) - n_old if hit.size else None
