"""Inductive requests on typed (heterogeneous) graphs: the model's output for new nodes of one node
type from their input rows and their in-neighbours given per relation (issue 36).

The new nodes are of one type (``ntype``; default the model's target type). Their in-neighbours are
given per relation ``{etype: per-type source IDs}`` with ``{etype: offsets}`` (``n + 1`` each);
every relation must end at the new nodes' type and its neighbours are per-type IDs of its source
type (a live graph's added nodes too). Blocks are built as ``sample_and_pull_hetero`` builds them
(``layer_seed(seed, layer)``, layer 0 the one nearest the inputs' far end, a fanout per relation
from ``etype_fanouts``): graph nodes are sampled by their owners, and a new node's in-edges of
relation ``r`` in every layer are its given ``r``-neighbours sampled to ``r``'s fanout by the
homogeneous rule (``NewNodes.sample_in_edges``: the smallest ``keyed_words(layer_seed(seed, layer),
i, position)`` for the request's ``i``-th new node, without replacement, kept in the given order;
each relation draws with those words afresh). In the blocks new node ``i`` is ID ``-1 - i`` of its
type (``to_hetero_block(new_type=)``); its input row is the request's. ``store`` adds the nodes
(``add_nodes(ntype=, data={feat: rows})``) and then each relation's edges (``add_edges(etype=)``)
after the answer, and answers the new per-type IDs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from asyncgraph.dataloading.hetero_block import HeteroBlock, pull_by_type, to_hetero_block, typed_node_keys
from asyncgraph.dataloading.sampler import layer_seed
from asyncgraph.errors import AsyncGraphError, InvalidRequestError, UnknownTensorError, UnknownTypeError
from asyncgraph.serve.new_nodes import NewNodes, NewNodesInput, check_features, check_neighbours

if TYPE_CHECKING:
    from asyncgraph.client.async_client import AsyncClient
    from asyncgraph.serve.core import BatchTimes, InferenceCore

__all__ = ["TypedNewNodes", "check_typed_new_nodes", "infer_typed_new_nodes", "store_typed_new_nodes"]


@dataclass(frozen=True)
class TypedNewNodes:
    """Checked new nodes of type ``ntype``: ``features[i]``, and per relation index ``r`` the
    in-neighbours ``relations[r]`` (homogeneous IDs) and ``per_type[r]`` (the request's IDs)."""

    ntype: str
    features: np.ndarray
    relations: dict[int, NewNodes]
    per_type: dict[int, np.ndarray]
    store: bool = False

    @property
    def count(self) -> int:
        return int(self.features.shape[0])


def _relation(book: Any, etype: Any, ntype: str) -> int:
    """The index of relation ``etype`` (name or ``src:rel:dst``), which must end at ``ntype``."""
    if not isinstance(etype, str):
        raise InvalidRequestError(f"a relation must be named by a string, got {etype!r}")
    try:
        r = int(book.etype_id(tuple(etype.split(":")) if etype.count(":") == 2 else etype))
    except (UnknownTypeError, ValueError, KeyError):
        raise UnknownTypeError(
            f"unknown or ambiguous relation {etype!r}; the graph has "
            f"{[':'.join(c) for c in book.canonical_etypes]}"
        ) from None
    if book.canonical_etypes[r][2] != ntype:
        ending = [":".join(c) for c in book.canonical_etypes if c[2] == ntype]
        raise InvalidRequestError(
            f"relation {etype!r} ends at {book.canonical_etypes[r][2]!r} nodes, not at the new "
            f"{ntype!r} nodes; relations into {ntype!r}: {ending}"
        )
    return r


async def _feature_meta(core: InferenceCore, ntype: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The row shape and dtype of ``ntype``'s model input tensor (``UnknownTensorError`` if none)."""
    aio = core.async_client
    typed = typed_node_keys(aio, core.feat)
    if typed is None:  # one tensor over every node
        return core.feat_shape, core.feat_dtype
    if ntype not in typed:
        raise UnknownTensorError(
            f"{ntype!r} nodes have no {core.feat!r} tensor (the model's input); types with it: {list(typed)}"
        )
    meta = await aio.tensor_meta(typed[ntype])
    return tuple(int(s) for s in meta.shape[1:]), np.dtype(meta.dtype)


async def check_typed_new_nodes(core: InferenceCore, given: NewNodesInput) -> TypedNewNodes:
    """``given``'s new nodes checked against the graph (type, relations, shapes, dtypes, and
    that every neighbour exists), else a typed error naming the problem; nothing is stored."""
    book = core.async_client.book
    ntype = given.ntype if given.ntype is not None else core.target
    if ntype is None:
        raise InvalidRequestError(f"name the new nodes' type (ntype): one of {book.ntypes}")
    if not isinstance(ntype, str) or ntype not in book.ntypes:
        raise UnknownTypeError(f"unknown node type {ntype!r}; the graph has {book.ntypes}")
    if core.target is not None and ntype != core.target:
        raise InvalidRequestError(f"the model answers {core.target!r} nodes only, got new {ntype!r} nodes")
    nbrs, offs = given.neighbors, given.offsets
    if not isinstance(nbrs, Mapping) or not isinstance(offs, Mapping):
        raise InvalidRequestError(
            "on a typed graph neighbours are given per relation: neighbors {etype: IDs} and "
            "offsets {etype: n + 1 offsets}"
        )
    if sorted(map(str, nbrs)) != sorted(map(str, offs)):
        raise InvalidRequestError(
            f"neighbors and offsets must name the same relations, got {list(nbrs)} and {list(offs)}"
        )
    feat_shape, feat_dtype = await _feature_meta(core, ntype)
    features = check_features(given.features, feat_shape=feat_shape, feat_dtype=feat_dtype)  # once
    relations: dict[int, NewNodes] = {}
    per_type: dict[int, np.ndarray] = {}
    for etype in nbrs:
        r = _relation(book, etype, ntype)
        if r in relations:
            raise InvalidRequestError(f"relation {etype!r} is given twice")
        src_type = book.canonical_etypes[r][0]
        try:
            ids, offsets = check_neighbours(
                nbrs[etype], offs[etype], count=int(features.shape[0]), num_nodes=book.num_nodes_of(src_type)
            )
        except AsyncGraphError as err:
            raise type(err)(f"relation {etype!r}: {err}") from None
        homo = np.asarray(book.map_to_homo_nid(ids, src_type), dtype=np.int64)
        await core.added_exist(homo, "neighbour node")
        relations[r] = NewNodes(features, homo, offsets)
        per_type[r] = ids
    return TypedNewNodes(ntype, features, relations, per_type, bool(given.store))


async def typed_new_node_blocks(core: InferenceCore, new: TypedNewNodes) -> list[HeteroBlock]:
    """The typed blocks of ``new``'s nodes (outermost first; the last one's destinations are the
    new nodes, IDs ``-1 - i`` of ``new.ntype``), built as the module's docstring says."""
    from asyncgraph.distributed.hetero import etype_fanouts

    aio = core.async_client
    book = aio.book
    current = -1 - np.arange(new.count, dtype=np.int64)
    blocks: list[HeteroBlock] = []
    empty = np.empty(0, dtype=np.int64)
    for layer, fanout in enumerate(reversed(core.sampler.etype_fanouts)):
        fanouts = etype_fanouts(book, fanout)
        seed_of_layer = layer_seed(core.seed, layer)
        real = current[current >= 0]
        if real.size:
            out = await aio.sample_etypes(real, fanouts, seed=seed_of_layer, prob=core.sampler.prob)
            parts = [(out["src"], out["dst"], out["etype"], out["type_eid"])]
        else:
            parts = []
        new_rows = -1 - current[current < 0]
        for r, given in sorted(new.relations.items()):
            src, dst = given.sample_in_edges(new_rows, int(fanouts[r]), seed_of_layer)
            parts.append((src, dst, np.full(src.size, r, np.int64), np.full(src.size, -1, np.int64)))
        src, dst, etype, teid = (np.concatenate([p[k] for p in parts]) if parts else empty for k in range(4))
        block = to_hetero_block(book, src, dst, etype, teid, current, new_type=new.ntype)
        block.homo.csr()
        blocks.append(block)
        current = block.homo.srcnodes.numpy()
    blocks.reverse()
    return blocks


async def typed_input_rows(
    core: InferenceCore, new: TypedNewNodes, first: HeteroBlock
) -> dict[str, torch.Tensor]:
    """``{ntype: input rows}`` of ``first``'s sources: pulled per type for graph nodes
    (``pull_by_type``), the request's rows for the new ones."""
    homo = first.homo.srcnodes.numpy()
    real = {t: pos[homo[pos] >= 0] for t, pos in first.src_pos.items()}
    pulled = await pull_by_type(core.async_client, core.feat, homo, real)
    x: dict[str, torch.Tensor] = {}
    for t, pos in first.src_pos.items():
        if t != new.ntype:
            if t in pulled:
                x[t] = pulled[t]
            continue
        ids = homo[pos]
        rows = torch.empty(
            (pos.size, *new.features.shape[1:]), dtype=torch.from_numpy(new.features[:0]).dtype
        )
        is_new = torch.from_numpy(ids < 0)
        rows[is_new] = torch.from_numpy(new.features[-1 - ids[ids < 0]])
        if t in pulled:
            rows[~is_new] = pulled[t].to(rows.dtype)
        x[t] = rows
    return x


async def infer_typed_new_nodes(core: InferenceCore, new: TypedNewNodes, times: BatchTimes) -> torch.Tensor:
    """The model's output rows for ``new``'s nodes, in request order."""
    t0 = time.perf_counter()
    blocks = await typed_new_node_blocks(core, new)
    t1 = time.perf_counter()
    x = await typed_input_rows(core, new, blocks[0])
    times.sample, times.pull = t1 - t0, time.perf_counter() - t1
    # the last block's destinations are the new nodes in order (-1, -2, ...): rows in request order
    return await core.forward(blocks, x, times)


async def store_typed_new_nodes(aio: AsyncClient, new: TypedNewNodes, feat: str) -> np.ndarray:
    """Add ``new``'s nodes (type ``new.ntype``, with their ``feat`` rows), then each relation's
    in-edges, to the live graph; their new per-type IDs in request order."""
    book = aio.book
    ids = np.asarray(await aio.add_nodes(new.count, ntype=new.ntype, data={feat: new.features}), np.int64)
    for r, given in sorted(new.relations.items()):
        if given.neighbors.size:
            dst = np.repeat(ids, np.diff(given.offsets))
            await aio.add_edges(new.per_type[r], dst, etype=book.canonical_etypes[r])
    return ids
