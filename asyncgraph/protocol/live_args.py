"""Argument records of a live graph's structure writes (issue 35): ``add_edges``,
``remove_edges``. Pure like :mod:`asyncgraph.protocol.args`: checked decoding, encoding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncgraph.errors import ShapeMismatchError
from asyncgraph.protocol.args import _get, _ids, request_id

__all__ = ["AddEdgesArgs", "AddNodesArgs", "CompactArgs", "RemoveEdgesArgs"]


@dataclass(frozen=True, slots=True)
class AddEdgesArgs:
    """Append the edges ``src[i] -> dst[i]`` to the partition owning every ``dst`` (global IDs).

    ``rid`` (decoded from the request's map, never encoded here: the sender adds it) lets the
    owner answer a resend with the edge IDs the first one allocated."""

    src: np.ndarray
    dst: np.ndarray
    rid: str | None = None

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> AddEdgesArgs:
        src, dst = _ids(args, "add_edges", "src"), _ids(args, "add_edges", "dst")
        if src.shape != dst.shape:
            raise ShapeMismatchError(
                f"add_edges: src and dst must have the same length, got {src.size} and {dst.size}"
            )
        return cls(src, dst, request_id(args, "add_edges"))

    def encode(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst}


@dataclass(frozen=True, slots=True)
class AddNodesArgs:
    """Add ``num`` nodes to the partition the request is sent to (``rid``: as ``AddEdgesArgs``)."""

    num: int
    rid: str | None = None

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> AddNodesArgs:
        return cls(_get(args, "add_nodes", "num", int), request_id(args, "add_nodes"))

    def encode(self) -> dict[str, Any]:
        return {"num": self.num}


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
