"""The pieces a ``PartitionStore`` is made of: a tensor's rows with the global row they start at,
a tensor allocated but not yet published (``PendingTensor``), and the dtype rule every stored
tensor follows (native-endian numeric or bool; the wire kinds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from asyncgraph.arrays import WIRE_DTYPE_KINDS
from asyncgraph.errors import DTypeMismatchError
from asyncgraph.storage.initializers import fill_init
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import TensorMeta

__all__ = ["PendingTensor", "StoredTensor", "as_numpy", "check_dtype"]

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
    access: Any = field(default=None, init=False, repr=False, compare=False)

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
