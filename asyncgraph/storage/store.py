"""PartitionStore: one partition's in-edges (CSC) and named tensors, with validated access.

The server owns a store and calls it from its event loop; standalone mode and co-located
trainers call it in-process. With ``shared=True`` every array lives in a memfd (``SharedArray``)
so co-located processes map the same memory (``sharing.export`` on the server,
``AttachedStore.attach`` on the client) and read/write it without the socket, under one lock
(pulls read, pushes write). A rejection (``InvalidRequestError``) changes nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from asyncgraph.errors import (
    InvalidRequestError,
    ShapeMismatchError,
    TensorExistsError,
    UnknownTensorError,
)
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.accumulate import assign_rows, scatter_add
from asyncgraph.storage.initializers import InitSpec, validate_init
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import Policy, TensorMeta, check_policy
from asyncgraph.storage.protect import TensorRules
from asyncgraph.storage.rwlock import LocalRWLock, RWLock, SharedRWLock
from asyncgraph.storage.tensors import (
    PendingTensor,
    StoredTensor,
    TensorAccess,
    check_dtype,
    check_features,
    check_structure,
    structure_memory,
)
from asyncgraph.storage.typed_edges import with_type_order

if TYPE_CHECKING:
    from asyncgraph.partition.reader import Partition
    from asyncgraph.storage.overlay import Overlay

__all__ = ["InitSpec", "PartitionStore", "PendingTensor", "Policy", "TensorMeta", "validate_init"]

#: The structure arrays every store holds, in this order.
STRUCTURE_KEYS = ("indptr", "indices", "eids")


class PartitionStore:
    """One partition's in-edges (CSC) and named tensors, in shared memory, with validated access.

    The server calls it from its event loop; standalone mode and co-located clients call it
    in-process. ``indptr``/``indices``/``eids`` are read-only. Tensor rows are sharded by
    policy: a "node" tensor holds rows ``node_range``, an "edge" tensor rows ``edge_range``.
    """

    graph_name: str
    part_id: int
    book: RangePartitionBook
    node_range: tuple[int, int]
    edge_range: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray
    #: A live graph's added and removed edges (``service/live.py``; None: never updated).
    overlay: Overlay | None = None

    def __init__(
        self,
        graph_name: str,
        part_id: int,
        book: RangePartitionBook,
        structure: Mapping[str, SharedArray | np.ndarray],
        lock: RWLock,
        *,
        shared: bool,
        attached: bool,
    ) -> None:
        """Low-level: use ``create``, ``from_partition`` or ``attach``."""
        self.graph_name = graph_name
        self.part_id = part_id
        self.book = book
        self.node_range = book.node_range(part_id)
        self.edge_range = book.edge_range(part_id)
        self._structure = dict(structure)
        self.indptr, self.indices, self.eids = (self._plain(self._structure[k]) for k in STRUCTURE_KEYS)
        self._lock = lock
        # our own locks are entered without a context manager on the pull path (one call less)
        self._read_pair = (lock.acquire_read, lock.release_read) if isinstance(lock, LocalRWLock) else None
        self._owner = f"graph {graph_name!r} partition {part_id}"
        self._shared = shared
        self._attached = attached
        self._tensors: dict[str, StoredTensor] = {}
        #: What requests may do with which tensor: the partition's own tensors (never deleted, no
        #: optimizer state), read-only ones, the tensor cap and the memory budget (``protect``).
        self.rules = TensorRules(self._owner)
        self._closed = False
        self._final_seals = True  # False while loading the partition's own tensors: see protect

    @staticmethod
    def _plain(a: SharedArray | np.ndarray) -> np.ndarray:
        return a.array if isinstance(a, SharedArray) else a

    # --- construction ----------------------------------------------------------------
    @classmethod
    def create(
        cls,
        graph_name: str,
        part_id: int,
        book: RangePartitionBook,
        indptr: np.ndarray,
        indices: np.ndarray,
        eids: np.ndarray,
        node_feats: Mapping[str, np.ndarray],
        edge_feats: Mapping[str, np.ndarray],
        *,
        shared: bool = True,
    ) -> PartitionStore:
        """Copy a partition (arrays may be memory-mapped files) into a new store.

        ``shared=True`` puts every array in a memfd; ``shared=False`` (standalone mode) keeps
        plain numpy arrays and cannot export. ``node_feats["feat"]`` becomes tensor
        ``"node:feat"`` (policy "node"), ``edge_feats["w"]`` becomes ``"edge:w"``.
        """
        struct_in = check_structure(book, part_id, indptr, indices, eids)
        feats = check_features(book, part_id, node_feats, edge_feats)
        structure, lock = structure_memory(f"asyncgraph.{graph_name}.p{part_id}", struct_in, shared=shared)
        store = cls(graph_name, part_id, book, structure, lock, shared=shared, attached=False)
        store._final_seals = False
        try:
            for name, policy, arr in feats:
                total = book.num_nodes if policy == "node" else book.num_edges
                meta = TensorMeta(name, policy, (total, *arr.shape[1:]), np.dtype(arr.dtype).name)
                t = store._allocate(meta)
                store._tensors[name] = t
                t.rows[...] = arr
                store.rules.base.add(name)
        except BaseException:
            store.close()
            raise
        finally:
            store._final_seals = True
        return store

    @classmethod
    def from_partition(cls, part: Partition, *, shared: bool = True) -> PartitionStore:
        """A store holding a loaded ``Partition`` (see ``asyncgraph.partition.reader``)."""
        return cls.create(
            part.config.graph_name,
            part.part_id,
            part.book,
            part.indptr,
            part.indices,
            part.eids,
            part.node_feats,
            with_type_order(part.edge_feats, part.edge_range[0]),  # per-type edge IDs' index
            shared=shared,
        )

    def _owned(self, policy: Policy) -> tuple[int, int]:
        return self.node_range if policy == "node" else self.edge_range

    def _allocate(self, meta: TensorMeta) -> StoredTensor:
        """Zeroed local rows for ``meta``, not registered."""
        lo, hi = self._owned(meta.policy)
        local_shape = (hi - lo, *meta.shape[1:])
        data: SharedArray | np.ndarray
        if self._shared:
            label = f"asyncgraph.{self.graph_name}.p{self.part_id}.{meta.name}"
            data = SharedArray.create(label, local_shape, meta.dtype, final=self._final_seals)
        else:
            data = np.zeros(local_shape, dtype=meta.dtype)
        return StoredTensor(meta, data, lo)

    def _register(self, meta: TensorMeta, data: SharedArray | np.ndarray) -> StoredTensor:
        """Make ``data`` (this partition's rows) tensor ``meta.name``."""
        t = StoredTensor(meta, data, self._owned(meta.policy)[0])
        self._tensors[meta.name] = t
        return t

    # --- tensor management ---------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError(
                f"store of graph {self.graph_name!r} partition {self.part_id} is closed"
            )

    def create_tensor(
        self, name: str, policy: Policy, shape: Sequence[int], dtype: str, init: InitSpec | None = None
    ) -> TensorMeta:
        """Create a tensor (idempotent: same name, policy, shape and dtype returns the existing one).

        ``shape`` is GLOBAL: ``shape[0]`` must be the graph's num_nodes/num_edges for the policy.
        """
        pending = self.begin_create(name, policy, shape, dtype, init)
        if isinstance(pending, TensorMeta):
            return pending
        pending.fill()
        return self.finish_create(pending)

    def begin_create(
        self, name: str, policy: Policy, shape: Sequence[int], dtype: str, init: InitSpec | None = None
    ) -> TensorMeta | PendingTensor:
        """Validate a create and allocate its rows unregistered (the existing meta if identical).

        The caller runs ``PendingTensor.fill`` (anywhere: it touches only the new rows, so a
        server runs a big init in a worker thread) and then ``finish_create``; until then the
        tensor does not exist for anyone else.
        """
        self._check_open()
        if self._attached:
            raise InvalidRequestError(
                f"cannot create tensor {name!r} on an attached store: create it through the server"
            )
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"tensor name must be a non-empty string, got {name!r}")
        policy = check_policy(policy)
        try:
            shape_t = tuple(operator.index(d) for d in shape)
        except TypeError as exc:
            raise ShapeMismatchError(
                f"tensor {name!r}: shape must be a sequence of integers, got {shape!r}"
            ) from exc
        dt = check_dtype(dtype, f"tensor {name!r}")
        total = self.book.num_nodes if policy == "node" else self.book.num_edges
        if not shape_t or shape_t[0] != total or any(d < 0 for d in shape_t):
            raise ShapeMismatchError(
                f"tensor {name!r}: shape {list(shape_t)} must start with the number of {policy}s "
                f"in the graph ({total}) and have no negative dimensions"
            )
        meta = TensorMeta(name, policy, shape_t, dt.name)
        existing = self._existing(meta)
        if existing is not None:
            return existing
        self.rules.check_create(meta, self._tensors.values(), self._owned(meta.policy))
        spec = validate_init(init, dt)
        return PendingTensor(self._allocate(meta), spec)

    def finish_create(self, pending: PendingTensor) -> TensorMeta:
        """Register a filled ``PendingTensor`` (or, if the same tensor appeared meanwhile, drop it)."""
        t = pending.tensor
        try:
            self._check_open()
            existing = self._existing(t.meta)
        except BaseException:
            pending.discard()
            raise
        if existing is not None:
            pending.discard()
            return existing
        self._tensors[t.meta.name] = t
        self.catalog_changed()
        return t.meta

    def _existing(self, meta: TensorMeta) -> TensorMeta | None:
        """The meta of tensor ``meta.name`` if it exists as ``meta``; TensorExistsError if otherwise."""
        existing = self._tensors.get(meta.name)
        if existing is None:
            return None
        if existing.meta == meta:
            return existing.meta
        raise TensorExistsError(
            f"tensor {meta.name!r} exists as {_describe(existing.meta)}; requested {_describe(meta)}"
        )

    def delete_tensor(self, name: str) -> None:
        """Delete a tensor and free its memory (co-located mappings stay valid until dropped)."""
        self._check_open()
        if self._attached:
            raise InvalidRequestError(
                f"cannot delete tensor {name!r} on an attached store: delete it through the server"
            )
        self._get(name)
        self.rules.check_delete(name)
        self._drop(name)  # in-flight pulls keep their view alive: unmapped when they finish
        self.catalog_changed()

    def catalog_changed(self) -> None:
        """Tell processes mapping this store that a tensor came or went (owner only)."""
        if not self._attached and isinstance(self._lock, SharedRWLock):
            self._lock.advance_generation()

    @property
    def catalog_generation(self) -> int:
        """How many tensor creations and deletions the owner has counted (shared stores)."""
        return self._lock.generation if isinstance(self._lock, SharedRWLock) else 0

    def _drop(self, name: str) -> None:
        t = self._tensors.pop(name)
        if isinstance(t.data, SharedArray):
            t.data.close()

    def _get(self, name: str) -> StoredTensor:
        t = self._tensors.get(name)
        if t is None:
            self._check_open()
            have = ", ".join(sorted(self._tensors)) or "none"
            raise UnknownTensorError(
                f"no tensor {name!r} in graph {self.graph_name!r} partition {self.part_id} (have: {have})"
            )
        return t

    def tensor_meta(self, name: str) -> TensorMeta:
        """The tensor's metadata; UnknownTensorError lists what exists."""
        return self._get(name).meta

    def list_tensors(self) -> list[TensorMeta]:
        return [t.meta for t in self._tensors.values()]

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def local_sizes(self) -> dict[str, tuple[int, int]]:
        """``name -> (rows, bytes)`` this partition holds of each tensor (for metrics)."""
        return {name: (t.rows.shape[0], t.rows.nbytes) for name, t in list(self._tensors.items())}

    # --- data access ------------------------------------------------------------------------
    def _entry(self, name: str) -> TensorAccess:
        """The published tensor's access record (UnknownTensorError like ``_get``)."""
        t = self._tensors.get(name)
        if t is None:
            t = self._get(name)  # raises
        acc: TensorAccess | None = t.access
        if acc is None:
            acc = t.access = TensorAccess(t, self._owned(t.meta.policy), self._owner)
        return acc

    def row_bytes(self, name: str) -> int:
        """Bytes of one row of tensor ``name`` (UnknownTensorError lists what exists)."""
        return self._entry(name).row_bytes

    def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows for global ``ids`` (owned by this partition) as a NEW array ``[len(ids), *row_shape]``."""
        acc = self._entry(name)
        local, rows, pair = acc.check(ids)[0], acc.rows, self._read_pair
        if pair is None:
            with self._lock.read():
                return rows.take(local, axis=0)
        pair[0]()
        try:
            return rows.take(local, axis=0)
        finally:
            pair[1]()

    def pull_into(self, name: str, ids: np.ndarray, out: np.ndarray, where: np.ndarray | None) -> int:
        """``pull`` straight into ``out[where]`` (``out[:len(ids)]``), a copy a row: the bytes copied."""
        from asyncgraph.kernels.gather import gather_into  # kernels import this module

        acc = self._entry(name)
        with self._lock.read():
            return gather_into(acc.rows, acc.check(ids)[0], out, where)

    def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str = "assign") -> None:
        """Write rows: ``op="assign"`` (duplicate IDs: last wins) or ``"add"`` (duplicates accumulate).

        ``values`` must have exactly the tensor's dtype and shape ``(len(ids), *row_shape)``.
        Everything is validated before the write lock is taken and data touched.
        """
        acc = self._entry(name)
        if op not in ("assign", "add"):
            raise InvalidRequestError(
                f"unknown push op {op!r} for tensor {name!r}; expected 'assign' or 'add'"
            )
        local, vals = acc.check(ids, values)
        self.rules.check_write(name)
        if local.size == 0:
            return
        rows = acc.rows
        with self._lock.write():
            if op == "assign":
                assign_rows(rows, local, vals)
            else:
                scatter_add(rows, local, vals)

    def protect(self, *, writable_base: bool = False) -> None:
        """Make the partition's own tensors read-only for every later ``push``, unless
        ``writable_base`` (DGL's writable ``ndata``). They can never be deleted either way."""
        self.rules.protect(self._tensors, writable_base=writable_base)
        self.catalog_changed()

    def local_rows(self, name: str) -> np.ndarray:
        """The owned-rows array itself (writable; hold ``lock`` while using it)."""
        return self._get(name).rows

    @property
    def lock(self) -> RWLock:
        """The store's reader/writer lock (cross-process when shared)."""
        return self._lock

    shared = property(lambda self: self._shared, doc="Whether the arrays are memfds.")
    attached = property(lambda self: self._attached, doc="Whether mapped from another process.")

    # --- what sharing needs (asyncgraph.storage.sharing exports; AttachedStore maps) -----
    def check_open(self) -> None:
        """``InvalidRequestError`` once the store is closed."""
        self._check_open()

    @property
    def structure_arrays(self) -> Mapping[str, SharedArray | np.ndarray]:
        """``indptr``, ``indices``, ``eids`` as stored (memfds in a shared store)."""
        return self._structure

    def stored(self, name: str) -> StoredTensor:
        """Tensor ``name`` as stored (its meta and this partition's rows)."""
        return self._get(name)

    def tensor_names(self) -> list[str]:
        """Every tensor's stored key, in creation order."""
        return list(self._tensors)

    def owned_range(self, policy: Policy) -> tuple[int, int]:
        """The global IDs whose rows this partition holds for tensors of ``policy``."""
        return self._owned(policy)

    def map_rows(self, meta: TensorMeta, data: SharedArray | np.ndarray) -> None:
        """Make ``data`` (this partition's rows, e.g. mapped from an owner's memfd) tensor
        ``meta.name``, replacing a tensor of that name."""
        if meta.name in self._tensors:
            self._drop(meta.name)
        self._register(meta, data)

    def unmap(self, name: str) -> None:
        """Forget tensor ``name`` here (in-flight pulls keep their view until they finish)."""
        self._drop(name)

    def close(self) -> None:
        """Release every mapping and fd this store holds; idempotent.

        Arrays the caller still references (from ``local_rows``) stay valid until dropped.
        """
        if self._closed:
            return
        self._closed = True
        for name in list(self._tensors):
            self._drop(name)
        empty = np.empty(0, dtype=np.int64)
        self.indptr = self.indices = self.eids = empty
        for a in self._structure.values():
            if isinstance(a, SharedArray):
                a.close()
        self._structure.clear()
        if self.overlay is not None:
            self.overlay.close()
        if isinstance(self._lock, SharedRWLock):
            self._lock.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> PartitionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "attached" if self._attached else ("shared" if self._shared else "local")
        return (
            f"PartitionStore(graph={self.graph_name!r}, part={self.part_id}, {kind}, "
            f"tensors={sorted(self._tensors)})"
        )


def _describe(meta: TensorMeta) -> str:
    return f"policy={meta.policy} shape={list(meta.shape)} dtype={meta.dtype}"
