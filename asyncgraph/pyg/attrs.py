"""PyG's arguments read as PyG reads them: fanouts, seed masks, and which node tensors a batch carries.

``num_neighbors`` goes through PyG's own ``NumNeighbors`` checks (a dict missing an edge type,
or hop lists of different lengths, raise PyG's ``ValueError`` message, as an
``InvalidRequestError``, which is a ``ValueError``). A batch's node attributes are named as in
PyG's ``Data``: ``x``/``y`` read tensors so named, else ``feat``/``label`` (asyncgraph's and
DGL's names), and every other node tensor keeps its own name, as PyG's in-memory loaders copy
every node attribute of the graph into a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler.base import NumNeighbors

from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading.fetch import AUTO, Auto
from asyncgraph.distributed.hetero import etype_fanouts
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownTensorError,
    UnknownTypeError,
)
from asyncgraph.names import NTYPE, is_state_key, split_typed, tensor_prefix
from asyncgraph.partition.book import RangePartitionBook

__all__ = ["PYG_ALIASES", "fanouts", "input_ids", "node_tensors", "resolve_attrs"]

PYG_ALIASES: dict[str, str] = {"x": "feat", "y": "label"}
"""PyG attribute name -> asyncgraph node tensor read for it (when the graph has no tensor so named)."""


def node_tensors(client: Client) -> list[str]:
    """The graph's node tensors by name (optimizer state and the partitioner's type column
    hidden; a heterograph's per-type tensors ``"paper/x"`` by their name ``"x"``)."""
    prefix = tensor_prefix("node")
    names = (
        m.name[len(prefix) :]
        for m in client.refresh_tensors()
        if m.name.startswith(prefix) and not is_state_key(m.name) and m.name[len(prefix) :] != NTYPE
    )
    return sorted({typed[1] if (typed := split_typed(n)) else n for n in names})


def _pick(have: list[str], pyg_name: str, given: str | Auto | None, what: str) -> str | None:
    if given is None:
        return None
    if given is AUTO:
        if pyg_name in have:
            return pyg_name
        alias = PYG_ALIASES[pyg_name]
        return alias if alias in have else None
    if not isinstance(given, str):
        raise DTypeMismatchError(f"{what} must name a node tensor (str), got {given!r}")
    if given not in have:
        raise UnknownTensorError(f"{what}: the graph has no node tensor {given!r}; node tensors: {have}")
    return given


def resolve_attrs(
    client: Client,
    x: str | Auto | None = AUTO,
    y: str | Auto | None = AUTO,
    attrs: Sequence[str] | Auto | None = None,
) -> dict[str, str]:
    """``{batch attribute: node tensor}``: ``x``, ``y`` (see the module docstring), then ``attrs``.

    ``attrs``: ``AUTO`` every other node tensor under its own name (PyG's in-memory loaders'
    batches carry every node attribute), ``None`` or ``[]`` none, else the names given.
    """
    have = node_tensors(client)
    out: dict[str, str] = {}
    for name, given in (("x", x), ("y", y)):
        tensor = _pick(have, name, given, name)
        if tensor is not None:
            out[name] = tensor
    if attrs is AUTO:
        extra = [n for n in have if n not in out.values() and n not in out]
    elif attrs is None:
        extra = []
    else:
        if isinstance(attrs, str):
            attrs = [attrs]
        extra = []
        for n in attrs:
            _pick(have, "x", n, "attrs")  # typed error for a name that is not a node tensor
            extra.append(n)
    for n in extra:
        if n in out:
            raise InvalidRequestError(f"attrs: {n!r} is already the batch's {n!r}; name it once")
        out[n] = n
    return out


def _edge_type_key(book: RangePartitionBook, key: Any) -> tuple[str, str, str]:
    canon = tuple(key) if isinstance(key, list) else key
    if isinstance(canon, str) and "__" in canon:  # PyG's EdgeTypeStr "src__rel__dst"
        canon = tuple(canon.split("__"))
    try:
        return book.canonical_etypes[book.etype_id(canon)]
    except (KeyError, ValueError) as exc:
        raise UnknownTypeError(
            f"num_neighbors: unknown edge type {key!r}; edge types: {book.canonical_etypes}"
        ) from exc


