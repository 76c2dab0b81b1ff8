"""A co-located process's view of a server's store: the same memfds and lock, mapped here.

``AttachedStore.attach(descriptor, fds)`` maps what a server exported
(:func:`asyncgraph.storage.sharing.export`, sent over the fd channel); pulls and pushes then
work on the same memory under the same cross-process lock, while creating and deleting tensors
goes through the server. The attached store learns tensors created later (``add_attached``),
re-syncs its whole catalog when the owner's catalog generation moved (``catalog_stale``,
``sync_catalog``) and unmaps deleted ones (``forget_tensor``). Methods that receive fds take
ownership of every one of them, also on error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.compaction import overlay_view
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import TensorMeta
from asyncgraph.storage.rwlock import SharedRWLock
from asyncgraph.storage.sharing import check_descriptor, close_quietly, same_file
from asyncgraph.storage.store import STRUCTURE_KEYS, PartitionStore

__all__ = ["AttachedStore"]


class AttachedStore(PartitionStore):
    """A store mapped from a co-located server's export (see the module docstring)."""

    #: The owner's catalog generation when this store's tensors were last synced.
    seen_generation: int = 0
    #: Whether the owner's structure had an overlay (added or removed edges) at the last sync:
    #: its structure reads are then the owner's to answer (issue 35).
    live_elsewhere: bool = False

    @classmethod
    def attach(cls, descriptor: Mapping[str, Any], fds: Sequence[int]) -> AttachedStore:
        """Map the store ``descriptor`` describes; takes the fds, also on error."""
        fds = list(fds)
        owned = set(range(len(fds)))
        try:
            check_descriptor(descriptor, len(fds), structure=True)
            book = RangePartitionBook.from_dict(descriptor["book"])
            structure: dict[str, SharedArray | np.ndarray] = {}
            lock_i = descriptor["fds"].index("lock")
            owned.discard(lock_i)
            lock = SharedRWLock.from_fd(fds[lock_i])
            try:
                for key in STRUCTURE_KEYS:
                    ent = descriptor["structure"][key]
                    i = int(ent["fd_index"])
                    owned.discard(i)
                    offset = int(ent.get("offset", 0))
                    structure[key] = SharedArray.from_fd(
                        fds[i], tuple(ent["shape"]), ent["dtype"], writable=False, offset=offset
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
                store.live_elsewhere = bool(descriptor.get("live", False))
            except BaseException:
                lock.close()
                for sa in structure.values():
                    if isinstance(sa, SharedArray):
                        sa.close()
                raise
            tensor_fds = {int(e["fd_index"]): fds[int(e["fd_index"])] for e in descriptor["tensors"]}
            owned -= set(tensor_fds) | set(_overlay_indices(descriptor))
        except BaseException:
            for i in owned:
                fds[i] = close_quietly(fds[i])
            raise
        try:
            store._add_tensors(descriptor, fds, sorted(tensor_fds))
        except BaseException:
            for i in _overlay_indices(descriptor):
                close_quietly(fds[i])
            store.close()
            raise
        try:
            store._map_overlay(descriptor, fds)
        except BaseException:
            store.close()
            raise
        return store

    def add_attached(self, descriptor: Mapping[str, Any], fds: Sequence[int]) -> list[TensorMeta]:
        """Map the tensors a later export describes (e.g. from ``fetch_tensors``); takes the fds.

        A tensor already mapped with identical metadata and memory keeps its mapping (the new fd
        is closed); one deleted and re-created on the server (new memfd) is replaced.
        """
        fds = list(fds)
        try:
            self.check_open()
            check_descriptor(descriptor, len(fds), structure=False)
            if descriptor["graph_name"] != self.graph_name or int(descriptor["part_id"]) != self.part_id:
                raise InvalidRequestError(
                    f"descriptor is for graph {descriptor['graph_name']!r} "
                    f"partition {descriptor['part_id']}, "
                    f"this store is {self.graph_name!r} partition {self.part_id}"
                )
            indices = [int(e["fd_index"]) for e in descriptor["tensors"]]
            mapped = _overlay_indices(descriptor)
        except BaseException:
            for fd in fds:
                close_quietly(fd)
            raise
        for i in set(range(len(fds))) - set(indices) - set(mapped):
            close_quietly(fds[i])
        try:
            metas = self._add_tensors(descriptor, fds, indices)
        except BaseException:
            for i in mapped:
                close_quietly(fds[i])
            raise
        self._map_overlay(descriptor, fds)
        return metas

    def _map_overlay(self, descriptor: Mapping[str, Any], fds: list[int]) -> None:
        """Map the owner's overlay (a live graph, issue 35) if the export has one, read-only,
        replacing the one mapped before; takes its fds, also on error."""
        entry = descriptor.get("overlay")
        if not entry:
            return
        arrays: dict[str, SharedArray] = {}
        pending = _overlay_indices(descriptor)
        try:
            for key, ent in entry["arrays"].items():
                i = int(ent["fd_index"])
                pending.remove(i)
                arrays[str(key)] = SharedArray.from_fd(
                    fds[i], tuple(ent["shape"]), ent["dtype"], writable=False
                )
            view = overlay_view(entry["params"], arrays)
        except BaseException:
            for sa in arrays.values():
                sa.close()
            for i in pending:
                close_quietly(fds[i])
            raise
        if self.overlay is not None:
            self.overlay.close()
        self.overlay = view

    def _add_tensors(
        self, descriptor: Mapping[str, Any], fds: list[int], indices: list[int]
    ) -> list[TensorMeta]:
        entries = {int(e["fd_index"]): e for e in descriptor["tensors"]}
        metas: list[TensorMeta] = []
        pending = list(indices)
        try:
            while pending:
                i = pending.pop(0)
                meta = TensorMeta.from_dict(entries[i]["meta"])
                read_only = bool(entries[i].get("read_only", False)) or bool(entries[i].get("file", False))
                self.rules.mark(meta.name, base=bool(entries[i].get("base", False)), read_only=read_only)
                old = self.stored(meta.name) if self.has_tensor(meta.name) else None
                if old is not None and old.meta == meta and same_file(old.data, fds[i]):
                    close_quietly(fds[i])
                    metas.append(meta)
                    continue
                lo, hi = self.owned_range(meta.policy, meta.name)
                shape = (hi - lo, *meta.shape[1:])
                offset = int(entries[i].get("offset", 0))
                sa = SharedArray.from_fd(fds[i], shape, meta.dtype, writable=not read_only, offset=offset)
                self.map_rows(meta, sa)
                metas.append(meta)
        except BaseException:
            for i in pending:
                close_quietly(fds[i])
            raise
        return metas

    @property
    def catalog_stale(self) -> bool:
        """Whether the owner created or deleted tensors since the last sync."""
        return self.catalog_generation != self.seen_generation

    def sync_catalog(self, descriptor: Mapping[str, Any], fds: Sequence[int]) -> None:
        """Make this store's tensors those of a full export (``fetch_catalog``); takes the fds.

        Maps new and re-created tensors, unmaps deleted ones, and records the export's catalog
        generation, so ``catalog_stale`` is false until the owner changes its tensors again.
        """
        metas = self.add_attached(descriptor, fds)
        live = {m.name for m in metas}
        for name in [n for n in self.tensor_names() if n not in live]:
            self.unmap(name)
        self.seen_generation = int(descriptor.get("generation", 0))
        self.live_elsewhere = bool(descriptor.get("live", False))

    def forget_tensor(self, name: str) -> None:
        """Unmap tensor ``name`` (e.g. after the server deleted it); no-op if unknown."""
        self.check_open()
        if self.has_tensor(name):
            self.unmap(name)  # in-flight pulls keep their view alive: unmapped when they finish


def _overlay_indices(descriptor: Mapping[str, Any]) -> list[int]:
    """The fd indices of the overlay's arrays in an export (none when it has no overlay)."""
    entry = descriptor.get("overlay") or {}
    return [int(e["fd_index"]) for e in entry.get("arrays", {}).values()]
