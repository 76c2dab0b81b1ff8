"""Which tensors a request may write, delete or give optimizer state (issue 22).

A partition's own tensors (loaded from its files: features, labels, masks) are read-only on a
server unless it was started with ``--writable-partition-data``, and can never be deleted
(``PartitionStore.protect``). Optimizer state (``<name>#adagrad_state``, ``#adam_m``, ...) is only
for tensors made at run time (embeddings): never for the partition's own tensors, and never for
optimizer state itself (before: a sparse optimizer run on state created state for state).
"""

from __future__ import annotations

from collections.abc import Collection

from asyncgraph.errors import ReadOnlyTensorError
from asyncgraph.names import ADAGRAD_STATE_SUFFIX, ADAM_M_SUFFIX, ADAM_STEP_SUFFIX, ADAM_V_SUFFIX

__all__ = ["STATE_SUFFIXES", "check_optimizable", "check_state_name", "state_base"]

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
