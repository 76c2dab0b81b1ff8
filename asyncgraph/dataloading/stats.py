"""What one epoch of a loader cost: ``LoaderStats`` (shared by the loaders and their workers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from asyncgraph.client.traffic import Traffic

__all__ = ["LoaderStats"]


@dataclass
class LoaderStats:
    """One epoch of a loader, in seconds: ``sample`` and ``pull`` run in the background (their sum
    can exceed the epoch's wall time), ``wait`` is what the training loop spent blocked on the
    next batch, ``compute`` what it spent between receiving a batch and asking for the next.
    ``input_nodes`` counts the rows whose features were pulled. ``traffic`` is what the graph
    loaders' requests cost: remote rows/bytes and requests, request waves per batch, and hits and
    misses of the feature cache (``DistNodeDataLoader(feature_cache_bytes=)``; co-located
    partitions are read through shared memory, not cached).
    """

    epoch: int = -1
    batches: int = 0
    sample: float = 0.0
    pull: float = 0.0
    wait: float = 0.0
    compute: float = 0.0
    input_nodes: int = 0
    copy: float = 0.0  # packing + queueing device copies (background), or synchronous copies
    #: bytes of the batches' pulled tensors (features, labels), and the host bytes written to
    #: gather and stage them (1.0x theirs when rows land where the device copy reads them)
    feature_bytes: int = 0
    host_copy_bytes: int = 0
    #: bytes of structure (IDs, blocks) copied into staging buffers (a worker's slot, a pinned pool)
    structure_bytes: int = 0
    traffic: Traffic = field(default_factory=Traffic)

    #: What one batch's preparation adds (a loader worker's stats of the batch it built).
    BATCH_FIELDS: ClassVar[tuple[str, ...]] = (
        "sample",
        "pull",
        "copy",
        "input_nodes",
        "feature_bytes",
        "host_copy_bytes",
        "structure_bytes",
    )

    def add_batch(self, other: LoaderStats) -> None:
        """Add what preparing a batch cost elsewhere (``other``: its stats) to this epoch's."""
        for name in self.BATCH_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.traffic.add(other.traffic)

    def as_dict(self) -> dict[str, float]:
        """The stats as a flat dict (for logs, JSON, or metrics of the trainer's choosing)."""
        out: dict[str, float] = {
            "epoch": self.epoch,
            "batches": self.batches,
            "sample": self.sample,
            "pull": self.pull,
            "wait": self.wait,
            "compute": self.compute,
            "input_nodes": self.input_nodes,
            "copy": self.copy,
            "feature_bytes": self.feature_bytes,
            "host_copy_bytes": self.host_copy_bytes,
            "structure_bytes": self.structure_bytes,
        }
        out.update(self.traffic.as_dict())
        out["cache_hit_rate"] = self.traffic.hit_rate
        return out
