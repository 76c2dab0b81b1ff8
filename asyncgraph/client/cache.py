"""A trainer-side cache of remote rows of read-only tensors.

Each process builds its own cache (version 1: not shared between the trainers of a host). A
cache holds the sorted global IDs it covers and their rows; a lookup is one vectorised
``searchsorted``, so its memory is proportional to the cache, not to the graph. The client drops
a tensor's cache whenever it writes that tensor (push, sparse_update, create, delete), so its own
writes are never answered from stale rows; writes made by *other* processes are not seen, which
is why only tensors nobody writes during training (partition features) should be cached.
"""

from __future__ import annotations

import math

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.storage.store import TensorMeta

__all__ = ["FeatureCache", "meta_row_bytes", "pick_cached_ids"]


def meta_row_bytes(meta: TensorMeta) -> int:
    """Bytes of one row of ``meta``'s tensor."""
    return int(math.prod(meta.row_shape) * np.dtype(meta.dtype).itemsize)


class FeatureCache:
    """Rows ``rows[i]`` of global IDs ``ids[i]`` (sorted, unique) of one tensor."""

    def __init__(self, name: str, ids: np.ndarray, rows: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or rows.shape[:1] != ids.shape:
            raise InvalidRequestError(f"cache of {name!r}: {ids.shape[0]} IDs but rows of shape {rows.shape}")
        if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            raise InvalidRequestError(f"cache of {name!r}: IDs must be sorted and unique")
        self.name = name
        self.ids = ids
        self.rows = rows

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.ids.nbytes)

    def __len__(self) -> int:
        return int(self.ids.size)

    def lookup(self, gids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(hit, slot)``: a boolean mask of the cached IDs and, where hit, their row in ``rows``."""
        if not self.ids.size:
            return np.zeros(gids.shape, dtype=bool), np.zeros(gids.shape, dtype=np.int64)
        slot = np.searchsorted(self.ids, gids)
        np.minimum(slot, self.ids.size - 1, out=slot)
        hit = self.ids[slot] == gids
        return hit, slot


def pick_cached_ids(scores: np.ndarray, candidates: np.ndarray, max_rows: int) -> np.ndarray:
    """The (sorted) ``max_rows`` candidates with the highest positive scores."""
    if max_rows <= 0 or not candidates.size:
        return np.empty(0, dtype=np.int64)
    s = scores[candidates]
    keep = s > 0
    cand, s = candidates[keep], s[keep]
    if cand.size > max_rows:
        top = np.argpartition(-s, max_rows - 1)[:max_rows]
        cand = cand[top]
    return np.sort(cand.astype(np.int64, copy=False))
