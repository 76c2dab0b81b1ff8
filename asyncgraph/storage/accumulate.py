"""Row updates for ``PartitionStore.push``: assignments and accumulating adds."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["assign_rows", "scatter_add"]

_ADD_CHUNK_ELEMS = 1 << 20  # elements per np.add.at call: bounds temp memory


def assign_rows(rows: np.ndarray, local: np.ndarray, vals: np.ndarray) -> None:
    """``rows[local] = vals`` (duplicates: the last wins); a range of rows, as layer-wise
    inference writes its outputs, is a plain slice copy (~3.5x faster than fancy indexing for
    4,096 rows of 256 float32)."""
    n = local.size
    if n > 1 and int(local[-1]) - int(local[0]) == n - 1 and bool((np.diff(local) == 1).all()):
        start = int(local[0])
        rows[start : start + n] = vals
    else:
        rows[local] = vals


def scatter_add(rows: np.ndarray, local: np.ndarray, vals: np.ndarray) -> None:
    """``rows[local] += vals`` with duplicate indices accumulating.

    Uses ``np.add.at`` on the flattened array (numpy's fast 1-D path, ~5x faster than the 2-D
    form), in chunks of rows that bound the temporary flat index array.
    """
    row_size = math.prod(rows.shape[1:])
    if row_size == 0:
        return
    flat = rows.reshape(-1)  # C-contiguous by construction: a view
    vals2 = vals.reshape(local.size, row_size)
    if row_size == 1:
        np.add.at(flat, local, vals2.reshape(-1))
        return
    offsets = np.arange(row_size, dtype=np.int64)
    chunk = max(1, _ADD_CHUNK_ELEMS // row_size)
    for s in range(0, local.size, chunk):
        idx = local[s : s + chunk, None] * row_size + offsets
        np.add.at(flat, idx.reshape(-1), vals2[s : s + chunk].reshape(-1))
