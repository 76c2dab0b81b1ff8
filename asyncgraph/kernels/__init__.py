"""Server-side kernels, pure numpy, run by the owner of the data: neighbour sampling, edge lookup
and sparse optimizer updates. The server's handlers and a client's local partitions call the same
functions, so standalone and served results are equal by construction."""

from asyncgraph.kernels.edges import find_edges_partition
from asyncgraph.kernels.partition_sampling import keyed_rng, sample_partition
from asyncgraph.kernels.sampling import in_degrees, sample_csc
from asyncgraph.kernels.sparse_optim import (
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
    "find_edges_partition",
    "in_degrees",
    "keyed_rng",
    "sample_csc",
    "sample_partition",
    "state_tensor_metas",
    "validate_spec",
]
