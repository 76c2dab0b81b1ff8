"""Message-flow blocks: the bipartite graph one GNN layer consumes (DGL's ``to_block``).

A block maps a layer's input nodes (``srcnodes``) to its output nodes (``dstnodes``). Following
DGL, the destination nodes are the prefix of the source nodes (``srcnodes[:num_dst_nodes] ==
dstnodes``), so a layer finds ``h_dst`` as ``h_src[:num_dst_nodes]``; the other sources follow
in order of first appearance among the edges.

Relabelling is vectorised and sort-free for CPU inputs: a per-thread scratch table indexed by
global ID (``-1`` = absent) maps destinations to their local index, every source is looked up
with one gather, and new sources get their first position with ``np.minimum.at``; the table is
reset after use, so a call costs ``O(edges + dst_nodes)`` whatever the graph size. IDs beyond
``_TABLE_LIMIT`` (or negative) and tensors on other devices use a sort-based torch path. Only
numpy runs on the CPU path: this is called on the client's event-loop thread while the training
loop computes, and torch's intra-op thread pool would compete with the trainer's (on a loaded
machine a few small OpenMP-parallel torch ops cost more than the whole numpy relabel).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, ShapeMismatchError
from asyncgraph.names import DEFAULT_NTYPE

from . import relabel_kernel
from .frames import ID_FIELD, Frame, GraphOps

__all__ = ["Block", "to_block"]

# Largest global ID + 1 relabelled through the scratch table (int64: 8 bytes per ID, per thread,
# so at most 256 MiB per thread); larger graphs take the sort-based path.
_TABLE_LIMIT = 1 << 25
_scratch = threading.local()


_ID_FIELD = ID_FIELD


@dataclass
class Block(GraphOps):
    """One layer's bipartite message-flow graph with global IDs and per-side features.

    ``srcdata``/``dstdata``/``edata`` are :class:`Frame` dicts: besides the fields stored in
    them they answer ``dgl.NID`` (``"_ID"``) with ``srcnodes``/``dstnodes`` and ``dgl.EID``
    with ``eids`` (when known), as DGL's blocks do. Counts are methods, as in DGL
    (``num_dst_nodes()``, ``number_of_dst_nodes()``, ...).
    """

    srcnodes: torch.Tensor  # int64 global IDs: dstnodes first, then new sources (first appearance)
    dstnodes: torch.Tensor  # int64 global IDs
    edge_index: torch.Tensor  # int64 [2, E]: local src index into srcnodes, local dst into dstnodes
    eids: torch.Tensor  # int64 [E] global edge IDs, or empty if unknown
    srcdata: dict[str, torch.Tensor] = field(default_factory=dict)
    dstdata: dict[str, torch.Tensor] = field(default_factory=dict)
    edata: dict[str, torch.Tensor] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    is_block = True

    def __post_init__(self) -> None:
        eids = self.eids if self.eids.numel() == self.edge_index.shape[1] else None
        self.srcdata = Frame(self.srcdata, self.srcnodes)
        self.dstdata = Frame(self.dstdata, self.dstnodes)
        self.edata = Frame(self.edata, eids)

    def num_src_nodes(self, ntype: str | None = None) -> int:
        """Number of source (input) nodes, destinations included."""
        return int(self.srcnodes.shape[0])

    def num_dst_nodes(self, ntype: str | None = None) -> int:
        """Number of destination (output) nodes."""
        return int(self.dstnodes.shape[0])

    def num_edges(self, etype: Any = None) -> int:
        """Number of edges."""
        return int(self.edge_index.shape[1])

    number_of_src_nodes = num_src_nodes
    number_of_dst_nodes = num_dst_nodes
    number_of_edges = num_edges

    @property
    def ntypes(self) -> list[str]:
        return [DEFAULT_NTYPE]

    @property
    def srctypes(self) -> list[str]:
        return [DEFAULT_NTYPE]

    @property
    def dsttypes(self) -> list[str]:
        return [DEFAULT_NTYPE]

    def edges(self, form: str = "uv") -> tuple[torch.Tensor, ...]:
        """Local ``(src, dst)`` (``form="all"`` adds the edges' positions), like DGL's."""
        src, dst = self.edge_index[0], self.edge_index[1]
        if form == "all":
            return src, dst, torch.arange(src.numel(), device=src.device)
        return src, dst

    # GraphOps: local_scope, local_var, apply_edges, update_all
    def _endpoints(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.edge_index[0], self.edge_index[1]

    def _num_dst(self) -> int:
        return self.num_dst_nodes()

    def _src_frame(self) -> Frame:
        return self.srcdata  # type: ignore[return-value]

    def _dst_frame(self) -> Frame:
        return self.dstdata  # type: ignore[return-value]

    def _edge_frame(self) -> Frame:
        return self.edata  # type: ignore[return-value]

    def _frames(self) -> tuple[Frame, ...]:
        return self._src_frame(), self._dst_frame(), self._edge_frame()

    def _set_frames(self, frames: tuple[Frame, ...]) -> None:
        self.srcdata, self.dstdata, self.edata = frames

    def csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(crow, col, in_degree)``: the edges as a ``[num_dst, num_src]`` CSR (int64, cached).

        Row ``d`` holds the local sources of destination ``d``'s in-edges, in edge order. Built
        in numpy on first use (loaders call it while preparing a batch, off the training loop);
        sampled edges come grouped by destination per partition, so the stable sort is a merge.
        A block on an accelerator builds it there with torch ops (no host round trip).
        """
        cached: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = self._cache.get("csr")
        if cached is None and self.edge_index.device.type != "cpu":  # built where the edges are
            src_t, dst_t = self.edge_index[0], self.edge_index[1]
            deg_t = torch.bincount(dst_t, minlength=self.num_dst_nodes())
            crow_t = torch.cat([deg_t.new_zeros(1), torch.cumsum(deg_t, 0)])
            col_t = src_t[torch.sort(dst_t, stable=True).indices]
            cached = (crow_t, col_t, deg_t)
            self._cache["csr"] = cached
        if cached is None:
            src = self.edge_index[0].cpu().numpy()
            dst = self.edge_index[1].cpu().numpy()
            deg = np.bincount(dst, minlength=self.num_dst_nodes()).astype(np.int64, copy=False)
            crow = np.zeros(self.num_dst_nodes() + 1, dtype=np.int64)
            np.cumsum(deg, out=crow[1:])
            col = src[np.argsort(dst, kind="stable")]
            device = self.edge_index.device
            cached = tuple(torch.from_numpy(a).to(device) for a in (crow, col, deg))  # type: ignore[assignment]
            self._cache["csr"] = cached
        assert cached is not None
        return cached

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Block:
        """A copy with every tensor (IDs, edges, features, the cached CSR) on ``device``."""
        out = Block(
            srcnodes=self.srcnodes.to(device, non_blocking=non_blocking),
            dstnodes=self.dstnodes.to(device, non_blocking=non_blocking),
            edge_index=self.edge_index.to(device, non_blocking=non_blocking),
            eids=self.eids.to(device, non_blocking=non_blocking),
            srcdata={k: v.to(device, non_blocking=non_blocking) for k, v in self.srcdata.items()},
            dstdata={k: v.to(device, non_blocking=non_blocking) for k, v in self.dstdata.items()},
            edata={k: v.to(device, non_blocking=non_blocking) for k, v in self.edata.items()},
        )
        csr = self._cache.get("csr")
        if csr is not None:
            out._cache["csr"] = tuple(t.to(device, non_blocking=non_blocking) for t in csr)
        return out

    def __repr__(self) -> str:
        return (
            f"Block(num_src_nodes={self.num_src_nodes()}, num_dst_nodes={self.num_dst_nodes()}, "
            f"num_edges={self.num_edges()})"
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


def _as_id_numpy(x: Any, name: str) -> np.ndarray:
    """1-D int64 numpy array from a CPU tensor, numpy array or list of integers (no copy if int64)."""
    a = x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.size == 0:
        return np.empty(0, dtype=np.int64)
    if a.dtype.kind not in "iu":
        raise DTypeMismatchError(f"{name} must be integers, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ShapeMismatchError(f"{name} must be one-dimensional, got shape {a.shape}")
    return a.astype(np.int64, copy=False)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """Zero-copy tensor of a numpy array (copied first if read-only, which torch warns about)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _table(size: int) -> np.ndarray:
    """This thread's scratch table of at least ``size`` entries, all ``-1``."""
    table: np.ndarray | None = getattr(_scratch, "table", None)
    if table is None or table.size < size:
        grown = min(max(size, 2 * (0 if table is None else table.size)), max(size, _TABLE_LIMIT))
        table = np.full(grown, -1, dtype=np.int64)
        _scratch.table = table
    return table


def _relabel_table(
    src: np.ndarray, dst: np.ndarray, dst_nodes: np.ndarray, table: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src_local, dst_local, new sources in first-appearance order); leaves ``table`` all -1.

    The compiled form (``relabel_kernel.relabel``, one pass, ~5x faster) runs when loaded;
    both give the same output and errors.
    """
    fast = relabel_kernel.relabel(src, dst, dst_nodes, table)
    if fast is not None:
        src_local, dst_local, new_src, unique = fast
        if not unique:
            raise InvalidRequestError("dst_nodes must be unique")
        if dst_local.size and int(dst_local.min()) < 0:
            missing = int(dst[np.flatnonzero(dst_local < 0)[0]])
            raise InvalidRequestError(f"edge destination {missing} is not among dst_nodes")
        return src_local, dst_local, new_src
    num_dst = dst_nodes.size
    local = np.arange(num_dst, dtype=np.int64)
    table[dst_nodes] = local
    new_src = np.empty(0, dtype=np.int64)
    try:
        if num_dst and not np.array_equal(table[dst_nodes], local):
            raise InvalidRequestError("dst_nodes must be unique")
        dst_local = table[dst]
        if dst_local.size and int(dst_local.min()) < 0:
            missing = int(dst[np.flatnonzero(dst_local < 0)[0]])
            raise InvalidRequestError(f"edge destination {missing} is not among dst_nodes")
        src_local = table[src]
        new_pos = np.flatnonzero(src_local < 0)  # edges whose source is not a destination
        new_src = src[new_pos]
        if new_src.size:
            order = np.arange(new_src.size, dtype=np.int64)
            table[new_src] = new_src.size
            np.minimum.at(table, new_src, order)  # first position of each new source
            first = table[new_src]
            is_first = first == order
            rank = np.cumsum(is_first) - 1  # rank of a first occurrence among first occurrences
            src_local[new_pos] = num_dst + rank[first]
            new_src = new_src[is_first]
    finally:
        table[dst_nodes] = -1
        table[new_src] = -1  # (all of them if we got that far; the unique ones suffice)
    return src_local, dst_local, new_src


def _relabel_sort(
    src: np.ndarray, dst: np.ndarray, dst_nodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Same as ``_relabel_table`` for any int64 IDs: sort + searchsorted + stable argsort."""
    num_dst = dst_nodes.size
    perm = np.argsort(dst_nodes)
    sorted_dst = dst_nodes[perm]
    if num_dst > 1 and bool((sorted_dst[1:] == sorted_dst[:-1]).any()):
        raise InvalidRequestError("dst_nodes must be unique")

    def lookup(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if num_dst == 0:
            return np.zeros(ids.size, dtype=bool), np.zeros(ids.size, dtype=np.int64)
        where = np.minimum(np.searchsorted(sorted_dst, ids), num_dst - 1)
        return sorted_dst[where] == ids, perm[where]

    found, dst_local = lookup(dst)
    if not bool(found.all()):
        raise InvalidRequestError(f"edge destination {int(dst[~found][0])} is not among dst_nodes")
    is_dst, src_local = lookup(src)
    new_pos = np.flatnonzero(~is_dst)
    new_src = src[new_pos]
    order = np.argsort(new_src, kind="stable")  # equal IDs keep their order: first one leads
    sorted_src = new_src[order]
    head = np.ones(sorted_src.size, dtype=bool)
    head[1:] = sorted_src[1:] != sorted_src[:-1]
    group = np.cumsum(head) - 1  # group (unique ID) of each sorted position
    first = order[head]  # first position of each unique ID, in ID order
    by_appearance = np.argsort(first)
    rank = np.empty_like(by_appearance)
    rank[by_appearance] = np.arange(by_appearance.size, dtype=np.int64)
    src_local = src_local.copy()
    src_local[new_pos[order]] = num_dst + rank[group]
    return src_local, dst_local, new_src[first[by_appearance]]


def to_block(src: Any, dst: Any = None, dst_nodes: Any = None, eids: Any = None) -> Block:
    """Build a ``Block`` from global edges ``src -> dst`` whose destinations are ``dst_nodes``.

    DGL's form ``to_block(frontier, dst_nodes)`` works too: ``frontier`` is a graph-like object
    with ``edges()`` and optionally ``edata["_ID"]`` (e.g. what ``sample_neighbors`` returns);
    the block's ``srcdata["_ID"]``/``dstdata["_ID"]`` (``dgl.NID``) then hold the global node IDs.

    ``dst_nodes`` must be unique and contain every ``dst`` (``InvalidRequestError``, a
    ``ValueError``, otherwise). Sources that are not destinations are appended to ``srcnodes`` in
    order of first appearance in ``src``. ``eids`` (global edge IDs) is stored as given, or empty.
    Accepts numpy arrays, lists and tensors; the result holds tensors (on the inputs' device).
    """
    if hasattr(src, "edges") and callable(src.edges):
        return _graph_to_block(src, dst if dst_nodes is None else dst_nodes)
    if dst is None or dst_nodes is None:
        raise InvalidRequestError("to_block needs (src, dst, dst_nodes) or (graph, dst_nodes)")
    inputs = (src, dst, dst_nodes, eids)
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in inputs):
        return _to_block_torch(src, dst, dst_nodes, eids)
    src_a = _as_id_numpy(src, "src")
    dst_a = _as_id_numpy(dst, "dst")
    dst_nodes_a = _as_id_numpy(dst_nodes, "dst_nodes")
    if src_a.size != dst_a.size:
        raise ShapeMismatchError(f"src ({src_a.size}) and dst ({dst_a.size}) differ in length")
    eids_a = np.empty(0, dtype=np.int64) if eids is None else _as_id_numpy(eids, "eids")
    if eids_a.size not in (0, src_a.size):
        raise ShapeMismatchError(f"eids ({eids_a.size}) and edges ({src_a.size}) differ in length")
    lo = hi = 0
    for a in (src_a, dst_a, dst_nodes_a):
        if a.size:
            lo, hi = min(lo, int(a.min())), max(hi, int(a.max()))
    if lo >= 0 and hi < _TABLE_LIMIT:
        src_local, dst_local, new_src = _relabel_table(src_a, dst_a, dst_nodes_a, _table(hi + 1))
    else:
        src_local, dst_local, new_src = _relabel_sort(src_a, dst_a, dst_nodes_a)
    dst_nodes_t = _tensor(dst_nodes_a)
    return Block(
        srcnodes=torch.from_numpy(np.concatenate([dst_nodes_a, new_src])),
        dstnodes=dst_nodes_t,
        edge_index=torch.from_numpy(np.stack([src_local, dst_local])),
        eids=_tensor(eids_a),
    )


def _graph_to_block(frontier: Any, dst_nodes: Any) -> Block:
    """DGL's ``to_block(frontier, dst_nodes)``: the frontier's edges, IDs in ``srcdata["_ID"]``."""
    if dst_nodes is None:
        raise InvalidRequestError("to_block(frontier, dst_nodes): dst_nodes is required")
    src, dst = frontier.edges()[:2]
    edata = getattr(frontier, "edata", {})
    return to_block(src, dst, dst_nodes, edata.get(_ID_FIELD))


def _to_block_torch(src: Any, dst: Any, dst_nodes: Any, eids: Any = None) -> Block:
    """``to_block`` in torch ops, for tensors on an accelerator."""
    src_t = _as_id_tensor(src, "src")
    dst_t = _as_id_tensor(dst, "dst")
    dst_nodes_t = _as_id_tensor(dst_nodes, "dst_nodes")
    if src_t.numel() != dst_t.numel():
        raise ShapeMismatchError(f"src ({src_t.numel()}) and dst ({dst_t.numel()}) differ in length")
    eids_t = (
        torch.empty(0, dtype=torch.int64, device=src_t.device)
        if eids is None
        else _as_id_tensor(eids, "eids")
    )
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
