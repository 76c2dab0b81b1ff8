"""Typed pair graphs of a heterogeneous edge batch, and per-type data views (DGL's hetero frames).

A :class:`HeteroPairGraph` is what DGL's ``DistEdgeDataLoader`` gives for ``{etype: eids}``: one
node set per node type (the batch's endpoints, ``== blocks[-1].dstnodes[ntype]``) and the pairs of
every canonical edge type in per-type local indices. ``ndata[name]`` / ``edata[name]`` are dicts
by type, as DGL's for a graph of several types; ``pair.edges[etype].data[dgl.EID]`` holds the
positive pairs' per-type edge IDs; ``apply_edges(fn.u_dot_v(...), etype=)`` scores one relation
(every relation without ``etype``), evaluated by the homogeneous ``GraphOps`` on that relation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import torch

from asyncgraph.errors import InvalidRequestError, UnknownTensorError, UnknownTypeError

from .frames import Frame, GraphOps

__all__ = ["HeteroPairGraph", "TypedFrames", "resolve_canonical"]

CanonicalEType = tuple[str, str, str]


def resolve_canonical(etype: Any, canonical: list[CanonicalEType]) -> CanonicalEType:
    """A canonical triple from a triple or a unique relation name (``UnknownTypeError`` else)."""
    if isinstance(etype, tuple) and tuple(etype) in canonical:
        return tuple(etype)
    found = [c for c in canonical if c[1] == etype]
    if len(found) != 1:
        raise UnknownTypeError(f"edge type {etype!r} is unknown or ambiguous; known: {canonical}")
    return found[0]


class TypedFrames(MutableMapping[str, Any]):
    """``ndata`` / ``edata`` of a graph of several types: ``view[name]`` is ``{type: tensor}``
    over the types that have ``name``; ``view[name] = {type: tensor}`` sets them (a plain
    tensor is accepted when there is one type)."""

    def __init__(self, frames: dict[Any, Frame]) -> None:
        self.frames = frames

    def __getitem__(self, name: str) -> dict[Any, Any]:
        out = {k: f[name] for k, f in self.frames.items() if name in f}
        if not out:
            raise UnknownTensorError(f"no field {name!r} on any type")
        return out

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(value, dict):
            unknown = [k for k in value if k not in self.frames]
            if unknown:
                raise UnknownTypeError(f"unknown type(s) {unknown}; known: {list(self.frames)}")
            for k, v in value.items():
                self.frames[k][name] = v
            return
        if len(self.frames) != 1:
            raise InvalidRequestError(f"{name!r}: a graph of several types takes a dict {{type: tensor}}")
        next(iter(self.frames.values()))[name] = value

    def __delitem__(self, name: str) -> None:
        for f in self.frames.values():
            f.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return any(name in f for f in self.frames.values())

    def __iter__(self) -> Iterator[str]:
        return iter(sorted({n for f in self.frames.values() for n in f}))

    def __len__(self) -> int:
        return len(list(iter(self)))


def map_frames(frames: dict[Any, Frame], mapper: Callable[[Any], Any]) -> dict[Any, Frame]:
    """Frames with ``mapper`` applied to their fields and IDs (the IDs keep answering ``_ID``)."""
    return {
        k: Frame(mapper(dict(f)), mapper(f.ids) if f.ids is not None else None) for k, f in frames.items()
    }


class _TypeData:
    def __init__(self, data: Frame) -> None:
        self.data = data


class _Relation(GraphOps):
    """One relation of a typed graph seen as a homogeneous graph (for ``apply_edges``)."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, frames: tuple[Frame, Frame, Frame]) -> None:
        self._src, self._dst, self._fr = src, dst, frames

    def _endpoints(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._src, self._dst

    def _num_dst(self) -> int:
        raise InvalidRequestError("update_all is not available on a typed pair graph")

    def _src_frame(self) -> Frame:
        return self._fr[0]

    def _dst_frame(self) -> Frame:
        return self._fr[1]

    def _edge_frame(self) -> Frame:
        return self._fr[2]


class _Edges:
    """``pair.edges``: ``pair.edges(etype=, form=)`` and ``pair.edges[etype].data``."""

    def __init__(self, graph: HeteroPairGraph) -> None:
        self._g = graph

    def __call__(self, form: str = "uv", order: str = "eid", etype: Any = None) -> tuple[torch.Tensor, ...]:
        c = self._g.to_canonical_etype(etype)
        src, dst, _ = self._g.pairs[c]
        if form == "all":
            return src, dst, torch.arange(src.numel(), device=src.device)
        if form != "uv":
            raise InvalidRequestError(f"form must be 'uv' or 'all', got {form!r}")
        return src, dst

    def __getitem__(self, etype: Any) -> _TypeData:
        return _TypeData(self._g.edge_frames[self._g.to_canonical_etype(etype)])


class HeteroPairGraph:
    """Typed node pairs of an edge batch: ``pairs[c] = (src, dst, eids)``, ``src`` indexing
    ``nodes[c[0]]`` and ``dst`` indexing ``nodes[c[2]]`` (per-type IDs); ``eids`` are the
    positive pairs' per-type edge IDs (empty for negative pairs)."""

    is_block = False

    def __init__(
        self,
        ntypes: list[str],
        canonical_etypes: list[CanonicalEType],
        nodes: dict[str, torch.Tensor],
        pairs: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    ) -> None:
        self.ntypes, self.canonical_etypes = list(ntypes), list(canonical_etypes)
        self.nodes_of, self.pairs = nodes, pairs
        self.node_frames = {t: Frame({}, nodes[t]) for t in self.ntypes}
        self.edge_frames = {
            c: Frame({}, e if e.numel() == s.numel() else None) for c, (s, _, e) in pairs.items()
        }

    @property
    def etypes(self) -> list[str]:
        return [c[1] for c in self.canonical_etypes]

    def to_canonical_etype(self, etype: Any) -> CanonicalEType:
        if etype is None:
            if len(self.canonical_etypes) != 1:
                raise InvalidRequestError(f"name the edge type; this graph has {self.canonical_etypes}")
            return self.canonical_etypes[0]
        return resolve_canonical(etype, self.canonical_etypes)

    def num_nodes(self, ntype: str | None = None) -> int:
        if ntype is None:
            return sum(int(v.numel()) for v in self.nodes_of.values())
        if ntype not in self.nodes_of:
            raise UnknownTypeError(f"unknown node type {ntype!r}; known: {self.ntypes}")
        return int(self.nodes_of[ntype].numel())

    def num_edges(self, etype: Any = None) -> int:
        if etype is None:
            return sum(int(p[0].numel()) for p in self.pairs.values())
        return int(self.pairs[self.to_canonical_etype(etype)][0].numel())

    number_of_nodes = num_nodes
    number_of_edges = num_edges

    @property
    def ndata(self) -> TypedFrames:
        return TypedFrames(self.node_frames)

    @property
    def srcdata(self) -> TypedFrames:
        return self.ndata

    @property
    def dstdata(self) -> TypedFrames:
        return self.ndata

    @property
    def edata(self) -> TypedFrames:
        return TypedFrames(self.edge_frames)

    @property
    def edges(self) -> _Edges:
        return _Edges(self)

    @property
    def nodes(self) -> dict[str, _TypeData]:
        """``pair.nodes[ntype].data``: one node type's fields."""
        return {t: _TypeData(f) for t, f in self.node_frames.items()}

    def apply_edges(self, func: Any, etype: Any = None) -> None:
        """Edge fields of relation ``etype`` (of every relation when None and there are several)."""
        types = self.canonical_etypes if etype is None else [self.to_canonical_etype(etype)]
        for c in types:
            s, d, _ = self.pairs[c]
            frames = (self.node_frames[c[0]], self.node_frames[c[2]], self.edge_frames[c])
            _Relation(s, d, frames).apply_edges(func)

    @contextmanager
    def local_scope(self) -> Iterator[None]:
        """Fields set inside are dropped on exit."""
        saved = self.node_frames, self.edge_frames
        self.node_frames = {k: f.copy() for k, f in saved[0].items()}
        self.edge_frames = {k: f.copy() for k, f in saved[1].items()}
        try:
            yield
        finally:
            self.node_frames, self.edge_frames = saved

    def local_var(self) -> HeteroPairGraph:
        out = HeteroPairGraph(self.ntypes, self.canonical_etypes, self.nodes_of, self.pairs)
        out.node_frames = {k: f.copy() for k, f in self.node_frames.items()}
        out.edge_frames = {k: f.copy() for k, f in self.edge_frames.items()}
        return out

    def map_tensors(self, mapper: Callable[[Any], Any]) -> HeteroPairGraph:
        """A copy with ``mapper`` applied to every tensor (node IDs, pairs, fields), in a fixed
        order: how a loader's ``device=`` stages a typed batch."""
        out = HeteroPairGraph(self.ntypes, self.canonical_etypes, mapper(self.nodes_of), mapper(self.pairs))
        out.node_frames = map_frames(self.node_frames, mapper)
        out.edge_frames = map_frames(self.edge_frames, mapper)
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> HeteroPairGraph:
        """A copy with every tensor on ``device``."""

        def mv(t: Any) -> Any:
            return t.to(device, non_blocking=non_blocking) if isinstance(t, torch.Tensor) else t

        out = HeteroPairGraph(
            self.ntypes,
            self.canonical_etypes,
            {t: mv(v) for t, v in self.nodes_of.items()},
            {c: (mv(a), mv(b), mv(e)) for c, (a, b, e) in self.pairs.items()},
        )
        for src, dst in ((self.node_frames, out.node_frames), (self.edge_frames, out.edge_frames)):
            for k, f in src.items():
                dst[k].update({n: mv(v) for n, v in f.items()})  # type: ignore[index]
        return out

    def __repr__(self) -> str:
        n = {t: self.num_nodes(t) for t in self.ntypes}
        e = {c[1]: self.num_edges(c) for c in self.canonical_etypes}
        return f"HeteroPairGraph(num_nodes={n}, num_edges={e})"
