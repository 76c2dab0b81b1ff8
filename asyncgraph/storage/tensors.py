"""The pieces a ``PartitionStore`` is made of: a tensor's rows with the global row they start at,
a tensor allocated but not yet published (``PendingTensor``), and the dtype rule every stored
tensor follows (native-endian numeric or bool; the wire kinds), and the checks of a partition's
arrays before a store is made of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from asyncgraph.arrays import WIRE_DTYPE_KINDS, check_rows
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, ShapeMismatchError
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.initializers import fill_init
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import Policy, TensorMeta
from asyncgraph.storage.rwlock import LocalRWLock, RWLock, SharedRWLock

__all__ = [
    "PendingTensor",
    "StoredTensor",
    "TensorAccess",
    "as_numpy",
    "check_dtype",
    "check_features",
    "check_structure",
    "structure_memory",
]

_ALLOWED_DTYPE_KINDS = WIRE_DTYPE_KINDS


def check_dtype(dtype: Any, what: str) -> np.dtype[Any]:
    """A native-endian numeric/bool dtype, or DTypeMismatchError."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise DTypeMismatchError(f"{what}: {dtype!r} is not a numpy dtype") from exc
    if dt.kind not in _ALLOWED_DTYPE_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise DTypeMismatchError(f"{what}: dtype {dt} is not a numeric or bool dtype")
    if not dt.isnative:
        raise DTypeMismatchError(f"{what}: dtype {dt.str} is not in native byte order")
    return cast("np.dtype[Any]", dt)


def as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    return np.asarray(x)


@dataclass
class StoredTensor:
    """A tensor's rows (plain or shared) and the first global row they hold."""

    meta: TensorMeta
    data: SharedArray | np.ndarray
    start: int  # first owned global row
    #: What the store derives from ``meta`` once for its fast paths (``PartitionStore._entry``);
    #: it lives and dies with this object, so a deleted or re-created tensor never sees a stale one.
    access: TensorAccess | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def rows(self) -> np.ndarray:
        return self.data.array if isinstance(self.data, SharedArray) else self.data


@dataclass
class PendingTensor:
    """A tensor allocated by ``begin_create`` and not yet visible: fill it, then finish it."""

    tensor: StoredTensor
    spec: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return int(self.tensor.rows.nbytes)

    @property
    def needs_fill(self) -> bool:
        return bool(self.spec["kind"] != "zeros")

    def fill(self) -> None:
        """Write the initial values (thread-safe: only this tensor's unpublished rows)."""
        fill_init(self.tensor.rows, self.spec, self.tensor.start)

    def discard(self) -> None:
        """Free the rows (idempotent); the tensor was never published."""
        data = self.tensor.data
        rows = self.tensor.rows
        self.tensor.data = np.empty((0, *rows.shape[1:]), dtype=rows.dtype)
        del rows
        if isinstance(data, SharedArray):
            data.close()


class TensorAccess:
    """What every pull and push of one published tensor needs, derived once from its meta."""

    __slots__ = ("dtype", "owned", "owner", "policy", "row_bytes", "row_shape", "rows", "what")

    def __init__(self, t: StoredTensor, owned: tuple[int, int], owner: str) -> None:
        meta = t.meta
        self.rows = t.rows
        self.what = f"tensor {meta.name!r}"
        self.dtype = np.dtype(meta.dtype)  # compared with a push's values without a name lookup
        self.row_shape = meta.row_shape
        self.policy = meta.policy
        self.owned = owned
        self.owner = owner
        self.row_bytes = math.prod(meta.row_shape) * self.dtype.itemsize

    def check(self, ids: Any, values: Any = None) -> tuple[np.ndarray, Any]:
        """Local row positions of global ``ids`` (and ``values`` checked against the tensor)."""
        return check_rows(
            self.what,
            ids,
            values,
            dtype=self.dtype,
            row_shape=self.row_shape,
            owned=self.owned,
            owner=self.owner,
            policy=self.policy,
        )


