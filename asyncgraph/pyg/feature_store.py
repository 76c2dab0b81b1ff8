"""PyG's remote-backend ``FeatureStore`` over a ``DistGraph``: node tensors served by asyncgraph.

Keys are PyG's ``TensorAttr(group_name, attr_name, index)``: ``group_name`` is the node type of a
heterogeneous graph (``None`` for a homogeneous one), ``attr_name`` a node tensor and ``index``
the rows (``None`` = every row of the group). A tensor named ``x`` or ``y`` is read as is;
where there is none, PyG's conventional names are aliases of ours: ``x`` reads ``feat`` and
``y`` reads ``label``, so PyG code runs on asyncgraph partitions unchanged. On a heterogeneous
graph a node type that was not given a tensor has none (``fs["author", "y"]`` on a graph
labelling papers only raises ``UnknownTensorError``, a ``KeyError``, naming the types that have
it; before, the zero rows stored for it were returned). Every read goes through the client's
one pull path (split by owner, all servers at once); ``multi_get_tensor`` gathers every
attribute of a batch in one concurrent wave. A read whose rows would take more than
``max_get_bytes`` (default: half the memory available when it is asked) is refused before
anything is allocated or sent (issue 32: a 2e8-row index was a ``MemoryError`` deep in the pull
path), as a typed ``MemoryBudgetError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.data import FeatureStore, TensorAttr

from asyncgraph.arrays import as_id_array
from asyncgraph.dataloading.fetch import client_of
from asyncgraph.errors import (
    DTypeMismatchError,
    MemoryBudgetError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownTensorError,
    UnknownTypeError,
)
from asyncgraph.names import node_key, tensor_prefix, typed_name

from .attrs import PYG_ALIASES, node_tensors
from .link import ClientLink, LinkedStore

__all__ = ["PYG_ALIASES", "DistFeatureStore"]


class DistFeatureStore(LinkedStore, FeatureStore):  # type: ignore[misc]
    """PyG ``FeatureStore`` whose tensors are a ``DistGraph``'s node tensors.

    ``attrs`` names the PyG attributes ``get_all_tensor_attrs`` lists (what PyG's loaders fetch
    for every batch); by default ``x``/``y`` (for ``feat``/``label``) and every other node
    tensor under its own name, or only ``x`` on a heterogeneous graph, for the types that have
    it (PyG's loaders give every listed attribute of a type the sampler's ``x`` rows; labels of
    the seed type reach a batch through the sampler). Any node tensor can still be read by name.
    Picklable and fork-safe (``link.py``): PyG's loaders may use it in ``num_workers`` processes.
    """

    def __init__(self, g: Any, attrs: Sequence[str] | None = None, max_get_bytes: int | None = None) -> None:
        """``max_get_bytes``: the most bytes of rows one ``get_tensor`` / ``multi_get_tensor``
        returns (None: half the memory available at the time of the call)."""
        super().__init__()
        self.max_get_bytes = max_get_bytes
        self._graph: Any = g
        self._link = ClientLink(client_of(g))
        self.hetero = bool(self.book.is_hetero)
        if attrs is not None:
            for a in attrs:
                self._tensor_name(a)  # UnknownTensorError now, not on the first batch
        self._attrs = None if attrs is None else list(attrs)
        self._created: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_created"] = []
        return state

    # --- names ------------------------------------------------------------------------------
    def _node_tensors(self) -> list[str]:
        return node_tensors(self.client)

    def _tensor_name(self, attr_name: Any) -> str:
        """Our tensor behind PyG's ``attr_name`` (``UnknownTensorError`` listing what exists)."""
        if not isinstance(attr_name, str):
            raise DTypeMismatchError(f"attr_name must be a str, got {attr_name!r}")
        key = tensor_prefix("node") + attr_name
        if self.client.async_client.cached_meta(key) is not None:
            return attr_name
        if self.hetero and any(self._key(t, attr_name) != key for t in self.book.ntypes):
            return attr_name  # stored per type
        alias = PYG_ALIASES.get(attr_name)
        if alias is not None and self.client.async_client.cached_meta(node_key(alias)) is not None:
            return alias
        have = self._node_tensors()  # refreshes the catalog: a tensor made elsewhere is found
        if attr_name in have:
            return attr_name
        if alias is not None and alias in have:
            return alias
        raise UnknownTensorError(
            f"no node tensor {attr_name!r}"
            + (f" (nor {alias!r}, its asyncgraph name)" if alias else "")
            + f"; node tensors: {have}"
        )

    def _group(self, group_name: Any) -> str | None:
        """The node type of ``group_name`` (``None`` on a homogeneous graph)."""
        if not self.hetero:
            if group_name not in (None, "_N"):
                raise UnknownTypeError(f"group_name {group_name!r}: the graph is homogeneous (use None)")
            return None
        if group_name not in self.book.ntypes:
            raise UnknownTypeError(f"unknown node type {group_name!r}; node types: {self.book.ntypes}")
        return str(group_name)

    def _key(self, ntype: str | None, name: str) -> str:
        """The stored key of ``name`` for node type ``ntype``: its per-type tensor
        (``"node:paper/x"``) when the graph stores one, else the tensor over every node."""
        if ntype is not None:
            typed = node_key(typed_name(ntype, name))
            if self.client.async_client.cached_meta(typed) is not None:
                return typed
        return node_key(name)

    def _check_type_has(self, ntype: str | None, attr_name: str, name: str) -> None:
        """``UnknownTensorError`` when node type ``ntype`` was not given tensor ``name``."""
        if ntype is None or self.book.ntype_has(ntype, name):
            return
        having = [t for t in self.book.ntypes if self.book.ntype_has(t, name)]
        shown = attr_name if attr_name == name else f"{attr_name} ({name})"
        raise UnknownTensorError(f"node type {ntype!r} has no tensor {shown}; node types with it: {having}")

    def _num_rows(self, ntype: str | None) -> int:
        return self.book.num_nodes if ntype is None else self.book.num_nodes_of(ntype)

    def _ids(self, attr: TensorAttr, ntype: str | None) -> np.ndarray:
        """Global (homogeneous) row IDs of ``attr.index`` in group ``ntype``, range-checked."""
        n = self._num_rows(ntype)
        index = attr.index
        if index is None:
            ids = np.arange(n, dtype=np.int64)
        elif isinstance(index, slice):
            ids = np.arange(*index.indices(n), dtype=np.int64)
        else:
            arr = index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
            if arr.dtype == bool:
                if arr.shape != (n,):
                    raise ShapeMismatchError(f"a boolean index must have shape ({n},), got {arr.shape}")
                arr = np.flatnonzero(arr)
            ids = as_id_array(arr, "index")
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                what = f"{ntype} node" if ntype else "node"
                raise OutOfRangeError(f"index: {what} ID {bad} out of range [0, {n})")
        return ids if ntype is None else self.book.map_to_homo_nid(ids, ntype)

    # --- PyG's interface --------------------------------------------------------------------
    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        """Every attribute's rows in one wave: all pulls run concurrently on the client's loop."""
        keys: list[tuple[str, np.ndarray]] = []
        for attr in attrs:  # validate everything before any request is sent
            ntype = self._group(attr.group_name)
            name = self._tensor_name(attr.attr_name)
            self._check_type_has(ntype, attr.attr_name, name)
            keys.append((self._key(ntype, name), self._ids(attr, ntype)))
        self._check_size(keys)
        aio = self.client.async_client

        async def pull_all() -> list[np.ndarray]:
            return list(await asyncio.gather(*(aio.pull_numpy(k, ids) for k, ids in keys)))

        return [torch.from_numpy(a) for a in self.client.loop.run(pull_all())]

    def _check_size(self, keys: list[tuple[str, np.ndarray]]) -> None:
        """Refuse a read whose rows would not fit ``max_get_bytes``, before any is allocated."""
        sizes = []
        for key, ids in keys:
            meta = self.client.async_client.cached_meta(key)
            assert meta is not None  # _tensor_name found it
            row = int(np.prod(meta.row_shape, dtype=np.int64)) * np.dtype(meta.dtype).itemsize
            sizes.append(int(ids.size) * row)
        limit = self.max_get_bytes
        if limit is None:
            import psutil

            limit = int(psutil.virtual_memory().available) // 2
        if sum(sizes) > limit:
            rows = sum(int(ids.size) for _, ids in keys)
            raise MemoryBudgetError(
                f"get_tensor: {rows} rows of {len(keys)} tensor(s) would take {sum(sizes)} bytes, over this "
                f"store's limit of {limit} bytes (max_get_bytes; default half the memory available); "
                "read the rows in batches"
            )

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        """Write rows of an existing tensor, or (index ``None``, homogeneous) create a new one."""
        values = tensor.detach().cpu() if isinstance(tensor, torch.Tensor) else torch.as_tensor(tensor)
        ntype = self._group(attr.group_name)
        try:
            name = self._tensor_name(attr.attr_name)
        except UnknownTensorError:
            if attr.index is not None or ntype is not None:
                raise
            return self._create(str(attr.attr_name), values)
        self._check_type_has(ntype, attr.attr_name, name)
        ids = self._ids(attr, ntype)
        if values.shape[0] != ids.size:
            raise ShapeMismatchError(f"{values.shape[0]} rows given for {ids.size} indices")
        self.client.push(self._key(ntype, name), ids, values.numpy())
        return True

    def update_tensor(self, tensor: Any, *args: Any, **kwargs: Any) -> bool:
        """Overwrite the rows ``index`` in place (PyG's default removes the whole tensor first)."""
        attr = self._tensor_attr_cls.cast(*args, **kwargs)
        return self._put_tensor(tensor, attr)

    def _create(self, name: str, values: torch.Tensor) -> bool:
        from asyncgraph.distributed import DistTensor

        if values.dim() < 1 or values.shape[0] != self.book.num_nodes:
            raise ShapeMismatchError(
                f"a new node tensor {name!r} needs {self.book.num_nodes} rows, "
                f"got shape {tuple(values.shape)}"
            )
        t = DistTensor(tuple(values.shape), values.dtype, name, persistent=True, client=self.client)
        self._created.append(t)  # the handle keeps it alive for this store's lifetime
        t[0 : self.book.num_nodes] = values
        return True

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        """Delete the node tensor on every server (PyG: ``False`` if there was none)."""
        self._group(attr.group_name)
        try:
            name = self._tensor_name(attr.attr_name)
        except UnknownTensorError:
            return False
        key = self._key(self._group(attr.group_name), name)
        self.client.loop.run(self.client.async_client.delete_tensor(key))
        return True

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        ntype = self._group(attr.group_name)
        name = self._tensor_name(attr.attr_name)
        self._check_type_has(ntype, attr.attr_name, name)
        meta = self.client.async_client.cached_meta(self._key(ntype, name))
        assert meta is not None  # _tensor_name found it
        return (self._num_rows(ntype), *meta.row_shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """The attributes PyG's loaders fetch for a batch (see the class docstring)."""
        have = self._node_tensors()
        if self._attrs is not None:
            names = list(self._attrs)
        elif self.hetero:
            names = ["x"] if PYG_ALIASES["x"] in have or "x" in have else []
        else:
            shown = {a: PYG_ALIASES[a] for a in PYG_ALIASES if a not in have and PYG_ALIASES[a] in have}
            names = list(shown) + [n for n in have if n not in shown.values()]
        if not self.hetero:
            return [TensorAttr(group_name=None, attr_name=n, index=None) for n in names]
        book = self.book
        return [
            TensorAttr(group_name=t, attr_name=n, index=None)
            for t in book.ntypes
            for n in names
            if book.ntype_has(t, self._tensor_name(n))
        ]

    def __repr__(self) -> str:
        return f"DistFeatureStore({self.graph!r})"
