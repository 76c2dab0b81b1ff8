"""Offline partitioning: write range-owned partitions (``partition_graph``) and read them back."""

from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.partition.config import PartitionConfig, PartSpec, TensorSpec
from asyncgraph.partition.partitioner import partition_graph
from asyncgraph.partition.reader import (
    Partition,
    load_orig_ids,
    load_partition,
    load_partition_book,
    load_partition_feats,
    summarize_partitions,
)

__all__ = [
    "PartSpec",
    "Partition",
    "PartitionConfig",
    "RangePartitionBook",
    "TensorSpec",
    "load_orig_ids",
    "load_partition",
    "load_partition_book",
    "load_partition_feats",
    "partition_graph",
    "summarize_partitions",
]
