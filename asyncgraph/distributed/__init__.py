"""The DGL-like user API: initialize, DistGraph, DistTensor, DistEmbedding, sparse optimizers, barrier.

DGL's ``dgl.distributed`` names that live elsewhere here are re-exported so ported scripts find
them under ``dgl.distributed``: ``node_split``/``edge_split``, ``sample_neighbors``, the partition
tools (``partition_graph``, ``load_partition``, ``load_partition_book``) and the loaders
(``DistDataLoader``, ``DistNodeDataLoader``, ``DistEdgeDataLoader``, imported on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncgraph.lazy import lazy_exports
from asyncgraph.names import DEFAULT_ETYPE, DEFAULT_NTYPE

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
from .hetero import sample_etype_neighbors
from .optim import SparseAdagrad, SparseAdam, SparseOptimizer
from .queries import EdgePartitionPolicy, NodePartitionPolicy
from .sampling import find_edges, in_subgraph, sample_neighbors
from .split import edge_split, node_split, split_masks
from .tensor import DistTensor, Initializer, normal_init, uniform_init, zeros_init
from .trainers import ddp_backend, resolve_device, spawn_trainers, trainer_device

if TYPE_CHECKING:
    from asyncgraph.dataloading.edge_loader import DistEdgeDataLoader
    from asyncgraph.dataloading.node_loader import DistNodeDataLoader
    from asyncgraph.dataloading.prefetch import DistDataLoader
    from asyncgraph.partition import (
        load_partition,
        load_partition_book,
        load_partition_feats,
        partition_graph,
    )
    from asyncgraph.partition.book import RangePartitionBook as GraphPartitionBook

__all__ = [
    "DEFAULT_ETYPE",
    "DEFAULT_NTYPE",
    "DistDataLoader",
    "DistEdgeDataLoader",
    "DistEmbedding",
    "DistGraph",
    "DistNodeDataLoader",
    "DistTensor",
    "EdgePartitionPolicy",
    "GraphPartitionBook",
    "Initializer",
    "NodePartitionPolicy",
    "SparseAdagrad",
    "SparseAdam",
    "SparseOptimizer",
    "TensorView",
    "barrier",
    "ddp_backend",
    "edge_split",
    "exit_client",
    "finalize",
    "find_edges",
    "get_client",
    "in_subgraph",
    "initialize",
    "is_standalone",
    "load_partition",
    "load_partition_book",
    "load_partition_feats",
    "node_split",
    "normal_init",
    "partition_graph",
    "resolve_device",
    "sample_etype_neighbors",
    "sample_neighbors",
    "shutdown_servers",
    "snapshot",
    "spawn_trainers",
    "split_masks",
    "trainer_device",
    "uniform_init",
    "zeros_init",
]

#: DGL's name for ``finalize``.
exit_client = finalize

_LAZY = {
    "DistDataLoader": "asyncgraph.dataloading.prefetch",
    "DistNodeDataLoader": "asyncgraph.dataloading.node_loader",
    "DistEdgeDataLoader": "asyncgraph.dataloading.edge_loader",
    "partition_graph": "asyncgraph.partition",
    "load_partition": "asyncgraph.partition",
    "load_partition_book": "asyncgraph.partition",
    "load_partition_feats": "asyncgraph.partition",
    "GraphPartitionBook": "asyncgraph.partition.book:RangePartitionBook",
}

#: Import the loaders and partition tools on first use (they pull in more modules).
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
