"""PartitionStore: one partition's in-edges (CSC) and named tensors, with validated access.

The server owns a store and calls it from its event loop; standalone mode and co-located
trainers call it in-process. The partition's own arrays are served read-only from their
``.npy`` files (``FileArray``, issue 34); with ``shared=True`` everything else (tensors made at
run time, partition data copied to be written) lives in a memfd (``SharedArray``), so
co-located processes map the same memory and pages (``sharing.export`` on the server,
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
    OutOfRangeError,
    ReadOnlyTensorError,
    ShapeMismatchError,
    TensorExistsError,
)
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.accumulate import assign_rows, scatter_add
from asyncgraph.storage.filemap import FileArray, is_file_backed
from asyncgraph.storage.initializers import InitSpec, validate_init
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import Policy, TensorMeta, check_policy
from asyncgraph.storage.store_base import STRUCTURE_KEYS, StoreBase
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

__all__ = [
    "STRUCTURE_KEYS",
    "InitSpec",
    "PartitionStore",
    "PendingTensor",
    "Policy",
    "TensorMeta",
    "validate_init",
]


class PartitionStore(StoreBase):
    """One partition's in-edges (CSC) and named tensors, with validated access (``StoreBase``
    holds them). The server calls it from its event loop; standalone mode and co-located
    clients call it in-process.
    """

    #: False for a graph partitioned with ``multigraph=False``: ``add_edges`` refuses parallel edges.
    multigraph = True

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
        files: Mapping[str, str] | None = None,
    ) -> PartitionStore:
        """A store of a partition's arrays: mapped from their ``.npy`` files, else copied.

        ``files`` maps a structure key (``"indptr"``) or a stored tensor key (``"node:feat"``)
        to the ``.npy`` file that array was loaded from: those are served from the file,
        read-only (``FileArray``, issue 34); every other array is copied, into a memfd with
        ``shared=True``, else into a plain numpy array (standalone mode without sharing: it
        cannot export). ``node_feats["feat"]`` becomes tensor ``"node:feat"`` (policy "node"),
        ``edge_feats["w"]`` becomes ``"edge:w"``.
        """
        files = files or {}
        struct_in = check_structure(book, part_id, indptr, indices, eids)
        feats = check_features(book, part_id, node_feats, edge_feats)
        structure, lock = structure_memory(
            f"asyncgraph.{graph_name}.p{part_id}", struct_in, shared=shared, files=files
        )
        store = cls(graph_name, part_id, book, structure, lock, shared=shared, attached=False)
        store._final_seals = False
        try:
            for name, policy, arr in feats:
                total = book.num_nodes if policy == "node" else book.num_edges
                meta = TensorMeta(name, policy, (total, *arr.shape[1:]), np.dtype(arr.dtype).name)
                if name in files:
                    store._register(meta, FileArray.open_npy(files[name], arr.dtype, arr.shape))
                else:
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
    def from_partition(cls, part: Partition, *, shared: bool = True, copy: bool = False) -> PartitionStore:
        """A store holding a loaded ``Partition`` (see ``asyncgraph.partition.reader``): the
        arrays it memory-mapped are served from their files, unless ``copy`` (each is copied
        into memory, as before issue 34: ``--copy-partition-data``)."""
        files: dict[str, str] = {}
        if not copy:
            arrays = [*zip(STRUCTURE_KEYS, (part.indptr, part.indices, part.eids), strict=True)]
            arrays += [(f"node:{k}", a) for k, a in part.node_feats.items()]  # as check_features
            arrays += [(f"edge:{k}", a) for k, a in part.edge_feats.items()]
            files = {k: str(a.filename) for k, a in arrays if isinstance(a, np.memmap) and a.filename}
        store = cls.create(
            part.config.graph_name,
            part.part_id,
            part.book,
            part.indptr,
            part.indices,
            part.eids,
            part.node_feats,
            with_type_order(part.edge_feats, part.edge_range[0]),  # per-type edge IDs' index
            shared=shared,
            files=files,
        )
        store.multigraph = bool(getattr(part.config, "multigraph", True))
        return store

    def _allocate(self, meta: TensorMeta, *, final: bool | None = None) -> StoredTensor:
        """Zeroed local rows for ``meta``, not registered (``final``: see ``SharedArray.create``)."""
        lo, hi = self._owned(meta.policy, meta.name)
        local_shape = (hi - lo, *meta.shape[1:])
        data: SharedArray | np.ndarray
        if self._shared:
            label = f"asyncgraph.{self.graph_name}.p{self.part_id}.{meta.name}"
            final = self._final_seals if final is None else final
            data = SharedArray.create(label, local_shape, meta.dtype, final=final)
        else:
            data = np.zeros(local_shape, dtype=meta.dtype)
        return StoredTensor(meta, data, lo)

    # --- tensor management ---------------------------------------------------------------
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
        self.rules.check_create(meta, self._tensors.values(), self._owned(meta.policy, meta.name))
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
        if self.overlay is not None:
            with self._lock.write():
                self.overlay.drop_data(name)  # its rows of new IDs go with it
        self.catalog_changed()

    # --- data access ------------------------------------------------------------------------
    def access(self, name: str) -> TensorAccess:
        """The published tensor's access record (its rows, dtype, owned range; UnknownTensorError
        like ``_get``): for kernels that read rows under a lock the caller holds."""
        return self._entry(name)

    def _entry(self, name: str) -> TensorAccess:
        """The published tensor's access record (UnknownTensorError like ``_get``)."""
        t = self._tensors.get(name)
        if t is None:
            t = self._get(name)  # raises
        acc: TensorAccess | None = t.access
        if acc is None:
            acc = t.access = TensorAccess(t, self._owned(t.meta.policy, t.meta.name), self._owner)
        return acc

    def row_bytes(self, name: str) -> int:
        """Bytes of one row of tensor ``name`` (UnknownTensorError lists what exists)."""
        return self._entry(name).row_bytes

    def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows for global ``ids`` (owned by this partition) as a NEW array ``[len(ids), *row_shape]``."""
        acc = self._entry(name)
        try:
            local = acc.check(ids)[0]
        except OutOfRangeError:
            if self.overlay is None and not getattr(self, "live_elsewhere", False):
                raise
            from asyncgraph.storage.overlay_rows import pull_new  # it reads stores: imported here

            return pull_new(self, acc, name, ids)  # a live graph's new IDs (issue 35)
        rows, pair = acc.rows, self._read_pair
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
        try:
            local = acc.check(ids)[0]
        except OutOfRangeError:
            if self.overlay is None and not getattr(self, "live_elsewhere", False):
                raise
            from asyncgraph.storage.overlay_rows import pull_new

            rows = pull_new(self, acc, name, ids)  # a live graph's new IDs (issue 35)
            out[slice(0, rows.shape[0]) if where is None else where] = rows
            return int(rows.nbytes)
        with self._lock.read():
            return gather_into(acc.rows, local, out, where)

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
        try:
            local, vals = acc.check(ids, values)
        except OutOfRangeError:
            if self.overlay is None and not getattr(self, "live_elsewhere", False):
                raise
            from asyncgraph.storage.overlay_rows import push_new

            return push_new(
                self, acc, name, ids, values, op, self.writable_rows
            )  # a live graph's new IDs (issue 35)
        self.rules.check_write(name)
        if local.size == 0:
            return
        rows = acc.rows if acc.rows.flags.writeable else self.writable_rows(name)
        with self._lock.write():
            if op == "assign":
                assign_rows(rows, local, vals)
            else:
                scatter_add(rows, local, vals)

    def protect(self, *, writable_base: bool = False) -> None:
        """Make the partition's own tensors read-only for every later ``push``, unless
        ``writable_base`` (DGL's writable ``ndata``: each is then copied from its file into
        memory now, so co-located processes are sent writable memory). They can never be
        deleted either way."""
        if writable_base:
            for name in sorted(self.rules.base):
                self.writable_rows(name)
        self.rules.protect(self._tensors, writable_base=writable_base)
        self._protected = True
        self.catalog_changed()

    def local_rows(self, name: str) -> np.ndarray:
        """The owned-rows array itself (hold ``lock`` while using it); read-only when served
        from a partition file (``writable_rows`` to write)."""
        return self._get(name).rows

    def writable_rows(self, name: str) -> np.ndarray:
        """Tensor ``name``'s rows, writable: a tensor served from its partition file is first
        copied into memory of its own (a memfd when shared; the file is never written), which
        co-located processes map on their next catalog sync. Owner stores only."""
        t = self._get(name)
        if not is_file_backed(t.data):
            return t.rows
        if self._attached:
            raise ReadOnlyTensorError(
                f"tensor {name!r} is mapped from its partition file here: write it through the server"
            )
        base = name in self.rules.base
        copy = self._allocate(t.meta, final=not base)  # a base tensor's seals are protect's
        with self._lock.write():
            copy.rows[...] = t.rows
            self._tensors[name] = copy
        if base and self._protected and isinstance(copy.data, SharedArray):
            copy.data.seal(read_only=name in self.rules.read_only)
        if isinstance(t.data, SharedArray):
            t.data.close()  # in-flight readers keep their view: unmapped when they finish
        self.catalog_changed()
        return copy.rows


def _describe(meta: TensorMeta) -> str:
    return f"policy={meta.policy} shape={list(meta.shape)} dtype={meta.dtype}"
