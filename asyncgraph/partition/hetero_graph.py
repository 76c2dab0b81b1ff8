"""Heterogeneous graphs: several node types and canonical edge types ``(src_type, rel, dst_type)``.

A :class:`HeteroGraph` is the input of offline partitioning, like :class:`~asyncgraph.partition.graph.Graph`.
Node IDs are per type (``0 .. num_nodes(ntype)-1``), edge IDs per canonical edge type. Internally
the partitioner works on the homogeneous form (:meth:`HeteroGraph.to_homogeneous`): node types
laid out one after another in ``ntypes`` order, edge types likewise in ``canonical_etypes`` order,
which is DGL's ``to_homogeneous`` layout. A homogeneous :class:`Graph` is the special case of one
node type ``_N`` and one edge type ``('_N', '_E', '_N')``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError, OutOfRangeError, UnknownTypeError
from asyncgraph.partition.graph import Graph, IdArray, TensorDict, _ids

__all__ = ["CanonicalEType", "HeteroGraph", "check_type_keys", "heterograph", "resolve_etype"]

CanonicalEType = tuple[str, str, str]



def resolve_etype(etype: Any, canonical: list[CanonicalEType]) -> CanonicalEType:
    """The canonical edge type named by ``etype`` (a relation name or a canonical triple).

    A relation name must be unique among the canonical types; anything else raises
    ``UnknownTypeError`` naming the known types.
    """
    if isinstance(etype, tuple | list) and len(etype) == 3:
        c = (str(etype[0]), str(etype[1]), str(etype[2]))
        if c in canonical:
            return c
        raise UnknownTypeError(f"unknown edge type {c}; known: {canonical}")
    if isinstance(etype, str):
        hits = [c for c in canonical if c[1] == etype]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise UnknownTypeError(f"edge type {etype!r} is ambiguous; use one of {hits}")
    raise UnknownTypeError(f"unknown edge type {etype!r}; known: {canonical}")


def check_type_keys(given: Iterable[Any], known: Iterable[Any], what: str) -> None:
    """Raise ``UnknownTypeError`` when a dict is keyed by a type the graph does not have."""
    known_list = list(known)
    bad = [k for k in given if k not in known_list]
    if bad:
        raise UnknownTypeError(f"{what}: unknown type(s) {bad}; known: {known_list}")


class _TypeView:
    """``g.nodes[ntype]`` / ``g.edges[etype]``: ``.data`` is that type's tensors."""

    def __init__(self, data: TensorDict) -> None:
        self.data = data


class _TypeIndex:
    def __init__(self, views: Mapping[Any, _TypeView], resolve: Any) -> None:
        self._views, self._resolve = views, resolve

    def __getitem__(self, key: Any) -> _TypeView:
        return self._views[self._resolve(key)]


class _EdgeIndex(_TypeIndex):
    def __init__(self, views: Mapping[Any, _TypeView], resolve: Any, pairs: Mapping[Any, Any]) -> None:
        super().__init__(views, resolve)
        self._pairs = pairs

    def __call__(self, etype: Any = None) -> tuple[IdArray, IdArray]:
        if etype is None and len(self._pairs) == 1:
            return tuple(next(iter(self._pairs.values())))
        return tuple(self._pairs[self._resolve(etype)])


