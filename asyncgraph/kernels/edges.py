"""Edge endpoints for one partition's store: global edge IDs in, global (src, dst) out.

Edge IDs of partition ``p`` are the contiguous ``edge_range(p)`` in CSC order, so local edge
``j = eid - edge_start`` has source ``indices[j]`` and destination ``node_start + r`` where ``r``
is the row whose ``indptr`` range holds ``j``. Shared by the server's ``find_edges`` op and the
client's in-process path for local partitions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array
from asyncgraph.storage.store import PartitionStore

__all__ = ["find_edges_partition"]


def find_edges_partition(store: PartitionStore, eids: Any) -> tuple[np.ndarray, np.ndarray]:
    """Global int64 ``(src, dst)`` of global ``eids`` owned by ``store`` (OutOfRangeError otherwise)."""
    ids = as_id_array(eids, "eids")
    local = store.book.eid2localeid(ids, store.part_id)  # validates ownership before any read
    src: np.ndarray = np.take(store.indices, local).astype(np.int64, copy=False)
    row = np.searchsorted(store.indptr, local, side="right") - 1
    dst: np.ndarray = (row + store.node_range[0]).astype(np.int64, copy=False)
    return src, dst
