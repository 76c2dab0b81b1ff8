"""Pulls and pushes of a live graph's new IDs (issue 35): rows of nodes a partition added and
of edges it appended, read from and written to the overlay's append areas
(``storage/overlay_data.py``), base IDs from the tensor's own rows, in one call.

``PartitionStore.pull``/``push`` come here only when their fast check found an ID outside the
partition's base range and the store has an overlay, so a graph nobody updates keeps today's
path. A new ID with no row written yet reads zeros (DGL's default for new rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgraph.arrays import as_id_array, check_rows
from asyncgraph.errors import InvalidRequestError, OutOfRangeError
from asyncgraph.storage.accumulate import assign_rows, scatter_add
from asyncgraph.storage.overlay_data import AskOwnerError, OverlayMovedError

if TYPE_CHECKING:
    from asyncgraph.storage.overlay import Overlay
    from asyncgraph.storage.store_base import StoreBase as PartitionStore
    from asyncgraph.storage.tensors import TensorAccess

__all__ = ["check_row_data", "load_row_data", "pull_new", "push_new", "row_positions", "write_row_data"]


def row_positions(
    overlay: Overlay, policy: str, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(base mask, local base rows, slots)`` of owned IDs ``ids`` of ``policy``: a base ID's
    row in the tensor, a new ID's row in the append area. ``OutOfRangeError`` for an ID this
    partition does not hold (another owner's, or a new ID not allocated yet)."""
    if policy == "node":
        local = overlay.local_nodes(ids)
        base = local < overlay.num_local_nodes
        return base, local, local - overlay.num_local_nodes
    local = ids - overlay.edge_start
    base = (local >= 0) & (local < overlay.num_base_edges)
    rel = ids - overlay.edge_base
    slot = rel // overlay.num_parts
    slots = overlay.slot_base + overlay.added  # a compaction keeps its slots
    new = (rel >= 0) & (rel % overlay.num_parts == overlay.part_id) & (slot < slots)
    if not np.all(base | new):
        bad = int(ids[~(base | new)][0])
        raise OutOfRangeError(f"edge {bad} is not an edge partition {overlay.part_id} holds")
    return base, local, slot


def _overlay(store: PartitionStore) -> Overlay:
    overlay = store.overlay
    if overlay is None:
        raise AskOwnerError(f"partition {store.part_id}'s overlay is not mapped here; ask its server")
    if overlay.stale:
        raise OverlayMovedError(f"partition {store.part_id}'s overlay grew since this process mapped it")
    return overlay


def pull_new(store: PartitionStore, acc: TensorAccess, name: str, ids: Any) -> np.ndarray:
    """Rows ``ids`` of tensor ``name`` (``acc``), new IDs among them, as a new array."""
    gids = as_id_array(ids, "ids")
    with store.lock.read():
        overlay = _overlay(store)
        return rows_of(overlay, acc, name, gids)


def rows_of(overlay: Overlay, acc: TensorAccess, name: str, gids: np.ndarray) -> np.ndarray:
    """Rows ``gids`` of tensor ``name`` (``acc``) as a new array: base rows from the tensor,
    new IDs' from the overlay's append area (zeros without one). The caller holds the read lock."""
    base, _, slot = row_positions(overlay, acc.policy, gids)
    out = np.zeros((gids.size, *acc.row_shape), dtype=acc.dtype)
    out[base] = acc.rows[acc.check(gids[base])[0]]  # a per-type tensor: its own run of rows
    area = overlay.data_rows(name, acc.policy, acc.row_shape, acc.dtype)
    if area is not None:
        new = ~base
        out[new] = area[slot[new]]
    return out


