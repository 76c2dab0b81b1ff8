"""Rows of tensors for a live graph's new IDs (issue 35): an append area per tensor, kept by
the partition's ``Overlay`` beside its appended edges.

Row ``k`` of a node tensor's area is the ``k``-th node the partition added, row ``k`` of an edge
tensor's the edge in global slot ``k`` (folded by a compaction or appended since: a compacted
overlay's areas hold ``slot_base + capacity`` rows, so folded edges keep their rows), so a pull
of a new ID reads ``area[slot]``, with no index. An area is made (zeros, DGL's default for new
rows) on the first write of a new ID's row, grows with the overlay (doubling, a new memfd when
shared), and is exported with it, so co-located readers map it; making or replacing one moves
the header's ``data_layout`` word, which marks every view mapped before as stale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncgraph.errors import LiveGraphError
from asyncgraph.storage.memfd import SharedArray

__all__ = ["AskOwnerError", "DataAreas", "OverlayMovedError"]


class DataAreas:
    """The append areas of an ``Overlay`` (a mixin: it uses the overlay's header, capacities and
    array registry)."""

    shared: bool
    label: str
    header: np.ndarray
    capacity: int
    node_capacity: int
    slot_base: int
    _arrays: dict[str, SharedArray | np.ndarray]
    #: ``name -> (policy, rows)``: row ``k`` is the ``k``-th added node or appended edge.
    data: dict[str, tuple[str, np.ndarray]]
    #: The header's ``data_layout`` when these areas were made (or, in a view, exported).
    data_layout: int
    #: While a compaction folds this overlay: the rows written meanwhile, ``(tensor, slots)``
    #: (slots None: the tensor's area was dropped), which ``compaction.adopt`` copies over.
    rows_meanwhile: list[tuple[str, np.ndarray | None]] | None

    @property
    def nodes(self) -> int:
        return int(self.header[5])

    @property
    def added(self) -> int:
        return int(self.header[0])

    def data_capacity(self, policy: str) -> int:
        """Rows an append area of ``policy`` holds: one per node slot, or per global edge slot."""
        return self.node_capacity if policy == "node" else self.slot_base + self.capacity

    def data_used(self, policy: str) -> int:
        """Rows of ``policy``'s areas in use (added nodes, or edge slots ever given out)."""
        return self.nodes if policy == "node" else self.slot_base + self.added

    def note_rows(self, name: str, slots: np.ndarray | None) -> None:
        """Record rows of ``name`` written (``None``: its area dropped) while a compaction folds."""
        if self.rows_meanwhile is not None:
            self.rows_meanwhile.append((name, None if slots is None else np.array(slots, np.int64)))

    def put_data(self, name: str, policy: str, rows: np.ndarray) -> None:
        """Make tensor ``name``'s area hold ``rows`` from slot 0 on (a compaction carrying them)."""
        self._make_data(name, policy, rows.shape[1:], rows.dtype, rows)

    def _data_key(self, policy: str, name: str) -> str:
        return f"data:{policy}:{name}"

    def _grow_data(self, policy: str, used: int) -> None:
        """Re-make the append areas of ``policy`` at the new capacity, keeping ``used`` rows."""
        for name, (pol, rows) in list(self.data.items()):
            if pol == policy:
                self._make_data(name, policy, rows.shape[1:], rows.dtype, rows[:used].copy())

    def _make_data(self, name: str, policy: str, row_shape: Any, dtype: Any, kept: np.ndarray) -> np.ndarray:
        cap = self.data_capacity(policy)
        shape = (cap, *row_shape)
        key = self._data_key(policy, name)
        data: SharedArray | np.ndarray
        if self.shared:
            data = SharedArray.create(f"{self.label}.{key}", shape, dtype, final=False)
        else:
            data = np.zeros(shape, dtype=dtype)
        old = self._arrays.get(key)
        if isinstance(old, SharedArray):
            old.close()
        self._arrays[key] = data
        rows = data.array if isinstance(data, SharedArray) else data
        rows[: kept.shape[0]] = kept
        self.data[name] = (policy, rows)
        self.header[7] += 1
        self.data_layout = int(self.header[7])
        return rows

    def data_rows(self, name: str, policy: str, row_shape: Any, dtype: Any) -> np.ndarray | None:
        """Tensor ``name``'s rows of new IDs, or None when it has none (every new row is zero):
        also None for an area of another shape or dtype (a tensor deleted and made again)."""
        got = self.data.get(name)
        if got is None or got[0] != policy:
            return None
        rows = got[1]
        if rows.shape[1:] != tuple(row_shape) or rows.dtype != np.dtype(dtype):
            return None
        return rows

    def writable_data(self, name: str, policy: str, row_shape: Any, dtype: Any) -> np.ndarray:
        """Tensor ``name``'s rows of new IDs, made (zeros) when missing: the owner, under the
        store's write lock. Making one is a layout change (co-located views re-map)."""
        rows = self.data_rows(name, policy, row_shape, dtype)
        if rows is None:
            self.drop_data(name)
            rows = self._make_data(name, policy, tuple(row_shape), dtype, np.empty((0, *row_shape), dtype))
        return rows

    def drop_data(self, name: str) -> None:
        """Forget tensor ``name``'s rows of new IDs (the tensor was deleted)."""
        got = self.data.pop(name, None)
        if got is not None:
            old = self._arrays.pop(self._data_key(got[0], name), None)
            if isinstance(old, SharedArray):
                old.close()
            self.note_rows(name, None)
            self.header[7] += 1
            self.data_layout = int(self.header[7])

    def data_bytes(self, policy: str, more: int) -> int:
        """Bytes the append areas of ``policy`` allocate when the overlay grows to ``more`` rows."""
        return sum(
            int(np.prod(r.shape[1:])) * r.dtype.itemsize * more for p, r in self.data.values() if p == policy
        )


class AskOwnerError(LiveGraphError):
    """This process cannot answer from its mapping of an owner's live structure (it maps no
    overlay, or it is a read-only view asked to write): the owner (server) must."""


class OverlayMovedError(AskOwnerError):
    """A co-located view of an owner's overlay is stale (the owner grew its arrays since this
    process mapped them): the caller re-maps it, and meanwhile asks the owner."""
