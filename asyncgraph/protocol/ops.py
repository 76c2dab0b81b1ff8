"""Every op a server answers, declared once: its argument record and what it may do.

``Op`` members are plain ``str`` on the wire. :data:`OPS` holds one :class:`OpSpec` per op; every
set of ops the code needs (which ops are logged, resent, refused by a replica, run in a client
over shared memory, ...) is derived from it, and so is the server's dispatch. Adding an op = one
``OpSpec`` here, its record in :mod:`asyncgraph.protocol.args`, one service method, and tests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from asyncgraph.protocol.args import (
    MAX_EPOCH,
    AddReplicaArgs,
    ArgsRecord,
    BarrierArgs,
    CreateTensorArgs,
    DegreesArgs,
    DeleteTensorArgs,
    FindEdgesArgs,
    PullArgs,
    PushArgs,
    ReleaseTensorsArgs,
    SampleArgs,
    SampleEdgesArgs,
    SnapshotArgs,
    SparseUpdateArgs,
    request_id,
)
from asyncgraph.protocol.live_args import AddEdgesArgs, AddNodesArgs, CompactArgs, RemoveEdgesArgs

__all__ = [
    "ANSWERED_AGAIN_OPS",
    "ATTACHED_OPS",
    "CATALOG_OPS",
    "MAX_EPOCH",
    "OFFLOADED_OPS",
    "OPS",
    "PRIMARY_ONLY_OPS",
    "RETRYABLE_OPS",
    "WRITE_OPS",
    "AddEdgesArgs",
    "AddNodesArgs",
    "AddReplicaArgs",
    "BarrierArgs",
    "CompactArgs",
    "CreateTensorArgs",
    "DegreesArgs",
    "DeleteTensorArgs",
    "FindEdgesArgs",
    "Op",
    "OpSpec",
    "PullArgs",
    "PushArgs",
    "ReleaseTensorsArgs",
    "RemoveEdgesArgs",
    "SampleArgs",
    "SampleEdgesArgs",
    "SnapshotArgs",
    "SparseUpdateArgs",
    "request_id",
]


class Op(enum.StrEnum):
    """Every request a server answers."""

    INFO = "info"
    PULL = "pull"
    PUSH = "push"
    CREATE_TENSOR = "create_tensor"
    DELETE_TENSOR = "delete_tensor"
    RELEASE_TENSORS = "release_tensors"
    LIST_TENSORS = "list_tensors"
    BARRIER = "barrier"
    SAMPLE = "sample"
    FIND_EDGES = "find_edges"
    STATS = "stats"
    PING = "ping"
    SHUTDOWN = "shutdown"
    SPARSE_UPDATE = "sparse_update"
    DEGREES = "degrees"
    SAMPLE_EDGES = "sample_edges"
    SNAPSHOT = "snapshot"
    ADD_REPLICA = "add_replica"
    ADD_EDGES = "add_edges"
    REMOVE_EDGES = "remove_edges"
    ADD_NODES = "add_nodes"
    COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class OpSpec:
    """What one op is and may do.

    ``writes``: it changes stored state (rows, the tensor catalog, references), so a server logs
    it in its write-ahead log before acknowledging and applies it once per request id (``rid``).
    ``retryable``: a client may resend it after reconnecting (reads; writes, which carry a rid).
    ``primary_only``: a replica server refuses it (it changes what the whole partition shares,
    or needs one place per partition). ``attached``: a co-located client may run it itself over
    the server's shared memory. ``catalog``: it reads the tensor catalog, so a replica catches up
    with its primary's catalog first. ``offload``: a big one may run in a worker thread.
    """

    op: Op
    args: type[ArgsRecord] | None = None
    writes: bool = False
    retryable: bool = True
    primary_only: bool = False
    attached: bool = False
    catalog: bool = False
    offload: bool = False

    def __post_init__(self) -> None:
        if self.writes and not self.retryable:
            raise ValueError(f"{self.op}: a write carries a request id, so it must be retryable")
        if self.attached and not self.catalog:
            raise ValueError(f"{self.op}: an op run over shared memory reads the catalog")


_TABLE = (
    OpSpec(Op.INFO, catalog=True),
    OpSpec(Op.PULL, PullArgs, catalog=True, attached=True),
    OpSpec(Op.PUSH, PushArgs, writes=True, catalog=True, attached=True),
    OpSpec(Op.CREATE_TENSOR, CreateTensorArgs, writes=True, primary_only=True, offload=True),
    OpSpec(Op.DELETE_TENSOR, DeleteTensorArgs, writes=True, primary_only=True),
    OpSpec(Op.RELEASE_TENSORS, ReleaseTensorsArgs, writes=True, primary_only=True),
    OpSpec(Op.LIST_TENSORS, catalog=True),
    OpSpec(Op.BARRIER, BarrierArgs, retryable=False, primary_only=True),
    OpSpec(Op.SAMPLE, SampleArgs, catalog=True, attached=True, offload=True),
    OpSpec(Op.FIND_EDGES, FindEdgesArgs, catalog=True, attached=True),
    OpSpec(Op.STATS),
    OpSpec(Op.PING),
    OpSpec(Op.SHUTDOWN, retryable=False),
    OpSpec(Op.SPARSE_UPDATE, SparseUpdateArgs, writes=True, primary_only=True),
    OpSpec(Op.DEGREES, DegreesArgs, catalog=True, attached=True),
    OpSpec(Op.SAMPLE_EDGES, SampleEdgesArgs, catalog=True, attached=True),
    OpSpec(Op.SNAPSHOT, SnapshotArgs, primary_only=True),
    OpSpec(Op.ADD_REPLICA, AddReplicaArgs, retryable=False, primary_only=True),
    # a live graph's structure (issue 35): the owner's overlay, written by its primary only
    OpSpec(Op.ADD_EDGES, AddEdgesArgs, writes=True, primary_only=True),
    OpSpec(Op.REMOVE_EDGES, RemoveEdgesArgs, writes=True, primary_only=True),
    OpSpec(Op.ADD_NODES, AddNodesArgs, writes=True, primary_only=True),
    OpSpec(Op.COMPACT, CompactArgs, writes=True, primary_only=True),  # logged: replay folds again
)

#: One declaration per op (a test checks every ``Op`` has one).
OPS: dict[Op, OpSpec] = {spec.op: spec for spec in _TABLE}


def _ops_where(flag: str) -> frozenset[Op]:
    return frozenset(spec.op for spec in _TABLE if getattr(spec, flag))


#: Ops that change stored state: logged, applied once per client request id.
WRITE_OPS = _ops_where("writes")
#: Ops a client may resend after reconnecting.
RETRYABLE_OPS = _ops_where("retryable")
#: Ops a replica server refuses.
PRIMARY_ONLY_OPS = _ops_where("primary_only")
#: Ops a co-located client runs itself over the server's shared memory.
ATTACHED_OPS = _ops_where("attached")
#: Ops that read the tensor catalog (a replica syncs it first).
CATALOG_OPS = _ops_where("catalog")
#: Writes whose resend (same request id) answers again, with what the first one answered: a
#: create its tensor's description, ``add_edges`` / ``add_nodes`` the IDs they allocated.
ANSWERED_AGAIN_OPS = frozenset({Op.CREATE_TENSOR, Op.ADD_EDGES, Op.ADD_NODES})
#: Ops that may run off the event loop when big.
OFFLOADED_OPS = _ops_where("offload")
