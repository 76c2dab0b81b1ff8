"""asyncgraph: a distributed graph data server for GNN training.

Partition offline (``partition_graph``), serve each partition with ``python -m asyncgraph.server``
(or let ``python -m asyncgraph.launch`` do it), and train with the DGL-like API: ``initialize``,
``DistGraph``, ``DistTensor``, ``node_split``, ``sample_neighbors``, ``DistNodeDataLoader``.

Attributes are imported lazily so that a server process never pays for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncgraph.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "Graph": "asyncgraph.partition.graph",
    "DGLGraph": "asyncgraph.partition.graph:Graph",
    "graph": "asyncgraph.partition.graph",
    "HeteroGraph": "asyncgraph.partition.hetero_graph",
    "heterograph": "asyncgraph.partition.hetero_graph",
    "to_bidirected": "asyncgraph.partition.transform",
    "sample_etype_neighbors": "asyncgraph.distributed.hetero",
    "HeteroBlock": "asyncgraph.dataloading.hetero_block",
    "partition_graph": "asyncgraph.partition",
    "load_partition": "asyncgraph.partition",
    "Partition": "asyncgraph.partition",
    "PartitionConfig": "asyncgraph.partition",
    "RangePartitionBook": "asyncgraph.partition",
    "initialize": "asyncgraph.distributed",
    "finalize": "asyncgraph.distributed",
    "barrier": "asyncgraph.distributed",
    "shutdown_servers": "asyncgraph.distributed",
    "is_standalone": "asyncgraph.distributed",
    "DistGraph": "asyncgraph.distributed",
    "DistTensor": "asyncgraph.distributed",
    "DistEmbedding": "asyncgraph.distributed",
    "SparseAdagrad": "asyncgraph.distributed",
    "SparseAdam": "asyncgraph.distributed",
    "zeros_init": "asyncgraph.distributed",
    "uniform_init": "asyncgraph.distributed",
    "normal_init": "asyncgraph.distributed",
    "sample_neighbors": "asyncgraph.distributed.sampling",
    "SampledSubgraph": "asyncgraph.distributed.queries",
    "NodePartitionPolicy": "asyncgraph.distributed.queries",
    "EdgePartitionPolicy": "asyncgraph.distributed.queries",
    "NID": "asyncgraph.distributed.queries",
    "EID": "asyncgraph.distributed.queries",
    "ALL": "asyncgraph.distributed.queries",
    "node_split": "asyncgraph.distributed.split",
    "edge_split": "asyncgraph.distributed.split",
    "split_masks": "asyncgraph.distributed.split",
    "Block": "asyncgraph.dataloading",
    "to_block": "asyncgraph.dataloading",
    "NeighborSampler": "asyncgraph.dataloading",
    "DistNodeDataLoader": "asyncgraph.dataloading",
    "DistEdgeDataLoader": "asyncgraph.dataloading",
    "DistDataLoader": "asyncgraph.dataloading",
    "MiniBatch": "asyncgraph.dataloading",
    "Client": "asyncgraph.client",
    "AsyncClient": "asyncgraph.client",
    "InferenceClient": "asyncgraph.serve.client",
    "AsyncInferenceClient": "asyncgraph.serve.client",
}

# the async API, the GNN layers, the exceptions, and
# DGL's namespaces (``dgl.distributed.*``, ``dgl.dataloading.*``, ``dgl.sampling.*``)
_SUBMODULES = frozenset(
    {"aio", "nn", "errors", "distributed", "dataloading", "partition", "sampling", "function", "inference"}
)

if TYPE_CHECKING:
    from asyncgraph.client import AsyncClient, Client
    from asyncgraph.dataloading import (
        Block,
        DistDataLoader,
        DistEdgeDataLoader,
        DistNodeDataLoader,
        MiniBatch,
        NeighborSampler,
        to_block,
    )
    from asyncgraph.dataloading.hetero_block import HeteroBlock
    from asyncgraph.distributed import (
        DistEmbedding,
        DistGraph,
        DistTensor,
        SparseAdagrad,
        SparseAdam,
        barrier,
        finalize,
        initialize,
        is_standalone,
        normal_init,
        shutdown_servers,
        uniform_init,
        zeros_init,
    )
    from asyncgraph.distributed.hetero import sample_etype_neighbors
    from asyncgraph.distributed.queries import (
        ALL,
        EID,
        NID,
        EdgePartitionPolicy,
        NodePartitionPolicy,
        SampledSubgraph,
    )
    from asyncgraph.distributed.sampling import sample_neighbors
    from asyncgraph.distributed.split import edge_split, node_split, split_masks
    from asyncgraph.partition import (
        Partition,
        PartitionConfig,
        RangePartitionBook,
        load_partition,
        partition_graph,
    )
    from asyncgraph.partition.graph import Graph, graph
    from asyncgraph.partition.graph import Graph as DGLGraph
    from asyncgraph.partition.hetero_graph import HeteroGraph, heterograph
    from asyncgraph.partition.transform import to_bidirected
    from asyncgraph.serve.client import AsyncInferenceClient, InferenceClient


_lazy_getattr, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)


def __getattr__(name: str) -> Any:
    """Lazy exports, and ``__version__``: the installed distribution's version (from the git tag
    it was built at, by setuptools-scm), read on first use so that importing stays cheap."""
    if name != "__version__":
        return _lazy_getattr(name)
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("asyncgraph")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        found = "0.0.0+unknown"
    globals()["__version__"] = found
    return found


__all__ = [
    "ALL",
    "EID",
    "NID",
    "AsyncClient",
    "AsyncInferenceClient",
    "Block",
    "Client",
    "DGLGraph",
    "DistDataLoader",
    "DistEdgeDataLoader",
    "DistEmbedding",
    "DistGraph",
    "DistNodeDataLoader",
    "DistTensor",
    "EdgePartitionPolicy",
    "Graph",
    "HeteroBlock",
    "HeteroGraph",
    "InferenceClient",
    "MiniBatch",
    "NeighborSampler",
    "NodePartitionPolicy",
    "Partition",
    "PartitionConfig",
    "RangePartitionBook",
    "SampledSubgraph",
    "SparseAdagrad",
    "SparseAdam",
    "barrier",
    "edge_split",
    "finalize",
    "graph",
    "heterograph",
    "initialize",
    "is_standalone",
    "load_partition",
    "node_split",
    "normal_init",
    "partition_graph",
    "sample_etype_neighbors",
    "sample_neighbors",
    "shutdown_servers",
    "split_masks",
    "to_bidirected",
    "to_block",
    "uniform_init",
    "zeros_init",
]
