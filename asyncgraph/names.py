"""How stored tensors are named: the policy prefix and the optimizer-state suffixes.

A tensor of policy ``"node"`` is stored as ``"node:<name>"`` (``"edge:<name>"`` likewise); the
sparse optimizers keep their state beside the rows as ``"<key>#adagrad_state"`` or
``"<key>#adam_m"``, ``"<key>#adam_v"`` and ``"<key>#adam_step"``.
"""

from __future__ import annotations

__all__ = [
    "ADAGRAD_STATE_SUFFIX",
    "ADAM_M_SUFFIX",
    "ADAM_STEP_SUFFIX",
    "ADAM_V_SUFFIX",
    "DEFAULT_ETYPE",
    "DEFAULT_NTYPE",
    "DEFAULT_RELATION",
    "ETYPE",
    "NTYPE",
    "POLICIES",
    "TYPED_SEP",
    "TYPE_EID",
    "TYPE_ORDER",
    "edge_key",
    "is_state_key",
    "node_key",
    "split_typed",
    "tensor_key",
    "tensor_prefix",
    "typed_name",
]

POLICIES = ("node", "edge")

# DGL's names for the one node type and edge type of a homogeneous graph.
DEFAULT_NTYPE = "_N"
DEFAULT_RELATION = "_E"
DEFAULT_ETYPE: tuple[str, str, str] = (DEFAULT_NTYPE, DEFAULT_RELATION, DEFAULT_NTYPE)

# Written by partition_graph for heterogeneous graphs: each node's type index, each edge's type
# index (what the sampler groups by for per-edge-type fanouts) and each edge's per-type ID.
NTYPE = "_TYPE"
ETYPE = "_ETYPE"
TYPE_EID = "_TYPE_EID"
# Derived by each partition's store when it loads (never written to disk): the homogeneous edge
# IDs of the partition's edges sorted by (type, ID). Per-type edge ID ``k`` of type ``t`` owned by
# part ``p`` sits at a position the book computes from ``etype_counts``, so reading this tensor
# there maps per-type edge IDs to homogeneous ones without any per-edge array in the book.
TYPE_ORDER = "_TYPE_ORDER"

# A heterogeneous graph's partitioned tensors are stored per (type, name), as DGL's partitions
# store them: ``"paper/feat"`` holds rows of ``paper`` nodes only, ``"user:buys:item/w"`` rows of
# that edge type's edges only (``asyncgraph.partition.typed``). Type names never hold a "/".
TYPED_SEP = "/"

ADAGRAD_STATE_SUFFIX = "#adagrad_state"
ADAM_M_SUFFIX = "#adam_m"
ADAM_V_SUFFIX = "#adam_v"
ADAM_STEP_SUFFIX = "#adam_step"


def tensor_prefix(policy: str) -> str:
    """``"node:"`` or ``"edge:"``: what every stored key of that policy starts with."""
    return f"{policy}:"


def tensor_key(policy: str, name: str) -> str:
    """The stored key of user-facing tensor ``name`` of ``policy`` (``"node:feat"``)."""
    return f"{policy}:{name}"


def node_key(name: str) -> str:
    """The stored key of node tensor ``name`` (``"node:feat"``)."""
    return f"node:{name}"


def edge_key(name: str) -> str:
    """The stored key of edge tensor ``name``; a name already prefixed is kept (``prob=`` takes both)."""
    return name if name.startswith("edge:") else f"edge:{name}"


def is_state_key(key: str) -> bool:
    """Whether ``key`` names optimizer state rather than a user tensor."""
    return "#" in key


def typed_name(type_key: str, name: str) -> str:
    """The stored name of tensor ``name`` of one node type (``"paper"``) or edge type
    (``"src:rel:dst"``): ``"paper/feat"``."""
    return f"{type_key}{TYPED_SEP}{name}"


def split_typed(name: str) -> tuple[str, str] | None:
    """``(type key, tensor name)`` of a per-type stored name (policy prefix stripped), else None."""
    type_key, sep, rest = name.partition(TYPED_SEP)
    return (type_key, rest) if sep and type_key and rest else None
