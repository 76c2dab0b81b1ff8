"""Edge batches of a heterogeneous graph: ``DistEdgeDataLoader(g, {etype: eids}, ...)``.

The loader translates the per-type edge IDs to homogeneous ones once (``map_to_homo_eid``: a
range computation and one read of ``_TYPE_ORDER`` from the owners), so batches mix types and
each batch's endpoints come from one ``find_edges``. Per batch, per relation present: the pairs
in per-type local indices, ``negative_sampler.generate`` over that relation's destination type
(DGL's per-relation negatives: same source type, destinations uniform over the destination
type), typed blocks of every endpoint (``to_hetero_block``) with the excluded edges dropped.
Exclusion follows DGL: ``"self"`` the batch's edges, ``"reverse_id"`` them and
``reverse_eids[etype][eid]`` (a reverse of the same type), ``"reverse_types"`` them and the same
per-type IDs of ``reverse_etypes[etype]``; the reverses are resolved to homogeneous IDs once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import IdArray, as_id_array, unique_sorted
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError
from asyncgraph.partition.book import RangePartitionBook

from .fetch import mask_or_ids
from .hetero_block import HeteroBlock, sample_and_pull_hetero
from .hetero_pair import HeteroPairGraph
from .negative import NegativeSampler

__all__ = ["TypedEdgeSeeds", "build_typed_batch", "typed_edge_seeds"]

CanonicalEType = tuple[str, str, str]


@dataclass
class TypedEdgeSeeds:
    """A loader's edges: homogeneous IDs, their type index and per-type IDs (parallel arrays),
    and the homogeneous reverse each excludes with it (``-1``: none)."""

    homo: IdArray
    etype: IdArray
    type_eid: IdArray
    reverse: IdArray | None


def _canonical_dict(book: RangePartitionBook, d: Mapping[Any, Any], what: str) -> dict[int, Any]:
    if not isinstance(d, Mapping):
        raise InvalidRequestError(f"{what} must be a dict keyed by edge type, got {type(d).__name__}")
    return {book.etype_id(k): v for k, v in d.items()}


def typed_edge_seeds(
    book: RangePartitionBook,
    eids: Mapping[Any, Any],
    exclude: str | None,
    reverse_eids: Any,
    reverse_etypes: Any,
) -> TypedEdgeSeeds:
    """Check ``{etype: per-type IDs or mask}`` and the exclusion options; map everything to
    homogeneous IDs (raises ``UnknownTypeError`` / ``OutOfRangeError`` / ``ShapeMismatchError``
    before any batch)."""
    if not book.is_hetero:
        raise InvalidRequestError("{etype: eids} needs a heterogeneous graph; pass edge IDs")
    per_type = _canonical_dict(book, eids, "eids")
    homo, types, tids, rev = [], [], [], []
    rev_ids = _canonical_dict(book, reverse_eids, "reverse_eids") if exclude == "reverse_id" else {}
    rev_types = _canonical_dict(book, reverse_etypes, "reverse_etypes") if exclude == "reverse_types" else {}
    for r, value in per_type.items():
        c = book.canonical_etypes[r]
        ids = as_id_array(mask_or_ids(value), f"eids[{c}]")  # a boolean mask: its positions
        homo.append(book.map_to_homo_eid(ids, c))  # OutOfRangeError names the type
        types.append(np.full(ids.size, r, dtype=np.int64))
        tids.append(ids)
        if exclude == "reverse_id":
            if r not in rev_ids:
                raise InvalidRequestError(f"exclude='reverse_id' needs reverse_eids[{c}]")
            table = as_id_array(mask_or_ids(rev_ids[r]), f"reverse_eids[{c}]")
            if table.size != book.num_edges_of(c):
                raise ShapeMismatchError(
                    f"reverse_eids[{c}] must hold one edge ID per edge of the type "
                    f"({book.num_edges_of(c)}), got {table.size}"
                )
            rev.append(book.map_to_homo_eid(table[ids], c))
        elif exclude == "reverse_types":
            if r not in rev_types:
                raise InvalidRequestError(f"exclude='reverse_types' needs reverse_etypes[{c}]")
            rev.append(book.map_to_homo_eid(ids, rev_types[r]))
    cat = np.concatenate
    return TypedEdgeSeeds(cat(homo), cat(types), cat(tids), cat(rev) if rev else None)


def typed_prob(g: Any, book: RangePartitionBook, prob: str | None) -> str | list[str | None] | None:
    """DGL's ``prob`` of a typed sampler: the name of each edge type's tensor. A tensor set with
    ``g.edges[etype].data[prob] = DistTensor(...)`` is stored under its own name (DGL's are
    often anonymous), so the servers get one stored name per type (None: uniform); a name no
    type set stays one homogeneous edge tensor."""
    aliases = getattr(getattr(g, "edges_by_type", None), "aliases", {})
    if prob is None or not any(name == prob for (_, name) in aliases):
        return prob
    out: list[str | None] = []
    for c in book.canonical_etypes:
        alias = aliases.get((c, prob))
        out.append(alias.key if alias is not None else None)
    return out


def excluded(seeds: TypedEdgeSeeds, exclude: str | None, positions: np.ndarray) -> np.ndarray | None:
    """Homogeneous edge IDs the blocks of the batch at ``positions`` may not contain."""
    if exclude is None:
        return None
    own: np.ndarray = seeds.homo[positions]
    if seeds.reverse is None:
        return own
    out: np.ndarray = np.union1d(own, seeds.reverse[positions])
    return out


async def build_typed_batch(
    aio: Any,
    seeds: TypedEdgeSeeds,
    positions: np.ndarray,
    sampler: Any,
    negative_sampler: NegativeSampler | None,
    rng: np.random.Generator,
    batch_seed: int,
    node_feats: Sequence[str],
    exclude: np.ndarray | None,
    prob: Any = None,
) -> tuple[dict[str, torch.Tensor], HeteroPairGraph, HeteroPairGraph | None, list[HeteroBlock], float, float]:
    """One typed edge batch: ``(input_nodes, pair_graph, neg_pair_graph, blocks, sample s, pull s)``."""
    book: RangePartitionBook = aio.book
    homo, et, teid = seeds.homo[positions], seeds.etype[positions], seeds.type_eid[positions]
    src, dst = await aio.find_edges(homo)
    canon = book.canonical_etypes
    # endpoints per relation in homogeneous IDs: positives, then negatives
    pos: dict[int, tuple[IdArray, IdArray, IdArray]] = {}
    neg: dict[int, tuple[IdArray, IdArray]] = {}
    for r in np.unique(et).tolist():
        sel = et == r
        pos[r] = (src[sel], dst[sel], teid[sel])
        if negative_sampler is not None:
            s_t, d_t = canon[r][0], canon[r][2]
            _, s_local = book.map_to_per_ntype(src[sel])
            ns, nd = negative_sampler.generate(s_local, book.num_nodes_of(d_t), rng)
            neg[r] = (
                book.map_to_homo_nid(as_id_array(ns, "neg_src"), s_t),
                book.map_to_homo_nid(as_id_array(nd, "neg_dst"), d_t),
            )
    ends = [a for p in pos.values() for a in p[:2]] + [a for n in neg.values() for a in n]
    unique = unique_sorted(np.concatenate(ends))
    types, per = book.map_to_per_ntype(unique)
    seed_dict = {t: per[types == i] for i, t in enumerate(book.ntypes)}
    inputs, _, blocks, sample_time, pull_time = await sample_and_pull_hetero(
        aio, sampler, seed_dict, batch_seed, node_feats=node_feats, labels=None, exclude=exclude, prob=prob
    )
    nodes = {t: torch.from_numpy(v) for t, v in seed_dict.items()}

    def local(ids: IdArray) -> torch.Tensor:
        """Index of homogeneous ``ids`` among their type's batch nodes (sorted per type)."""
        t, p = book.map_to_per_ntype(ids)
        out = np.empty(ids.size, dtype=np.int64)
        for i in np.unique(t).tolist():  # one or two node types per relation side
            sel = t == i
            out[sel] = np.searchsorted(seed_dict[book.ntypes[i]], p[sel])
        return torch.from_numpy(out)

    empty = torch.empty(0, dtype=torch.int64)
    pairs = {c: (empty, empty, empty) for c in canon}
    for r, (s, d, e) in pos.items():
        pairs[canon[r]] = (local(s), local(d), torch.from_numpy(e.copy()))
    pair = HeteroPairGraph(book.ntypes, canon, nodes, pairs)
    neg_pair = None
    if negative_sampler is not None:
        npairs = {c: (empty, empty, empty) for c in canon}
        for r, (s, d) in neg.items():
            npairs[canon[r]] = (local(s), local(d), empty)
        neg_pair = HeteroPairGraph(book.ntypes, canon, nodes, npairs)
    return inputs, pair, neg_pair, blocks, sample_time, pull_time
