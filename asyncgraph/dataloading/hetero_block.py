"""Heterogeneous message-flow blocks (DGL's hetero ``to_block``) built from a typed sample.

The block is made in the homogeneous ID space first (``to_block``: destinations are a prefix of
the sources), then split by node type with the partition book: ``srcnodes[ntype]`` are the
per-type IDs of that type's sources in order, so ``dstnodes[ntype]`` is again a prefix of
``srcnodes[ntype]``. Each canonical edge type gets a homogeneous :class:`Block` in which the
sources are ``dst nodes of dst type ++ src nodes of src type``, so any homogeneous layer
(``SAGEConv``) applies to one relation unchanged with ``h_src = cat(h_dst[dtype], h_src[stype])``.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from asyncgraph.dataloading.sampler import layer_seed
from asyncgraph.errors import UnknownTypeError
from asyncgraph.names import node_key, typed_name
from asyncgraph.partition.book import RangePartitionBook

from .block import Block, to_block
from .frames import Frame
from .hetero_pair import TypedFrames, map_frames, resolve_canonical

__all__ = ["HeteroBlock", "to_hetero_block"]

CanonicalEType = tuple[str, str, str]


def _type_local(types: np.ndarray, num_types: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Index of each entry among entries of its type, and the positions of each type (in order)."""
    order = np.argsort(types, kind="stable")
    counts = np.bincount(types, minlength=num_types)
    first = np.zeros(num_types + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    local = np.empty(types.size, dtype=np.int64)
    local[order] = np.arange(types.size, dtype=np.int64) - first[types[order]]
    return local, [order[first[t] : first[t + 1]] for t in range(num_types)]


class HeteroBlock:
    """One layer's typed bipartite graph: per-type node IDs and features, per-relation edges."""

    def __init__(
        self,
        ntypes: list[str],
        canonical_etypes: list[CanonicalEType],
        srcnodes: dict[str, torch.Tensor],
        dstnodes: dict[str, torch.Tensor],
        edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        homo: Block,
        src_pos: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.ntypes, self.canonical_etypes = ntypes, canonical_etypes
        self.srcnodes, self.dstnodes, self._edges = srcnodes, dstnodes, edges
        self.homo = homo  # the same block in homogeneous IDs
        # positions in homo.srcnodes of each type's sources (dst positions: the first ones)
        self.src_pos = src_pos or {}
        self.srcdata: dict[str, dict[str, torch.Tensor]] = {t: {} for t in ntypes}
        self.dstdata: dict[str, dict[str, torch.Tensor]] = {t: {} for t in ntypes}
        # per-relation edge fields; "_ID" (dgl.EID) answers the per-type edge IDs, as DGL's
        self.edge_frames: dict[CanonicalEType, Frame] = {c: Frame({}, e[2]) for c, e in edges.items()}
        self._rel: dict[CanonicalEType, Block] = {}

    is_block = True

    def num_src_nodes(self, ntype: str | None = None) -> int:
        """Source nodes of ``ntype`` (all types when None)."""
        if ntype is None:
            return sum(int(v.numel()) for v in self.srcnodes.values())
        return int(self.srcnodes[ntype].numel())

    def num_dst_nodes(self, ntype: str | None = None) -> int:
        """Destination nodes of ``ntype`` (all types when None)."""
        if ntype is None:
            return sum(int(v.numel()) for v in self.dstnodes.values())
        return int(self.dstnodes[ntype].numel())

    def num_edges(self, etype: CanonicalEType | str | None = None) -> int:
        """Edges of ``etype`` (canonical triple or relation name; all when None)."""
        if etype is None:
            return sum(int(e[0].numel()) for e in self._edges.values())
        return int(self._edges[self._canonical(etype)][0].numel())

    number_of_src_nodes = num_src_nodes
    number_of_dst_nodes = num_dst_nodes
    number_of_edges = num_edges

    @property
    def srctypes(self) -> list[str]:
        return list(self.ntypes)

    @property
    def dsttypes(self) -> list[str]:
        return list(self.ntypes)

    @property
    def etypes(self) -> list[str]:
        return [c[1] for c in self.canonical_etypes]

    def _canonical(self, etype: CanonicalEType | str) -> CanonicalEType:
        if isinstance(etype, tuple):
            return etype
        found = [c for c in self.canonical_etypes if c[1] == etype]
        if len(found) != 1:
            raise UnknownTypeError(
                f"edge type {etype!r} is unknown or ambiguous; known: {self.canonical_etypes}"
            )
        return found[0]

    def local_var(self) -> HeteroBlock:
        """A shallow copy whose per-type data dicts are copies (DGL's ``local_var``)."""
        out = copy.copy(self)
        out.srcdata = {t: dict(d) for t, d in self.srcdata.items()}
        out.dstdata = {t: dict(d) for t, d in self.dstdata.items()}
        out.edge_frames = {c: f.copy() for c, f in self.edge_frames.items()}
        return out

    @contextmanager
    def local_scope(self) -> Iterator[None]:
        """Data set inside is dropped on exit."""
        saved = self.srcdata, self.dstdata, self.edge_frames
        self.srcdata = {t: dict(d) for t, d in saved[0].items()}
        self.dstdata = {t: dict(d) for t, d in saved[1].items()}
        self.edge_frames = {c: f.copy() for c, f in saved[2].items()}
        try:
            yield
        finally:
            self.srcdata, self.dstdata, self.edge_frames = saved

    def to(self, device: torch.device | str, non_blocking: bool = False) -> HeteroBlock:
        """A copy with every tensor on ``device`` (``self`` when already there)."""
        dev = torch.device(device)
        if all(v.device == dev for v in self.srcnodes.values()) and self.homo.srcnodes.device == dev:
            return self

        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(dev, non_blocking=non_blocking)

        out = HeteroBlock(
            self.ntypes,
            self.canonical_etypes,
            {t: mv(v) for t, v in self.srcnodes.items()},
            {t: mv(v) for t, v in self.dstnodes.items()},
            {c: (mv(a), mv(b), mv(e)) for c, (a, b, e) in self._edges.items()},
            self.homo.to(dev, non_blocking),
            self.src_pos,
        )
        out.srcdata = {t: {k: mv(v) for k, v in d.items()} for t, d in self.srcdata.items()}
        out.dstdata = {t: {k: mv(v) for k, v in d.items()} for t, d in self.dstdata.items()}
        for c, f in self.edge_frames.items():
            out.edge_frames[c].update({k: mv(v) for k, v in f.items()})
        return out

    def map_tensors(self, mapper: Callable[[Any], Any]) -> HeteroBlock:
        """A copy with ``mapper`` applied to every tensor, in a fixed order (a loader's ``device=``)."""
        out = HeteroBlock(
            self.ntypes,
            self.canonical_etypes,
            mapper(self.srcnodes),
            mapper(self.dstnodes),
            mapper(self._edges),
            mapper(self.homo),
            self.src_pos,
        )
        out.srcdata, out.dstdata = mapper(self.srcdata), mapper(self.dstdata)
        out.edge_frames = map_frames(self.edge_frames, mapper)
        return out

    @property
    def edges(self) -> _BlockEdges:
        """``block.edges(etype)``: ``(local src in srcnodes[stype], local dst in dstnodes[dtype],
        per-type edge IDs)``; ``block.edges[etype].data``: that relation's edge fields (DGL's),
        ``data[dgl.EID]`` its per-type edge IDs."""
        return _BlockEdges(self)

    @property
    def edata(self) -> TypedFrames:
        """Edge fields by relation: ``block.edata[dgl.EID]`` is ``{etype: per-type edge IDs}``."""
        return TypedFrames(self.edge_frames)

    def relation_block(self, etype: CanonicalEType) -> Block:
        """A homogeneous block of one relation whose sources are ``dst[dtype] ++ src[stype]``."""
        blk = self._rel.get(etype)
        if blk is None:
            s, _, d = etype
            lsrc, ldst, eids = self._edges[etype]
            nd = self.num_dst_nodes(d)
            blk = Block(
                srcnodes=torch.cat([self.dstnodes[d], self.srcnodes[s]]),
                dstnodes=self.dstnodes[d],
                edge_index=torch.stack([lsrc + nd, ldst]),
                eids=eids,
            )
            self._rel[etype] = blk
        return blk

    def __repr__(self) -> str:
        src = {t: self.num_src_nodes(t) for t in self.ntypes}
        dst = {t: self.num_dst_nodes(t) for t in self.ntypes}
        ne = {c[1]: self.num_edges(c) for c in self.canonical_etypes}
        return f"HeteroBlock(num_src_nodes={src}, num_dst_nodes={dst}, num_edges={ne})"


class _EdgeData:
    def __init__(self, data: Frame) -> None:
        self.data = data


class _BlockEdges:
    def __init__(self, block: HeteroBlock) -> None:
        self._b = block

    def __call__(self, etype: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._b._edges[self._c(etype)]

    def __getitem__(self, etype: Any) -> _EdgeData:
        return _EdgeData(self._b.edge_frames[self._c(etype)])

    def _c(self, etype: Any) -> CanonicalEType:
        if etype is None and len(self._b.canonical_etypes) == 1:
            return self._b.canonical_etypes[0]
        return resolve_canonical(etype, self._b.canonical_etypes)


def to_hetero_block(
    book: RangePartitionBook,
    src: np.ndarray,
    dst: np.ndarray,
    etype: np.ndarray,
    type_eid: np.ndarray,
    dst_nodes: np.ndarray,
    new_type: str | None = None,
) -> HeteroBlock:
    """A :class:`HeteroBlock` from homogeneous sampled edges (``etype`` indexes the book's
    canonical types, ``type_eid`` are per-type edge IDs) whose destinations are ``dst_nodes``.
    Negative IDs are nodes the graph does not hold (an inductive request's, ``serve/
    inductive_typed.py``): of type ``new_type``, their per-type ID the same negative ID."""
    homo = to_block(src, dst, dst_nodes)
    nt = len(book.ntypes)
    s_types, s_ids = _per_type(book, homo.srcnodes.numpy(), new_type)
    s_local, s_pos = _type_local(s_types, nt)
    ndst = homo.num_dst_nodes()
    srcnodes: dict[str, torch.Tensor] = {}
    dstnodes: dict[str, torch.Tensor] = {}
    for t, name in enumerate(book.ntypes):
        pos = s_pos[t]
        srcnodes[name] = torch.from_numpy(s_ids[pos])
        dstnodes[name] = torch.from_numpy(s_ids[pos[pos < ndst]])  # dst first in src: a prefix
    lsrc_all = homo.edge_index[0].numpy()
    ldst_all = homo.edge_index[1].numpy()
    edges: dict[CanonicalEType, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    et = np.asarray(etype, dtype=np.int64)
    teid = np.asarray(type_eid, dtype=np.int64)
    for r, c in enumerate(book.canonical_etypes):
        mask = et == r
        edges[c] = (
            torch.from_numpy(s_local[lsrc_all[mask]]),
            torch.from_numpy(s_local[ldst_all[mask]]),
            torch.from_numpy(teid[mask]),
        )
    src_pos = {name: s_pos[t] for t, name in enumerate(book.ntypes)}
    return HeteroBlock(book.ntypes, book.canonical_etypes, srcnodes, dstnodes, edges, homo, src_pos)


def _per_type(book: RangePartitionBook, homo_ids: np.ndarray, new_type: str | None) -> tuple[Any, Any]:
    """``(type index, per-type ID)`` of ``homo_ids``; negative IDs are new nodes of ``new_type``."""
    new = homo_ids < 0
    if not new.any():
        return book.map_to_per_ntype(homo_ids)
    if new_type is None:
        raise UnknownTypeError(f"node ID {int(homo_ids[new][0])} is negative and no new_type is given")
    types = np.full(homo_ids.size, book.ntype_id(new_type), dtype=np.int64)
    ids = homo_ids.astype(np.int64, copy=True)
    if (~new).any():
        t_real, i_real = book.map_to_per_ntype(homo_ids[~new])
        types[~new], ids[~new] = t_real, i_real
    return types, ids


async def sample_and_pull_hetero(
    aio: Any,
    sampler: Any,
    seeds: dict[str, Any],
    batch_seed: int,
    *,
    node_feats: Sequence[str],
    labels: str | None,
    exclude: np.ndarray | None = None,
    prob: Any = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[HeteroBlock], float, float]:
    """Typed blocks for ``{ntype: ids}`` seeds (each layer's fanout an int or a dict by edge
    type, honoured by the servers), then ``node_feats`` of the inputs into
    ``blocks[0].srcdata[ntype]`` and ``labels`` of the seeds into ``blocks[-1].dstdata[ntype]``.
    The servers never pick edges whose homogeneous IDs are in ``exclude`` (an edge batch's own,
    excluded before the fanouts count, as DGL's) and weigh edges by ``prob`` (else
    ``sampler.prob``): an edge tensor's name, or one per edge type.

    Returns ``(inputs, outputs, blocks, sample seconds, pull seconds)``."""
    from asyncgraph.distributed.hetero import etype_fanouts

    t0 = time.perf_counter()
    book: RangePartitionBook = aio.book
    current = homo_seeds(book, seeds)
    blocks: list[HeteroBlock] = []
    for layer, fanout in enumerate(reversed(sampler.etype_fanouts)):
        fanouts = etype_fanouts(book, fanout)
        out = await aio.sample_etypes(
            current,
            fanouts,
            seed=layer_seed(batch_seed, layer),
            prob=prob if prob is not None else getattr(sampler, "prob", None),
            exclude=exclude,
        )
        block = to_hetero_block(book, out["src"], out["dst"], out["etype"], out["type_eid"], current)
        block.homo.csr()
        blocks.append(block)
        current = block.homo.srcnodes.numpy()
    blocks.reverse()
    t1 = time.perf_counter()
    first, last = blocks[0], blocks[-1]
    output = last.homo.dstnodes.numpy()
    out_pos = {t: pos[pos < output.size] for t, pos in last.src_pos.items()}
    pulls = [pull_by_type(aio, name, current, first.src_pos) for name in node_feats]
    if labels is not None:
        pulls.append(pull_by_type(aio, labels, output, out_pos))
    tensors = await asyncio.gather(*pulls)
    for name, by_type in zip(node_feats, tensors[: len(node_feats)], strict=True):
        for t, rows in by_type.items():
            first.srcdata[t][name] = rows
    if labels is not None:
        for t, rows in tensors[-1].items():
            last.dstdata[t][labels] = rows
    inputs = {t: first.srcnodes[t] for t in first.ntypes}
    outputs = {t: last.dstnodes[t] for t in last.ntypes}
    return inputs, outputs, blocks, t1 - t0, time.perf_counter() - t1


def typed_node_keys(aio: Any, name: str) -> dict[str, str] | None:
    """``{ntype: stored key}`` of node tensor ``name`` stored per type (the types that have it),
    or None when it is one tensor over every node (partitions before per-type storage, or a
    tensor made at run time)."""
    keys = {t: node_key(typed_name(t, name)) for t in aio.book.ntypes}
    have = {t: k for t, k in keys.items() if aio.catalog.cached_meta(k) is not None}
    return have or None


async def pull_by_type(
    aio: Any, name: str, homo_ids: np.ndarray, positions: dict[str, np.ndarray]
) -> dict[str, torch.Tensor]:
    """Rows of node tensor ``name`` of ``homo_ids[positions[t]]`` for each node type ``t``: one
    pull per type of a per-type tensor (types without it get none, as DGL's ``srcdata``), else
    one pull of the merged tensor split by type."""
    typed = typed_node_keys(aio, name)
    if typed is None:
        order = np.concatenate(list(positions.values())) if positions else np.empty(0, np.int64)
        rows = await aio.pull(node_key(name), homo_ids[order])
        bounds = np.cumsum([0, *(pos.size for pos in positions.values())]).tolist()
        return {t: rows[bounds[i] : bounds[i + 1]] for i, t in enumerate(positions)}
    wanted = [t for t in typed if t in positions]
    got = await asyncio.gather(*(aio.pull(typed[t], homo_ids[positions[t]]) for t in wanted))
    return dict(zip(wanted, got, strict=True))


def homo_seeds(book: RangePartitionBook, seeds: dict[str, Any]) -> np.ndarray:
    """Homogeneous IDs of ``{ntype: per-type IDs}``."""
    from asyncgraph.distributed.hetero import seeds_to_homo

    return seeds_to_homo(book, seeds)
