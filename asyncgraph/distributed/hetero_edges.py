"""Per-type edge tensors of a heterogeneous ``DistGraph``: ``g.edges[etype].data[name]``.

A partitioned edge tensor is stored per edge type (``"src:rel:dst/w"``, that type's edges
only), so a typed view is a ``DistTensor`` whose ``etype`` is set: its per-type IDs become
positions in each part's type order (``book.type_order_positions``, arithmetic) before every
pull or push. Tensors made at run time (and partitions written before per-type storage) are
stored over every edge: their per-type IDs are mapped to homogeneous ones
(``book.map_to_homo_eid``). Either way, exactly the rows DGL's per-type tensors hold. ``g.edges`` is also
callable as DGL's ``g.edges(form=, order=, etype=)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import to_numpy
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError, UnknownTensorError
from asyncgraph.names import typed_name
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.partition.typed import edge_type_key

from .tensor import DistTensor, numpy_dtype

__all__ = ["EdgeTypeData", "EdgeTypes", "EdgeView"]

CanonicalEType = tuple[str, str, str]


class EdgeTypeData(MutableMapping[str, DistTensor]):
    """``g.edges[etype].data``: name -> a ``DistTensor`` indexed by ``etype``'s per-type IDs.

    Reading gives the partitioned tensor of that type (or one set here); setting a
    ``DistTensor`` of this type adds it (DGL's ``g.edges[etype].data[name] = DistTensor(...)``);
    setting a tensor or array of ``num_edges(etype)`` rows creates the ``DistTensor`` ``name``
    and writes them (every type setting ``name`` shares one stored tensor, as partitioned ones).
    """

    def __init__(self, types: EdgeTypes, etype: CanonicalEType) -> None:
        self._types, self.etype = types, etype

    @property
    def _book(self) -> RangePartitionBook:
        return self._types.book

    def __getitem__(self, name: str) -> DistTensor:
        alias = self._types.aliases.get((self.etype, name))
        if alias is not None:
            return alias
        meta = self._types.edata.meta_of(typed_name(edge_type_key(self.etype), name))  # stored per type
        if meta is None:
            if name not in self:
                raise UnknownTensorError(
                    f"edge type {self.etype} has no tensor {name!r}; it has {list(self)}"
                )
            meta = self._types.edata[name].meta  # a merged tensor (partitions before per-type storage)
        out = DistTensor._attach(self._types.client, meta)
        out.etype = self.etype
        return out

    def __setitem__(self, name: str, value: Any) -> None:
        book = self._book
        n = book.num_edges_of(self.etype)
        if isinstance(value, DistTensor):
            if value.etype != self.etype:
                raise InvalidRequestError(
                    f"{value!r} is not a tensor of edge type {self.etype}: create it with "
                    f"part_policy=g.get_edge_partition_policy({self.etype!r})"
                )
            self._types.aliases[(self.etype, name)] = value
            return
        rows = to_numpy(value)
        if rows.ndim == 0 or rows.shape[0] != n:
            raise ShapeMismatchError(
                f"edge type {self.etype} has {n} edges: {name!r} needs {n} rows, got shape {rows.shape}"
            )
        policy = self._types.policy(self.etype)
        tensor = DistTensor(
            rows.shape, numpy_dtype(rows.dtype), name, part_policy=policy, client=self._types.client
        )
        tensor[slice(None)] = rows
        self._types.aliases[(self.etype, name)] = tensor

    def __delitem__(self, name: str) -> None:
        if self._types.aliases.pop((self.etype, name), None) is None:
            raise UnknownTensorError(f"edge type {self.etype} has no tensor {name!r} set at run time")

    def _names(self) -> list[str]:
        book = self._book
        mine = {name for (c, name) in self._types.aliases if c == self.etype}
        others = {name for (c, name) in self._types.aliases if c != self.etype} - mine  # set here for others
        stored = {n for n in self._types.edata if book.etype_has(self.etype, n)} - others
        typed = set(self._types.edata.typed_names(edge_type_key(self.etype))) - others
        return sorted(stored | typed | mine)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


class _TypeData:
    def __init__(self, data: EdgeTypeData) -> None:
        self.data = data


class EdgeTypes:
    """``g.edges[etype]``: one edge type's tensors (``.data``), by relation name or triple."""

    def __init__(
        self, edata: Any, book: RangePartitionBook, client: Any, policy: Any
    ) -> None:
        self.edata, self.book, self.client = edata, book, client
        self.policy: Callable[[CanonicalEType], Any] = policy
        self.aliases: dict[tuple[CanonicalEType, str], DistTensor] = {}

    def __getitem__(self, etype: Any) -> Any:
        book = self.book
        c = book.canonical_etypes[book.etype_id(etype)]  # UnknownTypeError for an unknown type
        if not book.is_hetero:
            return _TypeData(self.edata)
        return _TypeData(EdgeTypeData(self, c))


class EdgeView:
    """``g.edges``: ``g.edges(form=, order=, etype=)`` lists edges, ``g.edges[etype].data``
    holds one type's tensors (DGL's ``EdgeView``)."""

    def __init__(self, types: EdgeTypes, list_edges: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        self._types, self._list = types, list_edges

    def __call__(self, form: str = "uv", order: str = "eid", etype: Any = None) -> tuple[torch.Tensor, ...]:
        return self._list(form, order, etype)

    def __getitem__(self, etype: Any) -> Any:
        return self._types[etype]


def typed_endpoints(
    book: RangePartitionBook, src: np.ndarray, dst: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-type node IDs of homogeneous endpoints (one edge type: one type per side)."""
    _, s = book.map_to_per_ntype(src)
    _, d = book.map_to_per_ntype(dst)
    return torch.from_numpy(s), torch.from_numpy(d)
