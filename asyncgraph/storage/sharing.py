"""Sharing a PartitionStore with co-located processes: export its memfds, attach to them.

A shared store describes its lock, structure and tensors in a msgpack-able descriptor and
hands out the matching fds (``export``); a co-located process maps them (``attach``), learns
tensors created later (``add_attached``) and unmaps deleted ones (``forget_tensor``). The
functions that receive fds take ownership of every one of them, also on error.
``PartitionStore`` exposes these as methods of the same names.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import TensorMeta
from asyncgraph.storage.rwlock import SharedRWLock

if TYPE_CHECKING:
    from asyncgraph.storage.store import PartitionStore

__all__ = ["DESCRIPTOR_VERSION", "add_attached", "attach", "export", "forget_tensor", "sync_catalog"]

DESCRIPTOR_VERSION = 1

S = TypeVar("S", bound="PartitionStore")


def export(
    store: PartitionStore, names: Sequence[str] | None, *, structure: bool
) -> tuple[dict[str, Any], list[int]]:
    """``(descriptor, fds)`` of a shared store: lock and structure (if asked), tensors ``names`` or all.

    ``descriptor["fds"]`` lists which entry each fd belongs to, in order; entries also carry
    their ``fd_index``. With ``structure=False`` only tensors are described (for
    ``add_attached``). The store keeps the fds.
    """
    store._check_open()
    if not store._shared:
        raise InvalidRequestError("this store is not in shared memory (shared=False); it cannot export")
    wanted = list(store._tensors) if names is None else list(dict.fromkeys(names))
    chosen = [store._get(n) for n in wanted]
    order: list[str] = []
    fds: list[int] = []
    desc: dict[str, Any] = {
        "version": DESCRIPTOR_VERSION,
        "graph_name": store.graph_name,
        "part_id": store.part_id,
        "book": store.book.to_dict(),
        "generation": store.catalog_generation,
    }
    if structure:
        assert isinstance(store._lock, SharedRWLock)
        order.append("lock")
        fds.append(store._lock.fd)
        desc["structure"] = {}
        for key, sa in store._structure.items():
            assert isinstance(sa, SharedArray)
            desc["structure"][key] = {
                "shape": list(sa.shape),
                "dtype": sa.dtype.name,
                "fd_index": len(fds),
            }
            order.append(key)
            fds.append(sa.fd)
    desc["tensors"] = []
    for t in chosen:
        assert isinstance(t.data, SharedArray)
        desc["tensors"].append(
            {
                "meta": t.meta.to_dict(),
                "fd_index": len(fds),
                "base": t.meta.name in store._base,  # issue 22: the partition's own data
                "read_only": t.meta.name in store._read_only,  # mapped read-only by attachers
            }
        )
        order.append(f"tensor:{t.meta.name}")
        fds.append(t.data.fd)
    desc["fds"] = order
    return desc, fds


def attach(cls: type[S], descriptor: Mapping[str, Any], fds: Sequence[int], keys: Sequence[str]) -> S:
    """Map the store ``descriptor`` describes (structure arrays ``keys``); takes the fds, also on error.

    The view has the same pull/push semantics on the same memory and lock; creating and
    deleting tensors goes through the server (``add_attached`` learns new ones).
    """
    fds = list(fds)
    owned = set(range(len(fds)))
    try:
        _check_descriptor(descriptor, len(fds), structure=True)
        book = RangePartitionBook.from_dict(descriptor["book"])
        structure: dict[str, SharedArray | np.ndarray] = {}
        lock_i = descriptor["fds"].index("lock")
        owned.discard(lock_i)
        lock = SharedRWLock.from_fd(fds[lock_i])
        try:
            for key in keys:
                ent = descriptor["structure"][key]
                i = int(ent["fd_index"])
                owned.discard(i)
                structure[key] = SharedArray.from_fd(
                    fds[i], tuple(ent["shape"]), ent["dtype"], writable=False
                )
            store = cls(
                str(descriptor["graph_name"]),
                int(descriptor["part_id"]),
                book,
                structure,
                lock,
                shared=True,
                attached=True,
            )
            store.seen_generation = int(descriptor.get("generation", 0))
        except BaseException:
            lock.close()
            for sa in structure.values():
                if isinstance(sa, SharedArray):
                    sa.close()
            raise
        tensor_fds = {int(e["fd_index"]): fds[int(e["fd_index"])] for e in descriptor["tensors"]}
        owned -= set(tensor_fds)
    except BaseException:
        for i in owned:
            fds[i] = _close_quietly(fds[i])
        raise
    try:
        _add_tensors(store, descriptor, fds, sorted(tensor_fds))
    except BaseException:
        store.close()
        raise
    return store


def add_attached(
    store: PartitionStore, descriptor: Mapping[str, Any], fds: Sequence[int]
) -> list[TensorMeta]:
    """Map the tensors a later export describes into an attached store; takes the fds.

    A tensor already mapped with identical metadata and memory keeps its mapping (the new fd
    is closed); one deleted and re-created on the server (new memfd) is replaced.
    """
    fds = list(fds)
    try:
        store._check_open()
        if not store._attached:
            raise InvalidRequestError("add_attached is only for stores made by attach()")
        _check_descriptor(descriptor, len(fds), structure=False)
        if descriptor["graph_name"] != store.graph_name or int(descriptor["part_id"]) != store.part_id:
            raise InvalidRequestError(
                f"descriptor is for graph {descriptor['graph_name']!r} "
                f"partition {descriptor['part_id']}, "
                f"this store is {store.graph_name!r} partition {store.part_id}"
            )
        indices = [int(e["fd_index"]) for e in descriptor["tensors"]]
    except BaseException:
        for fd in fds:
            _close_quietly(fd)
        raise
    for i in set(range(len(fds))) - set(indices):
        _close_quietly(fds[i])
    return _add_tensors(store, descriptor, fds, indices)


def _add_tensors(
    store: PartitionStore, descriptor: Mapping[str, Any], fds: list[int], indices: list[int]
) -> list[TensorMeta]:
    entries = {int(e["fd_index"]): e for e in descriptor["tensors"]}
    metas: list[TensorMeta] = []
    pending = list(indices)
    try:
        while pending:
            i = pending.pop(0)
            meta = TensorMeta.from_dict(entries[i]["meta"])
            read_only = bool(entries[i].get("read_only", False))
            store._mark(meta.name, base=bool(entries[i].get("base", False)), read_only=read_only)
            old = store._tensors.get(meta.name)
            if old is not None and old.meta == meta and _same_file(old.data, fds[i]):
                _close_quietly(fds[i])
                metas.append(meta)
                continue
            lo, hi = store._owned(meta.policy)
            sa = SharedArray.from_fd(fds[i], (hi - lo, *meta.shape[1:]), meta.dtype, writable=not read_only)
            if old is not None:
                store._drop(meta.name)
            store._register(meta, sa)
            metas.append(meta)
    except BaseException:
        for i in pending:
            _close_quietly(fds[i])
        raise
    return metas


def _same_file(data: SharedArray | np.ndarray, fd: int) -> bool:
    """Whether ``data`` maps the memfd ``fd`` refers to (not a re-created tensor's new one)."""
    if not isinstance(data, SharedArray):
        return False
    try:
        return os.fstat(data.fd).st_ino == os.fstat(fd).st_ino
    except (OSError, InvalidRequestError):
        return False


def sync_catalog(store: PartitionStore, descriptor: Mapping[str, Any], fds: Sequence[int]) -> None:
    """Make an attached store's tensors those of a full export (``names=None``); takes the fds.

    Maps new and re-created tensors, unmaps deleted ones, and records the export's catalog
    generation, so ``catalog_stale`` is false until the owner changes its tensors again.
    """
    metas = add_attached(store, descriptor, fds)
    live = {m.name for m in metas}
    for name in [n for n in store._tensors if n not in live]:
        store._drop(name)
    store.seen_generation = int(descriptor.get("generation", 0))


def forget_tensor(store: PartitionStore, name: str) -> None:
    """Unmap tensor ``name`` of an attached store; no-op if unknown."""
    store._check_open()
    if not store._attached:
        raise InvalidRequestError(f"forget_tensor({name!r}) is for attached stores; use delete_tensor")
    if name in store._tensors:
        store._drop(name)  # in-flight pulls keep their view alive: unmapped when they finish


def _close_quietly(fd: int) -> int:
    with contextlib.suppress(OSError):
        os.close(fd)
    return -1


def _check_descriptor(desc: Mapping[str, Any], n_fds: int, *, structure: bool) -> None:
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
