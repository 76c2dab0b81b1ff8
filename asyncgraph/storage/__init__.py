"""Partition storage: memfd-backed shared arrays, a cross-process RW lock, the PartitionStore,
and fd passing to co-located clients."""

from asyncgraph.storage.fdpass import FdExporter, attach_store, fetch_tensors
from asyncgraph.storage.init import InitSpec, validate_init
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import Policy, TensorMeta
from asyncgraph.storage.rwlock import LocalRWLock, RWLock, SharedRWLock
from asyncgraph.storage.store import PartitionStore

__all__ = [
    "FdExporter",
    "InitSpec",
    "LocalRWLock",
    "PartitionStore",
    "Policy",
    "RWLock",
    "SharedArray",
    "SharedRWLock",
    "TensorMeta",
    "attach_store",
    "fetch_tensors",
    "validate_init",
]
