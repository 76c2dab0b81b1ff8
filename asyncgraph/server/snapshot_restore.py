"""Loading a verified snapshot's rows into a partition store (``server/snapshots.py`` reads and
checks the folder; this makes the store hold exactly what it describes)."""

from __future__ import annotations

import hashlib

import numpy as np

from asyncgraph.server.live_snapshot import OverlayState
from asyncgraph.server.snapshots import Snapshot, SnapshotError
from asyncgraph.storage.filemap import is_file_backed
from asyncgraph.storage.store import PartitionStore, TensorMeta

__all__ = ["read_overlay", "restore_rows"]


def restore_rows(store: PartitionStore, snap: Snapshot, fingerprint: str | None = None) -> None:
    """Make ``store`` hold exactly the snapshot's tensors and rows (partition files are the base)."""
    manifest = snap.manifest
    if manifest["graph_name"] != store.graph_name or manifest["part_id"] != store.part_id:
        raise SnapshotError(
            f"snapshot {snap.path} is of graph {manifest['graph_name']!r} partition {manifest['part_id']}, "
            f"not graph {store.graph_name!r} partition {store.part_id}"
        )
    theirs = manifest.get("fingerprint")
    if fingerprint is not None and theirs is not None and theirs != fingerprint:
        raise SnapshotError(
            f"snapshot {snap.path} is of the partition with fingerprint {theirs}, this server loads "
            f"fingerprint {fingerprint}: refusing state written for another partition"
        )
    wanted = {e["name"] for e in manifest["tensors"]}
    for meta in store.list_tensors():  # a base tensor the snapshot lacks (derived on load) stays
        if meta.name not in wanted and meta.name not in store.rules.base:
            store.delete_tensor(meta.name)
    for entry in manifest["tensors"]:
        meta = TensorMeta.from_dict(entry)
        if store.has_tensor(meta.name) and store.tensor_meta(meta.name) != meta:
            store.delete_tensor(meta.name)
        store.create_tensor(meta.name, meta.policy, meta.shape, meta.dtype, None)
        rows = store.local_rows(meta.name)
        if rows.nbytes != entry["nbytes"]:
            raise SnapshotError(
                f"snapshot {snap.path}: tensor {meta.name!r} has {entry['nbytes']} bytes, "
                f"this partition holds {rows.nbytes}"
            )
        if entry.get("from_file") and is_file_backed(store.stored(meta.name).data):
            continue  # the partition file's rows, unwritten then and served from the file now
        rows = store.writable_rows(meta.name)  # a base tensor written before: copied into memory
        data = np.fromfile(snap.path / entry["file"], dtype=meta.dtype).reshape(rows.shape)
        with store.lock.write():
            rows[...] = data


def read_overlay(snap: Snapshot) -> OverlayState | None:
    """The overlay a snapshot holds (None: the graph had never been updated); ``SnapshotError``
    when a file is missing or does not match its checksum."""
    entry = snap.manifest.get("overlay")
    if not entry:
        return None
    arrays: dict[str, np.ndarray] = {}
    for name, meta in entry["arrays"].items():
        path = snap.path / meta["file"]
        try:
            raw = path.read_bytes()
        except OSError:
            raise SnapshotError(f"snapshot {snap.path}: overlay file {meta['file']} is missing") from None
        if hashlib.sha256(raw).hexdigest() != meta["sha256"]:
            raise SnapshotError(f"snapshot {snap.path}: checksum mismatch in {meta['file']}")
        arr = np.frombuffer(raw, dtype=meta["dtype"])
        if arr.size != int(meta["size"]):
            raise SnapshotError(
                f"snapshot {snap.path}: {meta['file']} holds {arr.size} values, not {meta['size']}"
            )
        arrays[str(name)] = arr.copy()
    return arrays, {str(k): [int(v[0]), int(v[1])] for k, v in entry.get("answers", {}).items()}
