"""Inductive requests: the model's output for nodes the graph does not hold, from their features
and in-neighbours given in the request (``python -m asyncgraph.serve``; issue 36).

A new node's in-edges are its given neighbours (existing node IDs) in every layer: its first hop
is them, sampled to the layer's fanout, and so is its hop in every deeper block (it is one of
each block's destinations, as every seed is); the neighbours' own hops come from the graph,
sampled by their owners exactly as an ordinary batch samples (``layer_seed(seed, layer)``).
Given neighbours are drawn by ``NewNodes.sample_in_edges`` with ``layer_seed(seed, layer)``:
without replacement (unless the sampler replaces) the ``fanout`` whose keyed words
(``keyed_words(layer seed, i, position)`` for the request's ``i``-th new node) are smallest,
kept in the given order, all at once for the request's nodes: a node's answer depends on its
own position and neighbours only.
Within the blocks new node ``i`` is ID ``-1 - i`` (never a graph ID); its input row is the
request's feature row. Nothing is stored unless ``store`` is asked: then ``add_nodes`` (with the
feature rows) and ``add_edges`` (neighbour -> new node) of the live graph, after the answer,
give the new IDs. Typed graphs (neighbours per relation): ``serve/inductive_typed.py``; the
request's types and checks: ``serve/new_nodes.py``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.dataloading.sampler import layer_seed
from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import node_key
from asyncgraph.serve.inductive_typed import (
    check_typed_new_nodes,
    infer_typed_new_nodes,
    store_typed_new_nodes,
)
from asyncgraph.serve.new_nodes import NEW_NODE_INPUTS, NewNodes, NewNodesInput, check_new_nodes

if TYPE_CHECKING:
    from asyncgraph.client.async_client import AsyncClient
    from asyncgraph.serve.batching import DynamicBatcher
    from asyncgraph.serve.core import BatchTimes, InferenceCore

__all__ = [
    "NEW_NODE_INPUTS",
    "NewNodes",
    "NewNodesInput",
    "check_new_nodes",
    "infer_new_nodes",
    "new_node_blocks",
    "run_request",
    "store_new_nodes",
]


async def new_node_blocks(
    aio: AsyncClient, new: NewNodes, fanouts: list[int], seed: int, *, replace: bool = False
) -> list[Block]:
    """The blocks of ``new``'s nodes (outermost first; the last one's destinations are the new
    nodes, IDs ``-1 - i``), sampled with ``seed`` as the module's docstring says."""
    current = -1 - np.arange(new.count, dtype=np.int64)
    blocks: list[Block] = []
    for layer, fanout in enumerate(reversed(fanouts), start=1):
        seed_of_layer = layer_seed(seed, layer)
        is_new = current < 0
        real = current[~is_new]
        if real.size:
            sampled = await aio.sample_neighbors(real, fanout, replace=replace, seed=seed_of_layer)
            src_r, dst_r, eid_r = sampled
        else:
            src_r = dst_r = eid_r = np.empty(0, dtype=np.int64)
        src_n, dst_n = new.sample_in_edges(-1 - current[is_new], fanout, seed_of_layer, replace=replace)
        block = to_block(
            np.concatenate([src_r, src_n]),
            np.concatenate([dst_r, dst_n]),
            current,
            np.concatenate([eid_r, np.full(src_n.size, -1, dtype=np.int64)]),
        )
        blocks.append(block)
        current = block.srcnodes.numpy()
    blocks.reverse()
    for block in blocks:
        block.csr()
    return blocks


async def input_rows(aio: AsyncClient, new: NewNodes, feat: str, input_nodes: np.ndarray) -> np.ndarray:
    """The input rows of ``input_nodes``: pulled for graph nodes, the request's for new ones."""
    x = np.empty((input_nodes.size, *new.features.shape[1:]), dtype=new.features.dtype)
    is_new = input_nodes < 0
    x[is_new] = new.features[-1 - input_nodes[is_new]]
    real = np.flatnonzero(~is_new)
    if real.size:
        x[real] = await aio.pull_numpy(node_key(feat), input_nodes[real])
    return x


async def infer_new_nodes(core: InferenceCore, new: NewNodes, times: BatchTimes) -> torch.Tensor:
    """The model's output rows for ``new``'s nodes, in request order."""
    aio = core.async_client
    t0 = time.perf_counter()
    blocks = await new_node_blocks(aio, new, core.sampler.fanouts, core.seed, replace=core.sampler.replace)
    t1 = time.perf_counter()
    x = await input_rows(aio, new, core.feat, blocks[0].srcnodes.numpy())
    times.sample, times.pull = t1 - t0, time.perf_counter() - t1
    return await core.forward(blocks, torch.from_numpy(x), times)


async def store_new_nodes(aio: AsyncClient, new: NewNodes, feat: str) -> np.ndarray:
    """Add ``new``'s nodes, with their rows of the model's input tensor ``feat``, and their
    in-edges to the live graph; their new IDs (request order). A later request naming such an
    ID reads the stored row and edges, so it gets the answer this request got."""
    ids = await aio.add_nodes(new.count, data={feat: new.features})
    if new.neighbors.size:
        await aio.add_edges(new.neighbors, np.repeat(ids, np.diff(new.offsets)))
    return np.asarray(ids, dtype=np.int64)


async def run_request(
    core: InferenceCore,
    batcher: DynamicBatcher,
    nodes: np.ndarray | dict[str, np.ndarray] | NewNodesInput,
    timeout: float | None,
) -> tuple[torch.Tensor, np.ndarray | None]:
    """One request of either kind through the batcher: ``(output rows, stored new IDs or None)``.
    Node IDs are merged with other requests; new nodes run as a batch of their own, and are
    stored (``store``) only once their answer is computed, so a request that fails stores nothing."""
    if not isinstance(nodes, NewNodesInput):
        homo = core.check_nodes(nodes)
        await core.added_exist(homo)
        return await batcher.submit(homo, timeout), None
    if core.async_client.book.is_hetero:
        return await _run_typed(core, batcher, nodes, timeout)
    if isinstance(nodes.neighbors, dict) or isinstance(nodes.offsets, dict) or nodes.ntype is not None:
        raise InvalidRequestError(
            "neighbours per relation and ntype are for typed graphs; this one has no types"
        )
    new = check_new_nodes(
        nodes, feat_shape=core.feat_shape, feat_dtype=core.feat_dtype, num_nodes=core.num_nodes
    )
    await core.added_exist(new.neighbors, "neighbour node")  # before it joins a batch

    async def run(times: BatchTimes) -> torch.Tensor:
        return await infer_new_nodes(core, new, times)

    rows = await batcher.submit_own(new.count, run, timeout)
    return rows, (await store_new_nodes(core.async_client, new, core.feat) if new.store else None)


async def _run_typed(
    core: InferenceCore, batcher: DynamicBatcher, nodes: NewNodesInput, timeout: float | None
) -> tuple[torch.Tensor, np.ndarray | None]:
    """``run_request`` of new nodes on a typed graph (``serve/inductive_typed.py``)."""
    new = await check_typed_new_nodes(core, nodes)  # every neighbour exists: before it joins a batch

    async def run(times: BatchTimes) -> torch.Tensor:
        return await infer_typed_new_nodes(core, new, times)

    rows = await batcher.submit_own(new.count, run, timeout)
    return rows, (await store_typed_new_nodes(core.async_client, new, core.feat) if new.store else None)
