"""Heterogeneous views of a ``DistGraph``: per-type tensors and per-edge-type sampling.

Partitions of a heterogeneous graph hold one homogeneous ID space in which each partition's
nodes of a type are contiguous (``asyncgraph.partition.partitioner``); the partition book maps
per-type IDs to homogeneous ones and back. A partitioned tensor is stored per (type, name)
(``"paper/feat"``: that type's rows only, ``asyncgraph.partition.typed``) and addressed by the
homogeneous IDs of its type's nodes, so ``g.nodes[ntype].data[name]`` translates per-type IDs
through the book before every pull or push (tensors made at run time, and partitions written
before per-type storage, hold one tensor over every node, addressed the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch

from asyncgraph.arrays import as_id_array
from asyncgraph.client.sync_client import Client
from asyncgraph.errors import InvalidRequestError, OutOfRangeError, UnknownTensorError, UnknownTypeError
from asyncgraph.names import typed_name
from asyncgraph.partition.book import RangePartitionBook

from .tensor import DistTensor

__all__ = ["HeteroSample", "NodeTypeTensor", "etype_fanouts", "sample_etype_neighbors"]

CanonicalEType = tuple[str, str, str]


class GraphLike(Protocol):
    """What the helpers here need of a ``DistGraph``: its client and partition book."""

    @property
    def client(self) -> Client: ...

    def get_partition_book(self) -> RangePartitionBook: ...


class NodeTypeTensor:
    """A node tensor seen through one node type's IDs (``g.nodes[ntype].data[name]``)."""

    def __init__(self, tensor: DistTensor, book: RangePartitionBook, ntype: str) -> None:
        self._tensor, self.book, self.ntype = tensor, book, ntype
        self._len = book.num_nodes_of(ntype)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self._len, *self._tensor.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self._tensor.dtype

    @property
    def name(self) -> str:
        return self._tensor.name

    def __len__(self) -> int:
        return self._len

    def _homo(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            ids = np.arange(*index.indices(self._len), dtype=np.int64)
        else:
            ids = as_id_array(index, "ids")
        if ids.size and int(ids.min()) < 0:
            raise OutOfRangeError(f"{self.ntype} node ID {int(ids.min())} is negative")
        return self.book.map_to_homo_nid(ids, self.ntype)  # past the base: added nodes (owners check)

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self._tensor[self._homo(index)]

    def __setitem__(self, index: Any, values: Any) -> None:
        self._tensor[self._homo(index)] = values

    def push(self, ids: Any, values: Any, op: str = "assign") -> None:
        self._tensor.push(self._homo(ids), values, op)

    def __repr__(self) -> str:
        return f"NodeTypeTensor({self.name!r}, ntype={self.ntype!r}, shape={self.shape})"


class _NodeTypeData(Mapping[str, NodeTypeTensor]):
    """``g.nodes[ntype].data``: the type's own tensors (``"<ntype>/<name>"``, stored per type),
    else, in partitions written before per-type storage, the merged tensors the type has."""

    def __init__(self, ndata: Any, book: RangePartitionBook, ntype: str) -> None:
        self._ndata, self._book, self._ntype = ndata, book, ntype

    def __getitem__(self, name: str) -> NodeTypeTensor:
        meta = self._ndata.meta_of(typed_name(self._ntype, name)) if isinstance(name, str) else None
        if meta is not None:
            return NodeTypeTensor(DistTensor._attach(self._ndata.client, meta), self._book, self._ntype)
        if not self._book.ntype_has(self._ntype, name) or name not in self._ndata:
            raise UnknownTensorError(f"node type {self._ntype!r} has no tensor {name!r}; it has {list(self)}")
        return NodeTypeTensor(self._ndata[name], self._book, self._ntype)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in list(self)

    def __iter__(self) -> Any:
        merged = [n for n in self._ndata if self._book.ntype_has(self._ntype, n)]
        return iter(sorted(set(merged) | set(self._ndata.typed_names(self._ntype))))

    def __len__(self) -> int:
        return len(list(iter(self)))


class _TypeData:
    def __init__(self, data: Any) -> None:
        self.data = data


class NodeTypes:
    """``g.nodes[ntype].data[name]``: a graph's node tensors seen through one type's IDs."""

    def __init__(self, ndata: Mapping[str, DistTensor], book: RangePartitionBook) -> None:
        self._ndata, self._book = ndata, book

    def __getitem__(self, ntype: str) -> _TypeData:
        self._book.ntype_id(ntype)  # UnknownTypeError for an unknown type
        return _TypeData(_NodeTypeData(self._ndata, self._book, ntype))


def etype_fanouts(book: RangePartitionBook, fanout: Any) -> np.ndarray:
    """One fanout per canonical edge type from an int or a dict keyed by edge types."""
    canon = book.canonical_etypes
    if isinstance(fanout, Mapping):
        out = np.zeros(len(canon), dtype=np.int64)  # edge types not named get no edges, as DGL
        for key, value in fanout.items():
            out[book.etype_id(key)] = int(value)
        return out
    if isinstance(fanout, bool) or not isinstance(fanout, int | np.integer):
        raise InvalidRequestError(f"fanout must be an int or a dict per edge type, got {fanout!r}")
    return np.full(len(canon), int(fanout), dtype=np.int64)


def seeds_to_homo(book: RangePartitionBook, seeds: Any) -> np.ndarray:
    """Homogeneous IDs of ``{ntype: per-type IDs}`` seeds, types in the dict's order."""
    if not isinstance(seeds, Mapping):
        if book.is_hetero and len(book.ntypes) > 1:
            raise InvalidRequestError(
                f"seeds of a heterogeneous graph must be a dict {{ntype: ids}}; node types: {book.ntypes}"
            )
        return as_id_array(seeds, "seeds")
    bad = [k for k in seeds if k not in book.ntypes]
    if bad:
        raise UnknownTypeError(f"seeds: unknown node type(s) {bad}; known: {book.ntypes}")
    parts = [book.map_to_homo_nid(as_id_array(v, f"seeds[{k!r}]"), k) for k, v in seeds.items()]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


class HeteroSample:
    """Per-edge-type sampled edges: ``sample[etype]`` is ``(src, dst, eid)`` in per-type IDs.

    ``homo`` keeps the homogeneous ``(src, dst, eid)`` the servers returned and ``etype_index``
    each edge's type, which is what block construction uses.
    """

    def __init__(self, book: RangePartitionBook, out: Mapping[str, np.ndarray]) -> None:
        self.book = book
        self.homo = (out["src"], out["dst"], out["eids"])
        self.etype_index = out["etype"]
        self.type_eid = out["type_eid"]

    @property
    def canonical_etypes(self) -> list[CanonicalEType]:
        return self.book.canonical_etypes

    def __getitem__(self, etype: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = self.book.etype_id(etype)
        mask = self.etype_index == r
        _, src = self.book.map_to_per_ntype(self.homo[0][mask])
        _, dst = self.book.map_to_per_ntype(self.homo[1][mask])
        return torch.from_numpy(src), torch.from_numpy(dst), torch.from_numpy(self.type_eid[mask])

    def num_edges(self, etype: Any = None) -> int:
        if etype is None:
            return int(self.etype_index.size)
        return int((self.etype_index == self.book.etype_id(etype)).sum())


def sample_etype_neighbors(
    graph: GraphLike, seeds: Any, fanout: Any, *, seed: int | None = None, prob: str | None = None
) -> HeteroSample:
    """In-edges of ``{ntype: ids}`` seeds with a fanout per edge type (an int or a dict), sampled
    by the owners' servers; returns a :class:`HeteroSample`."""
    book = graph.get_partition_book()
    gids = seeds_to_homo(book, seeds)
    out = graph.client.sample_etypes(gids, etype_fanouts(book, fanout), seed=seed, prob=prob)
    return HeteroSample(book, out)
