"""The state every partition store holds and the view of it that sharing uses (``StoreBase``):
structure, tensors, lock, rules; lookups, closing. ``PartitionStore`` (``store.py``) adds
creation, validated reads and writes and protection on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Self

import numpy as np

from asyncgraph.errors import InvalidRequestError, UnknownTensorError
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.partition.typed import typed_range
from asyncgraph.storage.filemap import is_file_backed
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import Policy, TensorMeta
from asyncgraph.storage.protect import TensorRules
from asyncgraph.storage.rwlock import LocalRWLock, RWLock, SharedRWLock
from asyncgraph.storage.tensors import StoredTensor

if TYPE_CHECKING:
    from asyncgraph.storage.overlay import Overlay

__all__ = ["STRUCTURE_KEYS", "StoreBase"]

#: The structure arrays every store holds, in this order.
STRUCTURE_KEYS = ("indptr", "indices", "eids")


class StoreBase:
    """One partition's in-edges (CSC) and named tensors: what a store holds and how it is found.

    ``indptr``/``indices``/``eids`` are read-only. Tensor rows are sharded by policy: a "node"
    tensor holds rows ``node_range``, an "edge" tensor rows ``edge_range``.
    """

    graph_name: str
    part_id: int
    book: RangePartitionBook
    node_range: tuple[int, int]
    edge_range: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray
    #: A live graph's added and removed edges (``service/live.py``; None: never updated).
    overlay: Overlay | None = None

    def __init__(
        self,
        graph_name: str,
        part_id: int,
        book: RangePartitionBook,
        structure: Mapping[str, SharedArray | np.ndarray],
        lock: RWLock,
        *,
        shared: bool,
        attached: bool,
    ) -> None:
        """Low-level: use ``create``, ``from_partition`` or ``attach``."""
        self.graph_name = graph_name
        self.part_id = part_id
        self.book = book
        self.node_range = book.node_range(part_id)
        self.edge_range = book.edge_range(part_id)
        self._structure = dict(structure)
        self.indptr, self.indices, self.eids = (self._plain(self._structure[k]) for k in STRUCTURE_KEYS)
        self._lock = lock
        # our own locks are entered without a context manager on the pull path (one call less)
        self._read_pair = (lock.acquire_read, lock.release_read) if isinstance(lock, LocalRWLock) else None
        self._owner = f"graph {graph_name!r} partition {part_id}"
        self._shared = shared
        self._attached = attached
        self._tensors: dict[str, StoredTensor] = {}
        #: What requests may do with which tensor: the partition's own tensors (never deleted, no
        #: optimizer state), read-only ones, the tensor cap and the memory budget (``protect``).
        self.rules = TensorRules(self._owner)
        self._closed = False
        self._final_seals = True  # False while loading the partition's own tensors: see protect
        self._protected = False

    @staticmethod
    def _plain(a: SharedArray | np.ndarray) -> np.ndarray:
        return a.array if isinstance(a, SharedArray) else a

    def _owned(self, policy: Policy, key: str = "") -> tuple[int, int]:
        """Global rows held of tensor ``key``: the owned node or edge range, or for a per-type
        tensor (``"node:paper/feat"``) the run of that range its type's rows occupy."""
        typed = typed_range(self.book, self.part_id, key) if key else None
        if typed is not None:
            return typed
        return self.node_range if policy == "node" else self.edge_range

    def _register(self, meta: TensorMeta, data: SharedArray | np.ndarray) -> StoredTensor:
        """Make ``data`` (this partition's rows) tensor ``meta.name``."""
        t = StoredTensor(meta, data, self._owned(meta.policy, meta.name)[0])
        self._tensors[meta.name] = t
        return t

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError(
                f"store of graph {self.graph_name!r} partition {self.part_id} is closed"
            )

    def catalog_changed(self) -> None:
        """Tell processes mapping this store that a tensor came or went (owner only)."""
        if not self._attached and isinstance(self._lock, SharedRWLock):
            self._lock.advance_generation()

    @property
    def catalog_generation(self) -> int:
        """How many tensor creations and deletions the owner has counted (shared stores)."""
        return self._lock.generation if isinstance(self._lock, SharedRWLock) else 0

    def _drop(self, name: str) -> None:
        t = self._tensors.pop(name)
        if isinstance(t.data, SharedArray):
            t.data.close()

    def _get(self, name: str) -> StoredTensor:
        t = self._tensors.get(name)
        if t is None:
            self._check_open()
            have = ", ".join(sorted(self._tensors)) or "none"
            raise UnknownTensorError(
                f"no tensor {name!r} in graph {self.graph_name!r} partition {self.part_id} (have: {have})"
            )
        return t

    def tensor_meta(self, name: str) -> TensorMeta:
        """The tensor's metadata; UnknownTensorError lists what exists."""
        return self._get(name).meta

    def list_tensors(self) -> list[TensorMeta]:
        return [t.meta for t in self._tensors.values()]

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def local_sizes(self) -> dict[str, tuple[int, int]]:
        """``name -> (rows, bytes)`` this partition holds of each tensor (for metrics)."""
        return {name: (t.rows.shape[0], t.rows.nbytes) for name, t in list(self._tensors.items())}

    def memory_bytes(self) -> int:
        """Bytes of the tensors held in memory of their own (memfds, heap): what counts against
        ``--memory-budget``. Tensors served from partition files are page cache the kernel can
        drop and reread, and are not counted."""
        return sum(t.rows.nbytes for t in list(self._tensors.values()) if not is_file_backed(t.data))

    @property
    def lock(self) -> RWLock:
        """The store's reader/writer lock (cross-process when shared)."""
        return self._lock

    @property
    def shared(self) -> bool:
        return self._shared

    @property
    def attached(self) -> bool:
        return self._attached

    def check_open(self) -> None:
        """``InvalidRequestError`` once the store is closed."""
        self._check_open()

    @property
    def structure_arrays(self) -> Mapping[str, SharedArray | np.ndarray]:
        """``indptr``, ``indices``, ``eids`` as stored (memfds in a shared store)."""
        return self._structure

    def stored(self, name: str) -> StoredTensor:
        """Tensor ``name`` as stored (its meta and this partition's rows)."""
        return self._get(name)

    def tensor_names(self) -> list[str]:
        """Every tensor's stored key, in creation order."""
        return list(self._tensors)

    def owned_range(self, policy: Policy, key: str = "") -> tuple[int, int]:
        """The global IDs whose rows this partition holds for tensors of ``policy`` (of tensor
        ``key`` when given: a per-type tensor holds its type's run only)."""
        return self._owned(policy, key)

    def map_rows(self, meta: TensorMeta, data: SharedArray | np.ndarray) -> None:
        """Make ``data`` (this partition's rows, e.g. mapped from an owner's memfd) tensor
        ``meta.name``, replacing a tensor of that name."""
        if meta.name in self._tensors:
            self._drop(meta.name)
        self._register(meta, data)

    def unmap(self, name: str) -> None:
        """Forget tensor ``name`` here (in-flight pulls keep their view until they finish)."""
        self._drop(name)

    def close(self) -> None:
        """Release every mapping and fd this store holds; idempotent.

        Arrays the caller still references (from ``local_rows``) stay valid until dropped.
        """
        if self._closed:
            return
        self._closed = True
        for name in list(self._tensors):
            self._drop(name)
        empty = np.empty(0, dtype=np.int64)
        self.indptr = self.indices = self.eids = empty
        for a in self._structure.values():
            if isinstance(a, SharedArray):
                a.close()
        self._structure.clear()
        if self.overlay is not None:
            self.overlay.close()
        if isinstance(self._lock, SharedRWLock):
            self._lock.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "attached" if self._attached else ("shared" if self._shared else "local")
        return (
            f"PartitionStore(graph={self.graph_name!r}, part={self.part_id}, {kind}, "
            f"tensors={sorted(self._tensors)})"
        )
