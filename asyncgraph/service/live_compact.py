"""One compaction of a partition's live overlay (issue 35; ``storage/compaction.py``).

``Compaction(live)`` checks the memory budget (``MemoryBudgetError``, nothing changed) and
captures the overlay where updates are applied; ``fold`` runs anywhere (a server runs it on a
worker thread while reads and updates go on: removals are recorded meanwhile); ``finish``
swaps the folded overlay in under the store's write lock and advances the catalog generation,
so co-located readers map the new one (their old view reads as stale). ``compact_now`` does
the three in a row (standalone, and the replay of a logged compaction).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from asyncgraph import failpoints
from asyncgraph.errors import LiveGraphError
from asyncgraph.storage.compaction import CompactedOverlay, adopt, capture, fold, fold_bytes

if TYPE_CHECKING:
    from asyncgraph.service.live import LiveStructure

__all__ = ["Compaction", "compact_now"]


class Compaction:
    """A compaction under way (see the module docstring)."""

    def __init__(self, live: LiveStructure) -> None:
        store, overlay = live.store, live.overlay
        if overlay is None:
            raise LiveGraphError(f"partition {store.part_id} was never updated: nothing to compact")
        if live.removed_meanwhile is not None:
            raise LiveGraphError(f"partition {store.part_id} is compacting already")
        if store.rules.memory_budget:  # the old overlay stays until the swap: both must fit
            tensors = sum(size for _, size in store.local_sizes().values())
            need = fold_bytes(overlay, store.indptr)
            store.rules.check_room("compact (a new CSC of the live edges)", need, tensors)
        self.live = live
        self.started = time.perf_counter()
        self.input = capture(overlay, store.indptr, store.indices, store.eids, live.label)
        self.before = overlay
        overlay.rows_meanwhile = []  # rows of new IDs written while it folds: adopt copies them
        live.removed_meanwhile = []

    def fold(self) -> CompactedOverlay:
        """The folded overlay (new arrays; the store does not change)."""
        if failpoints.enabled:
            failpoints.hit("compaction.fold")  # tests: a slow fold, to write while it runs
        return fold(self.input)

    def finish(self, new: CompactedOverlay) -> dict[str, float]:
        """Swap ``new`` in (with what changed since the capture); what it did, for the caller."""
        live, store = self.live, self.live.store
        removed = live.removed_meanwhile or []
        try:
            if store.overlay is not self.before:
                raise LiveGraphError(f"partition {store.part_id}'s overlay was replaced while it folded")
            with store.lock.write():
                adopt(new, self.before, self.input, removed)
                store.overlay = new
        except BaseException:
            self.abandon(new)
            raise
        live.removed_meanwhile = None
        self.before.rows_meanwhile = None
        self.before.close()
        store.catalog_changed()  # co-located readers map the new overlay
        return {
            "folded_edges": new.folded_edges,
            "seconds": time.perf_counter() - self.started,
            "bytes": new.stats()["overlay_bytes"],
            "compactions": new.compactions,
        }

    def abandon(self, new: CompactedOverlay | None = None) -> None:
        """Give up (the fold failed): the overlay stays as it is."""
        self.live.removed_meanwhile = None
        self.before.rows_meanwhile = None
        if new is not None:
            new.close()


def compact_now(live: LiveStructure) -> dict[str, float]:
    """Fold ``live``'s overlay into a new CSC and swap it in, all at once."""
    job = Compaction(live)
    try:
        new = job.fold()
    except BaseException:
        job.abandon()
        raise
    return job.finish(new)
