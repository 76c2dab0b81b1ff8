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

__all__ = ["NEW_NODE_INPUTS", "NewNodes", "NewNodesInput", "check_new_nodes"]

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
        (-1: all) with the rule of the module's docstring; ``dst`` is the block ID ``-1 - row``."""
        src_parts, dst_parts = [], []
        for row in rows.tolist():
            given = self.neighbors[self.offsets[row] : self.offsets[row + 1]]
            if fanout != -1 and given.size and (replace or given.size > fanout):
                rng = np.random.default_rng([seed, row])
                pick = rng.choice(given.size, fanout, replace=replace)
                given = given[pick if replace else np.sort(pick)]
            src_parts.append(given)
            dst_parts.append(np.full(given.size, -1 - row, dtype=np.int64))
        if not src_parts:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(src_parts), np.concatenate(dst_parts)


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
    feats, nbrs, offs = _array(given.features), _array(given.neighbors), _array(given.offsets)
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
    n = int(feats.shape[0])
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
    return NewNodes(feats, nbrs, offs, bool(given.store))
