"""The DGL-like user API: initialize, DistGraph, DistTensor, DistEmbedding, sparse optimizers, barrier."""

from .context import (
    barrier,
    finalize,
    get_client,
    initialize,
    is_standalone,
    shutdown_servers,
    snapshot,
)
from .embedding import DistEmbedding
from .graph import DistGraph, TensorView
from .optim import SparseAdagrad, SparseAdam, SparseOptimizer
from .tensor import DistTensor, Initializer, normal_init, uniform_init, zeros_init

__all__ = [
    "DistEmbedding",
    "DistGraph",
    "DistTensor",
    "Initializer",
    "SparseAdagrad",
    "SparseAdam",
    "SparseOptimizer",
    "TensorView",
    "barrier",
    "finalize",
    "get_client",
    "initialize",
    "is_standalone",
    "normal_init",
    "shutdown_servers",
    "snapshot",
    "uniform_init",
    "zeros_init",
]
