"""Argument records of a live graph's structure writes (issue 35): ``add_edges`` and
``add_nodes`` (with rows of tensors for the new IDs), ``remove_edges``.
Pure like :mod:`asyncgraph.protocol.args`: checked decoding, encoding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError, ShapeMismatchError
from asyncgraph.protocol.args import _get, _ids, check_name, request_id

__all__ = ["AddEdgesArgs", "AddNodesArgs", "CompactArgs", "RemoveEdgesArgs"]

#: Rows of tensors for the new IDs, by stored tensor name (one row per new ID, in order).
RowData = dict[str, np.ndarray]


def _data(args: Mapping[str, Any], op: str, rows: int) -> RowData:
    """The optional ``data`` map: tensor names to arrays of ``rows`` rows (checked against the
    tensors by the owner)."""
    raw = args.get("data")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidRequestError(f"{op}: data must be a map of tensor names to arrays")
    out: RowData = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not isinstance(value, np.ndarray):
            raise InvalidRequestError(f"{op}: data must be a map of tensor names to arrays")
        check_name(name, op, "data")
        if value.ndim == 0 or value.shape[0] != rows:
            raise ShapeMismatchError(
                f"{op}: data {name!r} has shape {value.shape}; {rows} new IDs need {rows} rows"
            )
        out[name] = value
    return out


def _with_data(encoded: dict[str, Any], data: RowData) -> dict[str, Any]:
    if data:  # absent when empty: records without data read as before
        encoded["data"] = dict(data)
    return encoded


@dataclass(frozen=True, slots=True)
class AddEdgesArgs:
    """Append the edges ``src[i] -> dst[i]`` to the partition owning every ``dst`` (global IDs).

    ``rid`` (decoded from the request's map, never encoded here: the sender adds it) lets the
    owner answer a resend with the edge IDs the first one allocated."""

    src: np.ndarray
    dst: np.ndarray
    rid: str | None = None
    #: Rows of edge tensors for the new edges (``{name: rows}``, one row per edge).
    data: RowData = field(default_factory=dict)

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> AddEdgesArgs:
        src, dst = _ids(args, "add_edges", "src"), _ids(args, "add_edges", "dst")
        if src.shape != dst.shape:
            raise ShapeMismatchError(
                f"add_edges: src and dst must have the same length, got {src.size} and {dst.size}"
            )
        return cls(src, dst, request_id(args, "add_edges"), _data(args, "add_edges", int(src.size)))

    def encode(self) -> dict[str, Any]:
        return _with_data({"src": self.src, "dst": self.dst}, self.data)


@dataclass(frozen=True, slots=True)
class AddNodesArgs:
    """Add ``num`` nodes to the partition the request is sent to (``rid``: as ``AddEdgesArgs``)."""

    num: int
    rid: str | None = None
    #: Rows of node tensors for the new nodes (``{name: rows}``, one row per node).
    data: RowData = field(default_factory=dict)

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> AddNodesArgs:
        num = _get(args, "add_nodes", "num", int)
        return cls(num, request_id(args, "add_nodes"), _data(args, "add_nodes", num))

    def encode(self) -> dict[str, Any]:
        return _with_data({"num": self.num}, self.data)


@dataclass(frozen=True, slots=True)
class RemoveEdgesArgs:
    """Remove the live edges ``eids`` (global IDs) the partition owns."""

    eids: np.ndarray

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> RemoveEdgesArgs:
        return cls(_ids(args, "remove_edges", "eids"))

    def encode(self) -> dict[str, Any]:
        return {"eids": self.eids}


@dataclass(frozen=True, slots=True)
class CompactArgs:
    """Fold the partition's live overlay into a new CSC (``rid``: as ``AddEdgesArgs``)."""

    rid: str | None = None

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> CompactArgs:
        return cls(request_id(args, "compact"))

    def encode(self) -> dict[str, Any]:
        return {}