class HeteroGraph:
    """A graph with node types and canonical edge types; per-type IDs and per-type tensors.

    ``g.nodes[ntype].data[name]`` has first dimension ``num_nodes(ntype)``;
    ``g.edges[etype].data[name]`` first dimension ``num_edges(etype)`` (``etype`` a relation name
    or a canonical triple). Torch tensors are accepted and stored as numpy.
    """

    def __init__(
        self,
        edges: Mapping[CanonicalEType, tuple[Any, Any]],
        num_nodes_dict: Mapping[str, int] | None = None,
    ) -> None:
        if not isinstance(edges, Mapping) or not edges:
            raise InvalidRequestError(
                "heterograph() takes a non-empty dict {(src_type, rel, dst_type): (src, dst)}"
            )
        canon: list[CanonicalEType] = []
        pairs: dict[CanonicalEType, tuple[IdArray, IdArray]] = {}
        for key, value in edges.items():
            if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) and k for k in key)):
                raise InvalidRequestError(
                    f"edge type {key!r} must be a canonical triple of non-empty strings"
                )
            if not isinstance(value, tuple | list) or len(value) != 2:
                raise InvalidRequestError(f"edges of {key} must be a pair (src, dst)")
            s, d = _ids(value[0], f"src of {key}"), _ids(value[1], f"dst of {key}")
            if s.shape != d.shape:
                raise InvalidRequestError(f"src and dst of {key} differ in length ({s.size} vs {d.size})")
            canon.append(key)
            pairs[key] = (s, d)
        if len({c[1] for c in canon}) != len(canon) and len(set(canon)) != len(canon):
            raise InvalidRequestError("duplicate canonical edge types")
        seen = sorted({c[0] for c in canon} | {c[2] for c in canon} | set(num_nodes_dict or {}))
        counts: dict[str, int] = {}
        for t in seen:
            top = max(
                [int(pairs[c][0].max(initial=-1)) + 1 for c in canon if c[0] == t]
                + [int(pairs[c][1].max(initial=-1)) + 1 for c in canon if c[2] == t]
                + [0]
            )
            n = int((num_nodes_dict or {}).get(t, top))
            if n < top:
                raise OutOfRangeError(f"node type {t!r}: edges use ID {top - 1} but num_nodes is {n}")
            counts[t] = n
        for c in canon:
            if int(pairs[c][0].min(initial=0)) < 0 or int(pairs[c][1].min(initial=0)) < 0:
                raise OutOfRangeError(f"edge type {c} holds a negative node ID")
        self._ntypes = seen
        self._canon = canon
        self._num_nodes = counts
        self._edges = pairs
        self._ndata = {t: _TypeView(TensorDict(counts[t], f"nodes[{t!r}].data", "num_nodes")) for t in seen}
        self._edata = {
            c: _TypeView(TensorDict(pairs[c][0].size, f"edges[{c}].data", "num_edges")) for c in canon
        }

    # --- types ------------------------------------------------------------------------------------
    @property
    def ntypes(self) -> list[str]:
        return list(self._ntypes)

    @property
    def canonical_etypes(self) -> list[CanonicalEType]:
        return list(self._canon)

    @property
    def etypes(self) -> list[str]:
        return [c[1] for c in self._canon]

    def check_ntype(self, ntype: Any) -> str:
        if ntype not in self._ntypes:
            raise UnknownTypeError(f"unknown node type {ntype!r}; known: {self._ntypes}")
        return str(ntype)

    def to_canonical_etype(self, etype: Any) -> CanonicalEType:
        return resolve_etype(etype, self._canon)

    # --- sizes and data ---------------------------------------------------------------------------
    def num_nodes(self, ntype: str | None = None) -> int:
        if ntype is None:
            return sum(self._num_nodes.values())
        return self._num_nodes[self.check_ntype(ntype)]

    def num_edges(self, etype: Any = None) -> int:
        if etype is None:
            return sum(int(s.size) for s, _ in self._edges.values())
        return int(self._edges[self.to_canonical_etype(etype)][0].size)

    @property
    def edges(self) -> _EdgeIndex:
        """``g.edges(etype=...)`` gives ``(src, dst)``; ``g.edges[etype].data`` that type's tensors."""
        return _EdgeIndex(self._edata, self.to_canonical_etype, self._edges)

    @property
    def nodes(self) -> _TypeIndex:
        return _TypeIndex(self._ndata, self.check_ntype)

    # --- homogeneous form ---------------------------------------------------------------------------
    def node_offsets(self) -> IdArray:
        """Homogeneous start of each node type (``len(ntypes) + 1`` entries)."""
        out = np.zeros(len(self._ntypes) + 1, dtype=np.int64)
        np.cumsum([self._num_nodes[t] for t in self._ntypes], out=out[1:])
        return out

    def edge_offsets(self) -> IdArray:
        out = np.zeros(len(self._canon) + 1, dtype=np.int64)
        np.cumsum([self._edges[c][0].size for c in self._canon], out=out[1:])
        return out

    def to_homogeneous(self, with_data: bool = True) -> tuple[Graph, IdArray, IdArray]:
        """``(graph, ntype of each node, etype of each edge)``: DGL's ``to_homogeneous`` layout.

        With ``with_data``, tensors of the same name and row shape/dtype on several types become
        one homogeneous tensor (rows of types without it are zero); ``partition_graph`` passes
        False and stores each type's tensors on their own (``asyncgraph.partition.typed``).
        """
        noff, eoff = self.node_offsets(), self.edge_offsets()
        tidx = {t: i for i, t in enumerate(self._ntypes)}
        src = np.concatenate([self._edges[c][0] + noff[tidx[c[0]]] for c in self._canon])
        dst = np.concatenate([self._edges[c][1] + noff[tidx[c[2]]] for c in self._canon])
        ntype = np.repeat(np.arange(len(self._ntypes), dtype=np.int64), np.diff(noff))
        etype = np.repeat(np.arange(len(self._canon), dtype=np.int64), np.diff(eoff))
        ndata, edata = {}, {}
        if with_data:
            ndata = self._merge({t: self._ndata[t].data for t in self._ntypes}, noff, list(self._ntypes))
            edata = self._merge({c: self._edata[c].data for c in self._canon}, eoff, list(self._canon))
        g = Graph(int(noff[-1]), src, dst, ndata, edata)
        return g, ntype, etype

    @staticmethod
    def _merge(
        per_type: Mapping[Any, TensorDict], offsets: IdArray, order: list[Any]
    ) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        names = sorted({n for d in per_type.values() for n in d})
        for name in names:
            have = [(i, per_type[k][name]) for i, k in enumerate(order) if name in per_type[k]]
            first = have[0][1]
            for i, arr in have:
                if arr.shape[1:] != first.shape[1:] or arr.dtype != first.dtype:
                    raise InvalidRequestError(
                        f"tensor {name!r} has rows {arr.shape[1:]} {arr.dtype} on {order[i]!r} but "
                        f"{first.shape[1:]} {first.dtype} on {order[have[0][0]]!r}; same-named tensors "
                        "of different types must agree (rename one)"
                    )
            merged = np.zeros((int(offsets[-1]), *first.shape[1:]), dtype=first.dtype)
            for i, arr in have:
                merged[int(offsets[i]) : int(offsets[i + 1])] = arr
            out[name] = merged
        return out

    def ntype_data_names(self) -> dict[str, list[str]]:
        return {t: sorted(self._ndata[t].data) for t in self._ntypes}

    def etype_data_names(self) -> dict[str, list[str]]:
        return {":".join(c): sorted(self._edata[c].data) for c in self._canon}

    def __repr__(self) -> str:
        return (
            f"HeteroGraph(num_nodes={dict(self._num_nodes)}, "
            f"num_edges={ {c: int(self._edges[c][0].size) for c in self._canon} })"
        )


def heterograph(
    data_dict: Mapping[CanonicalEType, tuple[Any, Any]],
    num_nodes_dict: Mapping[str, int] | None = None,
    idtype: Any = None,
    device: Any = None,
) -> HeteroGraph:
    """``dgl.heterograph({(src_type, rel, dst_type): (src, dst)}, num_nodes_dict=)``."""
    return HeteroGraph(data_dict, num_nodes_dict)
