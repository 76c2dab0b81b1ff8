"""The client's reads of tensor rows: the one pull path, with a per-tensor feature cache.

``TensorReads`` is the part of ``AsyncClient`` that pulls rows (split by owner, each owner's
share split again by a remote partition when it would not fit one frame) and answers the rows a
``FeatureCache`` holds from this process's memory. A cache is built for read-only tensors only
(``build_cache``); the client drops it on its own writes to the tensor (push, sparse_update,
create, delete, release). ``Traffic`` (optional) counts what a pull cost over sockets.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import as_id_array, unique_sorted
from asyncgraph.errors import ShapeMismatchError
from asyncgraph.protocol.ops import Op
from asyncgraph.service.base import Partition
from asyncgraph.storage.store import TensorMeta

from .cache import FeatureCache, meta_row_bytes
from .catalog import TensorCatalog
from .edge_routing import owner_positions
from .local import LocalPartition
from .scatter import gather_rows, scatter, take
from .state import ClientState
from .traffic import Traffic, count_remote

__all__ = ["TensorReads"]


class TensorReads:
    """Pulls of rows, and the feature caches they read from (a part of ``AsyncClient``)."""

    def __init__(self, state: ClientState, catalog: TensorCatalog) -> None:
        self.state = state
        self.catalog = catalog

    async def pull(self, name: str, ids: Any) -> torch.Tensor:
        """Rows ``ids`` (global, any order, duplicates allowed) of tensor ``name``."""
        return torch.from_numpy(await self.pull_numpy(name, ids))

    async def pull_numpy(
        self, name: str, ids: Any, traffic: Traffic | None = None, *, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Rows ``ids`` of ``name`` as numpy; served from the tensor's feature cache where it holds
        them. ``traffic`` (optional) accumulates remote rows/bytes/requests and cache hits/misses.

        ``out`` (shape ``(len(ids), *row_shape)``, the tensor's dtype, C-contiguous): every owner
        writes its rows straight to their places in it (a loader's staging buffer), so each row
        is copied on the host once; ``traffic.pulled_into_bytes`` counts those bytes. With a
        feature cache, cached rows are copied from it and only the others are asked for.
        """
        meta = await self.catalog.tensor_meta(name)
        gids = as_id_array(ids)
        if out is not None:
            return await self._pull_into(name, meta, gids, out, traffic)
        cache = self.state.caches.get(name)
        if cache is None:
            return await self._pull_uncached(name, meta, gids, traffic)
        hit, slot = cache.lookup(gids)
        hits = int(np.count_nonzero(hit))
        before = traffic.remote_rows if traffic is not None else 0
        bounds = self.state.book.bounds(meta.policy)
        local = next(
            (
                p.part_id
                for p in self.state.partitions
                if p.runs_here(Op.PULL) and bounds[p.part_id + 1] > bounds[p.part_id]
            ),
            None,
        )
        if hits == 0:
            out = await self._pull_uncached(name, meta, gids, traffic)
        elif hits == gids.size:
            out = cache.rows[slot]
        elif local is not None:
            # Cached positions read a row of a partition in this process instead (cheap, never
            # a request), so the pull keeps its one-gather shape; cached rows then go over them.
            substitute = gids.copy()
            substitute[hit] = int(bounds[local])
            out = await self._pull_uncached(name, meta, substitute, traffic)
            out[hit] = cache.rows[slot[hit]]
        else:
            out = np.empty((gids.size, *meta.row_shape), dtype=meta.dtype)
            out[hit] = cache.rows[slot[hit]]
            miss = np.flatnonzero(~hit)
            out[miss] = await self._pull_uncached(name, meta, gids[miss], traffic)
        if traffic is not None:
            traffic.cache_hits += hits
            traffic.cache_misses += traffic.remote_rows - before
        return out

    def pull_here(self, name: str, ids: Any) -> np.ndarray | None:
        """The rows, read on the caller's thread, when nothing needs the event loop: IDs owned by
        one partition held in this process with no server behind it (standalone; every pull of a
        one-partition graph), a tensor whose metadata is known and that has no feature cache.
        ``None`` otherwise: use ``pull_numpy``.

        The blocking API tries this first, so a standalone ``g.ndata["feat"][ids]`` costs no hop
        to the client's loop thread (a third of a 1k-row read here). Reads are safe beside the
        loop thread's work: the store takes its read lock.
        """
        meta = self.state.metas.get(name)
        if meta is None or name in self.state.caches:
            return None
        gids = as_id_array(ids)
        parts = owner_positions(self.state.book, gids, meta.policy)
        owners = [i for i, pos in enumerate(parts) if pos.size]
        if len(owners) != 1:
            return None if owners else np.empty((0, *meta.row_shape), dtype=meta.dtype)
        owner = self.state.partitions[owners[0]]
        if not isinstance(owner, LocalPartition) or owner.server is not None:
            return None  # over a socket, or mapped from a server that may have restarted
        return owner.service.pull(name, gids)

    async def _pull_into(
        self, name: str, meta: TensorMeta, gids: np.ndarray, out: np.ndarray, traffic: Traffic | None
    ) -> np.ndarray:
        want = (gids.size, *meta.row_shape)
        if tuple(out.shape) != want or out.dtype != np.dtype(meta.dtype) or not out.flags.c_contiguous:
            raise ShapeMismatchError(
                f"pull of {name!r} into out: expected a C-contiguous {meta.dtype} array of shape {want}, "
                f"got {out.dtype} {tuple(out.shape)}"
            )
        row_bytes = meta_row_bytes(meta)
        cache = self.state.caches.get(name)
        places: np.ndarray | None = None  # where the owners' rows go: all of out, or the misses
        if cache is not None:  # cached rows copied once, from the cache; the owners send the rest
            hit, slot = cache.lookup(gids)
            hits = np.flatnonzero(hit)
            if hits.size:
                out[hits] = cache.rows[slot[hits]]
                places = np.flatnonzero(~hit)
                gids = gids[places]
        parts = owner_positions(self.state.book, gids, meta.policy)
        if traffic is not None:
            rows = count_remote(self.state.partitions, parts, Op.PULL, traffic)
            traffic.remote_rows += rows
            traffic.remote_bytes += rows * row_bytes
            traffic.pulled_into_bytes += out.shape[0] * row_bytes
            if cache is not None:
                traffic.cache_hits += out.shape[0] - gids.size
                traffic.cache_misses += rows

        def where(pos: np.ndarray | None) -> np.ndarray | None:
            if places is None:
                return pos  # a single owner is called with pos None: it fills out[:n] in order
            return places if pos is None else places[pos]

        if gids.size:
            await scatter(
                self.state.partitions,
                parts,
                Op.PULL,
                lambda p, pos: p.pull(name, take(gids, pos), row_bytes, out=out, where=where(pos)),
            )
        return out

    async def _pull_uncached(
        self, name: str, meta: TensorMeta, gids: np.ndarray, traffic: Traffic | None
    ) -> np.ndarray:
        parts = owner_positions(self.state.book, gids, meta.policy)
        row_bytes = meta_row_bytes(meta)
        if traffic is not None:
            rows = count_remote(self.state.partitions, parts, Op.PULL, traffic)
            traffic.remote_rows += rows
            traffic.remote_bytes += rows * row_bytes
        base = self._gather_base(parts, gids.size)
        if base is None and sum(1 for pos in parts if pos.size) < 2:
            rows_by_part = await scatter(
                self.state.partitions, parts, Op.PULL, lambda p, pos: p.pull(name, take(gids, pos), row_bytes)
            )
            return gather_rows(rows_by_part, gids.size, meta.row_shape, meta.dtype)
        if base is None:
            # Several owners: each writes its rows straight to their places in one output; a
            # remote owner of a large pull does so chunk by chunk as the chunks arrive, so the
            # 200 MB of a 100k-row pull are not assembled after the last byte came in.
            out = np.empty((gids.size, *meta.row_shape), dtype=meta.dtype)
            await scatter(
                self.state.partitions,
                parts,
                Op.PULL,
                lambda p, pos: p.pull(name, take(gids, pos), row_bytes, out=out, where=pos),
            )
            return out
        # A partition in this process owns most rows: it gathers a row for EVERY position (the
        # others' positions read its first row) and the other owners' rows are written over
        # theirs. One gather of all rows plus a scatter of the few, instead of a gather of the
        # many plus a scatter of all (numpy's scatter costs ~1.7x its gather per row).
        base_ids = gids.copy()
        first = int(gids[parts[base][0]])  # an ID the base holds (a per-type tensor: not every owned ID)
        for i, others in enumerate(parts):
            if i != base and others.size:
                base_ids[others] = first

        def pull(p: Partition, pos: np.ndarray | None) -> Awaitable[np.ndarray]:
            ids = base_ids if p.part_id == base else take(gids, pos)
            return p.pull(name, ids, row_bytes)

        rows_by_part = await scatter(self.state.partitions, parts, Op.PULL, pull)
        merged: np.ndarray = next(got for where, got in rows_by_part if where is parts[base])
        for where, got in rows_by_part:
            if where is not parts[base]:
                merged[where] = got
        return merged

    def _gather_base(self, parts: list[np.ndarray], size: int) -> int | None:
        """The partition held in this process that should gather every row of a pull, if any:
        one owning at least 40% of the rows (below that, its own gather plus a scatter of all
        rows is cheaper), when more than one partition owns some."""
        if sum(1 for pos in parts if pos.size) < 2:
            return None
        best, best_size = None, 0
        for i, pos in enumerate(parts):
            if pos.size > best_size and self.state.partitions[i].runs_here(Op.PULL):
                best, best_size = i, int(pos.size)
        return best if best is not None and best_size * 5 >= size * 2 else None

    def remote_ids(self, policy: str = "node") -> np.ndarray:
        """Global IDs owned by partitions reached over a socket (candidates for a feature cache)."""
        book = self.state.book
        ranges = []
        for part in self.state.partitions:
            if not part.runs_here(Op.PULL):
                lo, hi = book.node_range(part.part_id) if policy == "node" else book.edge_range(part.part_id)
                ranges.append(np.arange(lo, hi, dtype=np.int64))
        return np.concatenate(ranges) if ranges else np.empty(0, np.int64)

    # --- feature cache ------------------------------------------------------------------------
    async def build_cache(self, name: str, ids: Any) -> FeatureCache:
        """Cache rows ``ids`` of read-only tensor ``name`` in this process (replacing its cache).

        Later pulls of ``name`` read cached rows here; this client's own writes to ``name`` drop
        the cache. Only cache tensors no other process writes while the cache is in use.
        """
        meta = await self.catalog.tensor_meta(name)
        gids = unique_sorted(as_id_array(ids))
        self.state.caches.pop(name, None)
        rows = await self._pull_uncached(name, meta, gids, None)
        cache = FeatureCache(name, gids, np.ascontiguousarray(rows))
        self.state.caches[name] = cache
        return cache

    def feature_cache(self, name: str) -> FeatureCache | None:
        """The feature cache of tensor ``name``, if this client holds one."""
        return self.state.caches.get(name)

    def drop_cache(self, name: str) -> None:
        """Forget the feature cache of tensor ``name`` (if any)."""
        self.state.caches.pop(name, None)
