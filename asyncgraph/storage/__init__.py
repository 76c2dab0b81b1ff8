"""Partition storage: memfd-backed shared arrays, a cross-process RW lock, the PartitionStore,
and fd passing to co-located clients."""

from asyncgraph.storage.attached import AttachedStore
from asyncgraph.storage.fdpass import FdExporter, attach_store, fetch_tensors
from asyncgraph.storage.initializers import InitSpec, validate_init
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.meta import Policy, TensorMeta
from asyncgraph.storage.rwlock import LocalRWLock, RWLock, SharedRWLock
from asyncgraph.storage.sharing import export
from asyncgraph.storage.store import PartitionStore

__all__ = [
    "AttachedStore",
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
    "export",
    "fetch_tensors",
    "validate_init",
]