def push_new(
    store: PartitionStore,
    acc: TensorAccess,
    name: str,
    ids: Any,
    values: Any,
    op: str,
    writable_rows: Callable[[str], np.ndarray],
) -> None:
    """Write rows ``ids`` (new IDs among them) of tensor ``name``: the owner only (a view
    mapped read-only asks its server, ``AskOwnerError``). Everything is checked first;
    ``writable_rows`` is the store's (a file-served tensor is copied before a base row is
    written)."""
    gids, vals = check_rows(
        f"tensor {name!r}", ids, values, dtype=acc.dtype, row_shape=acc.row_shape, owner=acc.owner
    )
    if store.attached:
        raise AskOwnerError(f"rows of new IDs of {name!r} are written by partition {store.part_id}'s server")
    overlay = _overlay(store)
    base, _, slot = row_positions(overlay, acc.policy, gids)
    store.rules.check_write(name)
    if overlay.data_rows(name, acc.policy, acc.row_shape, acc.dtype) is None and store.rules.memory_budget:
        room = overlay.data_capacity(acc.policy)
        tensors = sum(size for _, size in store.local_sizes().values())
        store.rules.check_room(f"rows of new IDs of {name!r}", room * acc.row_bytes, tensors)
    rows = acc.rows if acc.rows.flags.writeable or not base.any() else writable_rows(name)
    write = assign_rows if op == "assign" else scatter_add
    made = False
    with store.lock.write():
        area = overlay.data_rows(name, acc.policy, acc.row_shape, acc.dtype)
        if area is None:
            area, made = overlay.writable_data(name, acc.policy, acc.row_shape, acc.dtype), True
        if base.any():
            write(rows, acc.check(gids[base])[0], vals[base])  # a per-type tensor: its own rows
        new = ~base
        write(area, slot[new], vals[new])
        overlay.note_rows(name, slot[new])  # a compaction folding now copies them over
    if made:
        store.catalog_changed()  # a new memfd: co-located readers map it again


#: Checked rows of tensors for new IDs: ``(name, policy, rows)``.
RowData = list[tuple[str, str, np.ndarray]]


def check_row_data(store: PartitionStore, op: str, policy: str, count: int, data: Any) -> RowData:
    """Rows ``data`` (``{tensor name: rows}``) for ``count`` new IDs of ``policy``, checked in
    full before anything changes: ``UnknownTensorError`` for a name, ``InvalidRequestError``
    for a tensor of the other policy, ``DTypeMismatchError``/``ShapeMismatchError`` for rows that
    are not exactly the tensor's dtype and ``(count, *row_shape)``."""
    out: RowData = []
    for name, values in (data or {}).items():
        meta = store.tensor_meta(name)
        if meta.policy != policy:
            raise InvalidRequestError(f"{op}: data {name!r} is a {meta.policy} tensor, not a {policy} tensor")
        _, rows = check_rows(
            f"{op}: data {name!r}",
            np.zeros(count, np.int64),
            values,
            dtype=meta.dtype,
            row_shape=meta.row_shape,
        )
        out.append((name, policy, rows))
    return out


def write_row_data(overlay: Overlay, rows: RowData, first: int, stride: int = 1) -> None:
    """Store checked ``rows`` at slots ``first, first + stride, ...`` (added nodes of one type
    are ``stride`` slots apart: ``Overlay.add_nodes``), under the store's write lock."""
    for name, policy, values in rows:
        area = overlay.writable_data(name, policy, values.shape[1:], values.dtype)
        area[first : first + values.shape[0] * stride : stride] = values
        overlay.note_rows(name, np.arange(first, first + values.shape[0] * stride, stride))


def load_row_data(store: PartitionStore, overlay: Overlay, state: Mapping[str, np.ndarray]) -> None:
    """Make ``overlay`` hold a snapshot's rows of new IDs (flat arrays ``data:<policy>:<name>``),
    shaped by their tensors; a tensor deleted since has none."""
    for key, flat in state.items():
        if not key.startswith("data:"):
            continue
        _, policy, name = key.split(":", 2)
        if not store.has_tensor(name):
            continue
        meta = store.tensor_meta(name)
        values = np.asarray(flat, dtype=meta.dtype).reshape(-1, *meta.row_shape)
        write_row_data(overlay, [(name, policy, values)], 0)
