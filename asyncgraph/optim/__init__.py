"""Sparse optimizer kernels that run on the owner of each row (no I/O, no torch)."""

from .kernels import (
    ADAGRAD_STATE_SUFFIX,
    ADAM_M_SUFFIX,
    ADAM_STEP_SUFFIX,
    ADAM_V_SUFFIX,
    apply_sparse_update,
    state_tensor_metas,
    validate_spec,
)

__all__ = [
    "ADAGRAD_STATE_SUFFIX",
    "ADAM_M_SUFFIX",
    "ADAM_STEP_SUFFIX",
    "ADAM_V_SUFFIX",
    "apply_sparse_update",
    "state_tensor_metas",
    "validate_spec",
]
