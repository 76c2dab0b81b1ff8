"""Offline partitioning: write range-owned partitions (``partition_graph``) and read them back."""

from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.partition.config import PartitionConfig, PartSpec, TensorSpec
from asyncgraph.partition.partitioner import partition_graph
from asyncgraph.partition.reader import Partition, load_partition, summarize_partitions

__all__ = [
    "PartSpec",
    "Partition",
    "PartitionConfig",
    "RangePartitionBook",
    "TensorSpec",
    "load_partition",
    "partition_graph",
    "summarize_partitions",
]
