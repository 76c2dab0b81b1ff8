"""Which tensors a request may write, delete or give optimizer state (issue 22).

A partition's own tensors (loaded from its files: features, labels, masks) are read-only on a
server unless it was started with ``--writable-partition-data``, and can never be deleted
(``PartitionStore.protect``). Optimizer state (``<name>#adagrad_state``, ``#adam_m``, ...) is only
for tensors made at run time (embeddings): never for the partition's own tensors, and never for
optimizer state itself (before: a sparse optimizer run on state created state for state).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping

import numpy as np

from asyncgraph.errors import MemoryBudgetError, ReadOnlyTensorError, TooManyTensorsError
from asyncgraph.names import ADAGRAD_STATE_SUFFIX, ADAM_M_SUFFIX, ADAM_STEP_SUFFIX, ADAM_V_SUFFIX
from asyncgraph.storage.filemap import is_file_backed
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import TensorMeta
from asyncgraph.storage.tensors import StoredTensor

__all__ = ["STATE_SUFFIXES", "TensorRules", "check_optimizable", "check_state_name", "state_base"]

STATE_SUFFIXES = (ADAGRAD_STATE_SUFFIX, ADAM_M_SUFFIX, ADAM_V_SUFFIX, ADAM_STEP_SUFFIX)


def state_base(name: str) -> str | None:
    """The tensor ``name`` is optimizer state of, or None when it is not state."""
    for suffix in STATE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def check_state_name(name: str, base_tensors: Collection[str]) -> None:
    """Refuse creating optimizer state for a partition tensor or for optimizer state."""
    of = state_base(name)
    if of is not None and (of in base_tensors or state_base(of) is not None):
        raise ReadOnlyTensorError(
            f"tensor {name!r} would be optimizer state of {of!r}, which is "
            f"{'optimizer state itself' if state_base(of) else 'the partition own data'}; "
            "optimizer state is only for embeddings (tensors created at run time)"
        )


def check_optimizable(name: str, base_tensors: Collection[str]) -> None:
    """Refuse a sparse optimizer step on a partition tensor or on optimizer state."""
    if name in base_tensors:
        raise ReadOnlyTensorError(
            f"sparse_update {name!r}: the partition's own data cannot be optimized; sparse optimizers "
            "are for embeddings (tensors created at run time)"
        )
    if state_base(name) is not None:
        raise ReadOnlyTensorError(
            f"sparse_update {name!r}: this is optimizer state of {state_base(name)!r}; only embeddings "
            "are optimized"
        )


class TensorRules:
    """One store's rules for its tensors: which are the partition's own (``base``: never deleted,
    never given optimizer state), which no request may write (``read_only``), and how many tensors
    (``max_tensors``) and bytes (``memory_budget``) they may take together; 0 means no limit."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.base: set[str] = set()
        self.read_only: set[str] = set()
        self.max_tensors = 0
        self.memory_budget = 0
        #: Bytes held beside the tensors that count against the budget too (a server's waiting
        #: barriers, issue 32; set by the server).
        self.held_elsewhere: Callable[[], int] = lambda: 0

    def protect(self, tensors: Mapping[str, StoredTensor], *, writable_base: bool = False) -> None:
        """The base tensors become read-only, unless ``writable_base`` (DGL's writable ``ndata``).

        In shared memory too (issue 32): their memfds are sealed against every later writable
        mapping (``SharedArray.seal``), so a co-located process sent the fd can only read them."""
        self.read_only = set() if writable_base else set(self.base)
        for name in self.base:
            data = tensors[name].data if name in tensors else None
            if isinstance(data, SharedArray):
                data.seal(read_only=name in self.read_only)

    def mark(self, name: str, *, base: bool, read_only: bool) -> None:
        """Record a tensor's flags as its owner exported them (attached stores)."""
        for flags, on in ((self.base, base), (self.read_only, read_only)):
            if on:
                flags.add(name)
            else:
                flags.discard(name)

    def check_create(
        self, meta: TensorMeta, existing: Iterable[StoredTensor], owned: tuple[int, int]
    ) -> None:
        """Refuse a new tensor: state for the wrong tensor, over the tensor cap or the budget."""
        check_state_name(meta.name, self.base)
        tensors = list(existing)
        if self.max_tensors and len(tensors) >= self.max_tensors:
            raise TooManyTensorsError(
                f"tensor {meta.name!r}: {self.owner} already holds {len(tensors)} tensors, its limit "
                f"(server option --max-tensors {self.max_tensors}); delete or release some first"
            )
        need = (owned[1] - owned[0]) * math.prod(meta.shape[1:]) * np.dtype(meta.dtype).itemsize
        held = sum(t.rows.nbytes for t in tensors if not is_file_backed(t.data))  # page cache is not counted
        self.check_room(f"tensor {meta.name!r}", need, held)

    def check_room(self, what: str, need: int, tensor_bytes: int) -> None:
        """Refuse ``need`` more bytes when the tensors (``tensor_bytes``) and what else is held
        would pass the memory budget."""
        if self.memory_budget:
            held = tensor_bytes + self.held_elsewhere()
            if held + need > self.memory_budget:
                raise MemoryBudgetError(
                    f"{what} needs {need} bytes here; {self.owner}'s tensors and waiting barriers hold "
                    f"{held} of its {self.memory_budget}-byte budget (server option --memory-budget)"
                )

    def check_delete(self, name: str) -> None:
        if name in self.base:
            raise ReadOnlyTensorError(
                f"tensor {name!r} is {self.owner}'s own data (from its partition files): it cannot be deleted"
            )

    def check_write(self, name: str) -> None:
        if name in self.read_only:
            raise ReadOnlyTensorError(
                f"tensor {name!r} is {self.owner}'s own data and this server keeps it read-only "
                "(start the server with --writable-partition-data to allow writes, as DGL's ndata; "
                "standalone: set ASYNCGRAPH_WRITABLE_PARTITION_DATA=1)"
            )
