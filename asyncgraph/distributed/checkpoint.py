"""Checkpoints of ``DistEmbedding`` rows and sparse optimizer state: every row, pulled and
pushed in bounded chunks, as ``.npy`` files plus a small ``checkpoint.json`` in a directory.

Rows are stored in the graph's (partitioned) ID order, or, given ``orig_ids`` (the new -> original
mapping ``partition_graph(..., return_mapping=True)`` returns), in original ID order: such a
checkpoint loads into any partitioning of the same graph, given that partitioning's mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.arrays import to_numpy, unique_sorted
from asyncgraph.client.sync_client import Client
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError
from asyncgraph.storage.store import TensorMeta

__all__ = ["CHUNK_BYTES", "load_rows", "read_meta", "read_rows", "save_rows", "write_meta", "write_rows"]

#: At most this many bytes of rows per pull or push.
CHUNK_BYTES = 64 << 20
META_FILE = "checkpoint.json"


def _mapping(orig_ids: Any, rows: int, what: str) -> np.ndarray | None:
    """Validate a new -> original ID mapping: a permutation of ``range(rows)``."""
    if orig_ids is None:
        return None
    ids = to_numpy(orig_ids)
    if ids.dtype.kind not in "iu" or ids.shape != (rows,):
        raise ShapeMismatchError(
            f"{what}: orig_ids must be {rows} integer IDs (new -> original), got {ids.dtype} {ids.shape}"
        )
    ids = ids.astype(np.int64, copy=False)
    if rows and (int(ids.min()) < 0 or int(ids.max()) >= rows or unique_sorted(ids).size != rows):
        raise InvalidRequestError(f"{what}: orig_ids is not a permutation of 0..{rows - 1}")
    return ids


def _chunks(meta: TensorMeta) -> list[tuple[int, int]]:
    """Row ranges of at most ``CHUNK_BYTES`` each."""
    row_bytes = max(1, int(np.prod(meta.shape[1:], dtype=np.int64)) * np.dtype(meta.dtype).itemsize)
    step = max(1, CHUNK_BYTES // row_bytes)
    n = meta.shape[0]
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _pull_into(client: Client, meta: TensorMeta, out: np.ndarray, ids: np.ndarray | None) -> None:
    for lo, hi in _chunks(meta):
        rows = client.pull(meta.name, np.arange(lo, hi, dtype=np.int64)).numpy()
        if ids is None:
            out[lo:hi] = rows
        else:
            out[ids[lo:hi]] = rows


def read_rows(client: Client, meta: TensorMeta, orig_ids: Any = None) -> np.ndarray:
    """Every row of ``meta`` in memory (original ID order with ``orig_ids``)."""
    out = np.empty(meta.shape, dtype=meta.dtype)
    _pull_into(client, meta, out, _mapping(orig_ids, meta.shape[0], meta.name))
    return out


def write_rows(client: Client, meta: TensorMeta, values: Any, orig_ids: Any = None) -> None:
    """Push every row of ``meta`` from ``values`` (in original ID order with ``orig_ids``)."""
    ids = _mapping(orig_ids, meta.shape[0], meta.name)
    arr = values if isinstance(values, np.ndarray) else to_numpy(values)
    if tuple(arr.shape) != tuple(meta.shape):
        raise ShapeMismatchError(f"{meta.name}: checkpoint rows have shape {arr.shape}, not {meta.shape}")
    if np.dtype(arr.dtype) != np.dtype(meta.dtype):
        raise InvalidRequestError(f"{meta.name}: checkpoint rows are {arr.dtype}, the tensor is {meta.dtype}")
    for lo, hi in _chunks(meta):
        rows = arr[lo:hi] if ids is None else arr[ids[lo:hi]]
        client.push(meta.name, np.arange(lo, hi, dtype=np.int64), np.ascontiguousarray(rows))


def save_rows(client: Client, meta: TensorMeta, file: Path, orig_ids: Any = None) -> None:
    """Write every row of ``meta`` to the ``.npy`` file ``file``, chunk by chunk (memory-mapped)."""
    ids = _mapping(orig_ids, meta.shape[0], meta.name)
    out = np.lib.format.open_memmap(file, mode="w+", dtype=np.dtype(meta.dtype), shape=meta.shape)
    _pull_into(client, meta, out, ids)
    out.flush()
    del out


def load_rows(client: Client, meta: TensorMeta, file: Path, orig_ids: Any = None) -> None:
    """Push every row of ``meta`` from the ``.npy`` file ``file`` (memory-mapped, chunk by chunk)."""
    if not file.is_file():
        raise InvalidRequestError(f"checkpoint file {file} does not exist")
    write_rows(client, meta, np.load(file, mmap_mode="r"), orig_ids)


def write_meta(path: Path, info: Mapping[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / META_FILE).write_text(json.dumps(dict(info), indent=1, sort_keys=True))


def read_meta(path: Path, kind: str, keyed_by_orig: bool) -> dict[str, Any]:
    """The checkpoint's JSON, checked to be a ``kind`` checkpoint keyed the way it is loaded."""
    file = path / META_FILE
    if not file.is_file():
        raise InvalidRequestError(f"{path} is not a checkpoint directory (no {META_FILE})")
    info: dict[str, Any] = json.loads(file.read_text())
    if info.get("kind") != kind:
        raise InvalidRequestError(f"{path} holds a {info.get('kind')!r} checkpoint, not {kind!r}")
    if bool(info.get("orig_ids")) != keyed_by_orig:
        saved = "original" if info.get("orig_ids") else "partitioned"
        raise InvalidRequestError(
            f"{path} is keyed by {saved} IDs: pass orig_ids to load exactly when it was saved with them"
        )
    return info