def check_structure(
    book: RangePartitionBook, part_id: int, indptr: Any, indices: Any, eids: Any
) -> dict[str, np.ndarray]:
    """A partition's CSC arrays as numpy, checked against the book (1-D integer, sizes agree)."""
    n_lo, n_hi = book.node_range(part_id)
    struct_in = {"indptr": as_numpy(indptr), "indices": as_numpy(indices), "eids": as_numpy(eids)}
    for key, arr in struct_in.items():
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise InvalidRequestError(f"{key} must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    if struct_in["indptr"].size != n_hi - n_lo + 1:
        raise ShapeMismatchError(
            f"indptr has {struct_in['indptr'].size} entries; partition {part_id} owns "
            f"{n_hi - n_lo} nodes so it needs {n_hi - n_lo + 1}"
        )
    if struct_in["indices"].size != struct_in["eids"].size:
        raise ShapeMismatchError(
            f"indices ({struct_in['indices'].size}) and eids ({struct_in['eids'].size}) differ in length"
        )
    return struct_in


def check_features(
    book: RangePartitionBook,
    part_id: int,
    node_feats: Mapping[str, Any],
    edge_feats: Mapping[str, Any],
) -> list[tuple[str, Policy, np.ndarray]]:
    """``(stored key, policy, rows)`` of a partition's features, each checked: a supported dtype
    and one row per node (edge) the partition owns (of its type, for a per-type tensor)."""
    from asyncgraph.partition.typed import typed_range

    n_lo, n_hi = book.node_range(part_id)
    e_lo, e_hi = book.edge_range(part_id)
    feats: list[tuple[str, Policy, np.ndarray]] = []
    for policy, group, owned, total in (
        ("node", node_feats, n_hi - n_lo, book.num_nodes),
        ("edge", edge_feats, e_hi - e_lo, book.num_edges),
    ):
        for fname, feat in group.items():
            arr = as_numpy(feat)
            check_dtype(arr.dtype, f"{policy} feature {fname!r}")
            typed = typed_range(book, part_id, f"{policy}:{fname}")
            want = owned if typed is None else typed[1] - typed[0]
            if arr.ndim == 0 or arr.shape[0] != want:
                raise ShapeMismatchError(
                    f"{policy} feature {fname!r} has shape {arr.shape}; partition {part_id} owns "
                    f"{want} {policy}s of it (of {total}) so it needs {want} rows"
                )
            feats.append((f"{policy}:{fname}", cast(Policy, policy), arr))
    return feats


def structure_memory(
    prefix: str, arrays: Mapping[str, np.ndarray], *, shared: bool, files: Mapping[str, str] | None = None
) -> tuple[dict[str, SharedArray | np.ndarray], RWLock]:
    """A partition's CSC arrays, read-only int64, and the store's lock (cross-process when
    shared): mapped from the ``.npy`` file ``files[key]`` when given (``FileArray``), else
    copied (memfds named ``prefix.<key>`` when ``shared``, else plain arrays)."""
    from asyncgraph.storage.filemap import FileArray

    files = files or {}
    made: list[SharedArray] = []
    try:
        structure: dict[str, SharedArray | np.ndarray] = {}
        for key, arr in arrays.items():
            if key in files:
                fa = FileArray.open_npy(files[key], np.int64, arr.shape)
                made.append(fa)
                structure[key] = fa
            elif shared:
                sa = SharedArray.create(f"{prefix}.{key}", arr.shape, "int64", final=False)
                made.append(sa)
                sa.array[...] = arr
                sa.array.flags.writeable = False
                sa.seal(read_only=True)  # no co-located process can map it writable
                structure[key] = sa
            else:
                view = np.ascontiguousarray(arr, dtype=np.int64).view()
                view.flags.writeable = False
                structure[key] = view
        lock: RWLock = SharedRWLock.create(f"{prefix}.lock") if shared else LocalRWLock()
    except BaseException:
        for sa in made:
            sa.close()
        raise
    return structure, lock