def _hops(values: Any, what: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | torch.Tensor | np.ndarray):
        raise DTypeMismatchError(
            f"{what} must be a list with one entry per hop (PyG's form, e.g. [10, 5]), got {values!r}"
        )
    out = []
    for v in list(values):
        if isinstance(v, torch.Tensor) and v.dim() == 0:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise DTypeMismatchError(f"{what} must be integers, got {v!r}")
        if int(v) < -1:
            raise InvalidRequestError(f"{what} must be -1 (all) or >= 0, got {v}")
        out.append(int(v))
    return out


def fanouts(num_neighbors: Any, book: RangePartitionBook) -> list[int] | list[np.ndarray]:
    """Homogeneous: a list of ints (hop order). Heterogeneous: one per-edge-type array per hop.

    A list applies to every edge type; a dict (or PyG's ``NumNeighbors``, with its ``default``)
    must give every edge type the same number of hops, as PyG requires."""
    default = None
    if isinstance(num_neighbors, NumNeighbors):
        num_neighbors, default = num_neighbors.values, num_neighbors.default
    if isinstance(num_neighbors, Mapping):
        if not book.is_hetero:
            raise InvalidRequestError("num_neighbors per edge type needs a heterogeneous graph")
        values = {
            _edge_type_key(book, k): _hops(v, f"num_neighbors[{k!r}]") for k, v in num_neighbors.items()
        }
        try:  # PyG's own checks and messages: every edge type named, one number of hops
            per_type = NumNeighbors(values, default).get_values(list(book.canonical_etypes))
        except ValueError as exc:
            raise InvalidRequestError(f"num_neighbors: {exc}") from exc
        hops = len(next(iter(per_type.values()))) if per_type else 0
        if not hops:
            raise InvalidRequestError("num_neighbors must name at least one hop")
        return [etype_fanouts(book, {c: int(v[h]) for c, v in per_type.items()}) for h in range(hops)]
    if default is not None:
        raise InvalidRequestError("num_neighbors: 'default' needs a dict per edge type (PyG's rule)")
    per_hop = _hops(num_neighbors, "num_neighbors")
    if not per_hop:
        raise InvalidRequestError("num_neighbors must name at least one hop")
    if book.is_hetero:
        return [etype_fanouts(book, v) for v in per_hop]
    return per_hop


def input_ids(ids: Any, n: int, what: str) -> np.ndarray:
    """Seed IDs of a group of ``n`` nodes from IDs or a mask, range-checked (int64).

    A boolean mask, or a uint8 one (DGL's and asyncgraph's stored masks are uint8) of length
    ``n`` holding only 0/1, selects the positions it marks; a mask of another shape is refused
    naming the shape it needs. Anything else is IDs."""
    arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    is_mask = arr.dtype == bool or (
        arr.dtype == np.uint8 and arr.shape == (n,) and bool(((arr == 0) | (arr == 1)).all())
    )
    if is_mask:
        if arr.shape != (n,):
            raise ShapeMismatchError(f"{what}: a boolean mask must have shape ({n},), got {arr.shape}")
        return np.flatnonzero(arr).astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidRequestError(f"{what} must be integer IDs or a boolean mask, got {arr.dtype}")
    if arr.ndim != 1:
        raise ShapeMismatchError(f"{what}: IDs must be one-dimensional, got shape {arr.shape}")
    nodes = arr.astype(np.int64, copy=False)
    if nodes.size and (int(nodes.min()) < 0 or int(nodes.max()) >= n):
        bad = int(nodes.min()) if int(nodes.min()) < 0 else int(nodes.max())
        raise OutOfRangeError(f"{what}: node ID {bad} out of range [0, {n})")
    return nodes
