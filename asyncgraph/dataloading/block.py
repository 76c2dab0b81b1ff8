"""Message-flow blocks: the bipartite graph one GNN layer consumes (DGL's ``to_block``).

A block maps a layer's input nodes (``srcnodes``) to its output nodes (``dstnodes``). Following
DGL, the destination nodes are the prefix of the source nodes (``srcnodes[:num_dst_nodes] ==
dstnodes``), so a layer finds ``h_dst`` as ``h_src[:num_dst_nodes]``; the other sources follow
in order of first appearance among the edges. Relabelling is vectorised (sort + searchsorted for
destinations, ``unique`` + first-occurrence ``scatter_reduce`` for new sources).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, ShapeMismatchError

__all__ = ["Block", "to_block"]


@dataclass
class Block:
    """One layer's bipartite message-flow graph with global IDs and per-side features."""

    srcnodes: torch.Tensor  # int64 global IDs: dstnodes first, then new sources (first appearance)
    dstnodes: torch.Tensor  # int64 global IDs
    edge_index: torch.Tensor  # int64 [2, E]: local src index into srcnodes, local dst into dstnodes
    eids: torch.Tensor  # int64 [E] global edge IDs, or empty if unknown
    srcdata: dict[str, torch.Tensor] = field(default_factory=dict)
    dstdata: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_src_nodes(self) -> int:
        """Number of source (input) nodes, destinations included."""
        return int(self.srcnodes.shape[0])

    @property
    def num_dst_nodes(self) -> int:
        """Number of destination (output) nodes."""
        return int(self.dstnodes.shape[0])

    @property
    def num_edges(self) -> int:
        """Number of edges."""
        return int(self.edge_index.shape[1])

    def to(self, device: torch.device | str) -> Block:
        """A copy with every tensor (IDs, edges, features) on ``device``."""
        return Block(
            srcnodes=self.srcnodes.to(device),
            dstnodes=self.dstnodes.to(device),
            edge_index=self.edge_index.to(device),
            eids=self.eids.to(device),
            srcdata={k: v.to(device) for k, v in self.srcdata.items()},
            dstdata={k: v.to(device) for k, v in self.dstdata.items()},
        )

    def __repr__(self) -> str:
        return (
            f"Block(num_src_nodes={self.num_src_nodes}, num_dst_nodes={self.num_dst_nodes}, "
            f"num_edges={self.num_edges})"
        )


def _as_id_tensor(x: Any, name: str) -> torch.Tensor:
    """1-D int64 CPU-or-device tensor from a tensor, numpy array or list of integers."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        a = np.asarray(x)
        t = torch.as_tensor(a if a.flags.writeable else a.copy())  # torch warns on read-only buffers
    if t.dim() == 0:
        t = t.reshape(1)
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=t.device)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise DTypeMismatchError(f"{name} must be integers, got dtype {t.dtype}")
    if t.dim() != 1:
        raise ShapeMismatchError(f"{name} must be one-dimensional, got shape {tuple(t.shape)}")
    return t.to(torch.int64)


def to_block(src: Any, dst: Any, dst_nodes: Any, eids: Any = None) -> Block:
    """Build a ``Block`` from global edges ``src -> dst`` whose destinations are ``dst_nodes``.

    ``dst_nodes`` must be unique and contain every ``dst`` (``InvalidRequestError``, a
    ``ValueError``, otherwise). Sources that are not destinations are appended to ``srcnodes`` in
    order of first appearance in ``src``. ``eids`` (global edge IDs) is stored as given, or empty.
    """
    src_t = _as_id_tensor(src, "src")
    dst_t = _as_id_tensor(dst, "dst")
    dst_nodes_t = _as_id_tensor(dst_nodes, "dst_nodes")
    if src_t.numel() != dst_t.numel():
        raise ShapeMismatchError(f"src ({src_t.numel()}) and dst ({dst_t.numel()}) differ in length")
    eids_t = torch.empty(0, dtype=torch.int64) if eids is None else _as_id_tensor(eids, "eids")
    if eids_t.numel() not in (0, src_t.numel()):
        raise ShapeMismatchError(f"eids ({eids_t.numel()}) and edges ({src_t.numel()}) differ in length")

    sorted_dst, perm = torch.sort(dst_nodes_t)
    if sorted_dst.numel() > 1 and bool((sorted_dst[1:] == sorted_dst[:-1]).any()):
        raise InvalidRequestError("dst_nodes must be unique")
    num_dst = int(dst_nodes_t.numel())

    def lookup(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(found mask, local dst index where found) for global IDs."""
        if num_dst == 0:
            return torch.zeros_like(ids, dtype=torch.bool), torch.zeros_like(ids)
        where = torch.searchsorted(sorted_dst, ids).clamp_(max=num_dst - 1)
        return sorted_dst[where] == ids, perm[where]

    found, dst_local = lookup(dst_t)
    if not bool(found.all()):
        missing = int(dst_t[~found][0])
        raise InvalidRequestError(f"edge destination {missing} is not among dst_nodes")

    is_dst, src_local = lookup(src_t)
    new_pos = torch.nonzero(~is_dst).flatten()  # edges whose source is not a destination
    new_src = src_t[new_pos]
    uniq, inverse = torch.unique(new_src, return_inverse=True)
    first = torch.full((uniq.numel(),), new_src.numel(), dtype=torch.int64, device=src_t.device)
    first.scatter_reduce_(0, inverse, torch.arange(new_src.numel(), device=src_t.device), reduce="amin")
    order = torch.argsort(first)  # unique new sources by first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=src_t.device)
    src_local = src_local.clone()
    src_local[new_pos] = num_dst + rank[inverse]

    return Block(
        srcnodes=torch.cat([dst_nodes_t, uniq[order]]),
        dstnodes=dst_nodes_t,
        edge_index=torch.stack([src_local, dst_local]),
        eids=eids_t,
    )
