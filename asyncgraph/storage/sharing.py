"""Sharing a PartitionStore with co-located processes: the export side and the descriptor.

A shared store describes its lock, structure and tensors in a msgpack-able descriptor and
hands out the matching fds (``export``): memfds, and for data served from partition files the
file's read-only descriptor with the data's offset; a co-located process maps them as an
:class:`~asyncgraph.storage.attached.AttachedStore`. ``export`` reads the store only through its
public view (``structure_arrays``, ``stored``, ``tensor_names``, ``lock``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.rwlock import SharedRWLock
from asyncgraph.storage.store import PartitionStore

__all__ = ["DESCRIPTOR_VERSION", "check_descriptor", "close_quietly", "export", "same_file"]

#: 2 (issue 34): entries carry ``offset`` and ``file`` (a read-only partition file's descriptor,
#: its data at that offset); a version-1 attacher would have mapped the ``.npy`` header as data.
DESCRIPTOR_VERSION = 2


def export(
    store: PartitionStore, names: Sequence[str] | None, *, structure: bool
) -> tuple[dict[str, Any], list[int]]:
    """``(descriptor, fds)`` of a shared store: lock and structure (if asked), tensors ``names`` or all.

    ``descriptor["fds"]`` lists which entry each fd belongs to, in order; entries also carry
    their ``fd_index``. With ``structure=False`` only tensors are described (for
    ``add_attached``). The store keeps the fds.
    """
    store.check_open()
    if not store.shared:
        raise InvalidRequestError("this store is not in shared memory (shared=False); it cannot export")
    wanted = store.tensor_names() if names is None else list(dict.fromkeys(names))
    chosen = [store.stored(n) for n in wanted]
    order: list[str] = []
    fds: list[int] = []
    desc: dict[str, Any] = {
        "version": DESCRIPTOR_VERSION,
        "graph_name": store.graph_name,
        "part_id": store.part_id,
        "book": store.book.to_dict(),
        "generation": store.catalog_generation,
        "live": store.overlay is not None,  # the structure has an overlay (issue 35)
    }
    if structure:
        assert isinstance(store.lock, SharedRWLock)
        order.append("lock")
        fds.append(store.lock.fd)
        desc["structure"] = {}
        for key, sa in store.structure_arrays.items():
            assert isinstance(sa, SharedArray)
            desc["structure"][key] = {
                "shape": list(sa.shape),
                "dtype": sa.dtype.name,
                "fd_index": len(fds),
                "offset": sa.offset,
                "file": sa.file_backed,
            }
            order.append(key)
            fds.append(sa.fd)
    desc["tensors"] = []
    base, read_only = store.rules.base, store.rules.read_only
    for t in chosen:
        assert isinstance(t.data, SharedArray)
        desc["tensors"].append(
            {
                "meta": t.meta.to_dict(),
                "fd_index": len(fds),
                "base": t.meta.name in base,  # the partition's own data
                "read_only": t.meta.name in read_only,  # mapped read-only by attachers
                "offset": t.data.offset,
                "file": t.data.file_backed,  # a partition file's O_RDONLY descriptor
            }
        )
        order.append(f"tensor:{t.meta.name}")
        fds.append(t.data.fd)
    overlay = store.overlay
    if names is None and overlay is not None and overlay.shared and not store.attached:
        desc["overlay"] = {"params": overlay.params(), "arrays": {}}  # a live graph's (issue 35)
        data_keys = [key for key in overlay.arrays if key.startswith("data:")]  # rows of new IDs
        for key in (*overlay.mapped_names(), *data_keys):  # MAPPED, a compacted overlay's CSC
            sa = overlay.arrays[key]
            assert isinstance(sa, SharedArray)
            desc["overlay"]["arrays"][key] = {
                "shape": list(sa.shape),
                "dtype": sa.dtype.name,
                "fd_index": len(fds),
            }
            order.append(f"overlay:{key}")
            fds.append(sa.fd)
    desc["fds"] = order
    return desc, fds


def close_quietly(fd: int) -> int:
    with contextlib.suppress(OSError):
        os.close(fd)
    return -1


def check_descriptor(desc: Mapping[str, Any], n_fds: int, *, structure: bool) -> None:
    """Reject a descriptor whose version or fd count does not match what was received."""
    if not isinstance(desc, Mapping) or desc.get("version") != DESCRIPTOR_VERSION:
        raise InvalidRequestError(
            f"store descriptor version {desc.get('version') if isinstance(desc, Mapping) else None!r} "
            f"is not supported (expected {DESCRIPTOR_VERSION})"
        )
    order = desc.get("fds")
    if not isinstance(order, list) or len(order) != n_fds:
        raise InvalidRequestError(
            f"store descriptor lists {len(order) if isinstance(order, list) else 'no'} fds, received {n_fds}"
        )
    if structure and ("structure" not in desc or "lock" not in order):
        raise InvalidRequestError("store descriptor has no structure/lock entries; cannot attach")


def same_file(data: SharedArray | np.ndarray, fd: int) -> bool:
    """Whether ``data`` maps the memfd ``fd`` refers to (not a re-created tensor's new one)."""
    if not isinstance(data, SharedArray):
        return False
    try:
        return os.fstat(data.fd).st_ino == os.fstat(fd).st_ino
    except (OSError, InvalidRequestError):
        return False
