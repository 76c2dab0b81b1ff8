"""The DGL-like user API: initialize, DistGraph, DistTensor, DistEmbedding, sparse optimizers, barrier."""

from .context import barrier, finalize, get_client, initialize, is_standalone, shutdown_servers
from .embedding import DistEmbedding
from .graph import DistGraph, TensorView
from .optim import SparseAdagrad, SparseAdam, SparseOptimizer
from .tensor import DistTensor, Initializer, normal_init, uniform_init, zeros_init
from .trainers import ddp_backend, spawn_trainers, trainer_device

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
    "ddp_backend",
    "finalize",
    "get_client",
    "initialize",
    "is_standalone",
    "normal_init",
    "shutdown_servers",
    "spawn_trainers",
    "trainer_device",
    "uniform_init",
    "zeros_init",
]
