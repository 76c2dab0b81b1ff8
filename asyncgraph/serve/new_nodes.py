"""An inductive request's new nodes: the request as it arrived (``NewNodesInput``), checked
(``NewNodes``, ``check_new_nodes``), and the documented draw of a new node's given in-edges
(``NewNodes.sample_in_edges``); shared by ``serve/inductive.py`` (homogeneous graphs) and
``serve/inductive_typed.py`` (typed graphs, one ``NewNodes`` per relation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    NonFiniteError,
    OutOfRangeError,
    ShapeMismatchError,
)
from asyncgraph.kernels.edge_queries import segment_positions, segment_topk
from asyncgraph.kernels.partition_sampling import keyed_words

__all__ = [
    "NEW_NODE_INPUTS",
    "NewNodes",
    "NewNodesInput",
    "check_features",
    "check_neighbours",
    "check_new_nodes",
]

#: an inductive request's inputs (OIP v2 names, and the msgpack request's keys but ``offsets``)
NEW_NODE_INPUTS = ("features", "neighbors", "neighbor_offsets")


@dataclass(frozen=True)
class NewNodesInput:
    """An inductive request as it arrived (unchecked): see ``check_new_nodes``. On a typed graph
    ``neighbors`` and ``offsets`` are ``{etype: array}`` and ``ntype`` may name the new nodes'
    type (``serve/inductive_typed.py``)."""

    features: Any
    neighbors: Any
    offsets: Any
    store: bool = False
    ntype: str | None = None


@dataclass(frozen=True)
class NewNodes:
    """Checked new nodes: ``features[i]`` and in-neighbours ``neighbors[offsets[i]:offsets[i + 1]]``."""

    features: np.ndarray  # [n, *feature shape], the graph's feature dtype
    neighbors: np.ndarray  # int64 [m], existing node IDs
    offsets: np.ndarray  # int64 [n + 1], offsets[0] == 0, offsets[-1] == m
    store: bool = False

    @property
    def count(self) -> int:
        return int(self.features.shape[0])

    def sample_in_edges(
        self, rows: np.ndarray, fanout: int, seed: int, *, replace: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` in-edges of new nodes ``rows`` (request positions) sampled to ``fanout``
        (-1: all), row after row; ``dst`` is the block ID ``-1 - row``. The draw (``keyed_words``:
        one word per ``(seed, row, counter)``, no generator per node) depends only on ``seed``, the
        node's position and its given neighbours: without replacement a node with more than
        ``fanout`` neighbours keeps the ``fanout`` whose words are smallest, in the given order;
        with replacement draw ``k`` takes neighbour ``floor(u_k * degree)``, ``u_k`` the
        word's top 53 bits as a fraction."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        starts = self.offsets[rows]
        degree = self.offsets[rows + 1] - starts
        if replace and fanout != -1:
            drawn = np.where(degree > 0, fanout, 0)
            owner, counter = segment_positions(np.zeros(rows.size, np.int64), drawn)
            fraction = (keyed_words(seed, rows[owner], counter) >> np.uint64(11)) * 2.0**-53
            picked = starts[owner] + np.floor(fraction * degree[owner]).astype(np.int64)
        else:
            owner, picked = segment_positions(starts, degree)
            if fanout != -1 and bool((degree > fanout).any()):
                words = keyed_words(seed, rows[owner], picked - starts[owner])
                keep = np.sort(segment_topk(owner, words, fanout))  # the smallest, in the given order
                owner, picked = owner[keep], picked[keep]
        return self.neighbors[picked], -1 - rows[owner]


def _array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def check_new_nodes(
    given: NewNodesInput, *, feat_shape: tuple[int, ...], feat_dtype: np.dtype[Any], num_nodes: int
) -> NewNodes:
    """``given``'s new nodes, checked: ``features`` ``[n, *feat_shape]`` finite numbers,
    ``offsets`` ``n + 1`` non-decreasing integers from 0 to ``len(neighbors)``, every neighbour
    a node ID >= 0 (one above ``num_nodes`` is checked with its owner: ``added_exist``); else a
    typed error (``InvalidRequestError``)."""
    feats = check_features(given.features, feat_shape=feat_shape, feat_dtype=feat_dtype)
    nbrs, offs = check_neighbours(
        given.neighbors, given.offsets, count=int(feats.shape[0]), num_nodes=num_nodes
    )
    return NewNodes(feats, nbrs, offs, bool(given.store))


def check_features(features: Any, *, feat_shape: tuple[int, ...], feat_dtype: np.dtype[Any]) -> np.ndarray:
    """New nodes' input rows ``[n >= 1, *feat_shape]``, finite numbers, as a contiguous array of
    the graph's feature dtype; else a typed error."""
    feats = _array(features)
    if feats.dtype.kind not in "fiu" or feats.dtype == np.bool_:
        raise DTypeMismatchError(f"features must be numbers, got {feats.dtype}")
    if feats.ndim != 1 + len(feat_shape) or tuple(feats.shape[1:]) != tuple(feat_shape) or not feats.shape[0]:
        raise ShapeMismatchError(
            f"features must have shape [n >= 1, {', '.join(map(str, feat_shape))}] (the model's "
            f"input rows), got {list(feats.shape)}"
        )
    feats = np.ascontiguousarray(feats, dtype=feat_dtype)
    if feats.dtype.kind == "f" and not bool(np.isfinite(feats).all()):
        raise NonFiniteError("features hold NaN or infinity")
    return feats


def check_neighbours(
    neighbors: Any, offsets: Any, *, count: int, num_nodes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(neighbours, offsets)`` of ``count`` new nodes as int64: ``offsets`` ``count + 1``
    non-decreasing from 0 to ``len(neighbors)``, every neighbour >= 0; else a typed error."""
    nbrs, offs, n = _array(neighbors), _array(offsets), count
    for arr, what in ((nbrs, "neighbors"), (offs, "neighbor offsets")):
        if arr.size and arr.dtype.kind not in "iu":
            raise DTypeMismatchError(f"{what} must be integers, got {arr.dtype}")
        if arr.ndim != 1:
            raise ShapeMismatchError(f"{what} must be 1-D, got shape {list(arr.shape)}")
    nbrs, offs = nbrs.astype(np.int64), offs.astype(np.int64)
    if offs.size != n + 1:
        raise ShapeMismatchError(f"neighbor offsets must hold n + 1 = {n + 1} values, got {offs.size}")
    if offs[0] != 0 or offs[-1] != nbrs.size or bool((np.diff(offs) < 0).any()):
        raise InvalidRequestError(
            f"neighbor offsets must rise from 0 to len(neighbors) = {nbrs.size}, got {offs.tolist()[:8]}"
        )
    bad = nbrs[nbrs < 0]  # above the base: a live graph's added nodes (``InferenceCore.added_exist``)
    if bad.size:
        raise OutOfRangeError(f"unknown neighbour node ID {int(bad[0])}: the graph has 0..{num_nodes - 1}")
    return nbrs, offs
