"""What the graph loaders share: the client they use, the IDs they batch, and one batch's
sample-and-pull step (blocks for the seeds through the sampler, then their features)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.client.async_client import AsyncClient, meta_row_bytes
from asyncgraph.client.cache import Traffic, pick_cached_ids
from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading.block import Block
from asyncgraph.dataloading.prefetch import LoaderStats
from asyncgraph.dataloading.sampler import NeighborSampler

__all__ = ["Sampled", "build_feature_cache", "client_of", "mask_or_ids", "sample_and_pull"]


def client_of(graph: Any) -> Client:
    """The blocking client behind a DistGraph (or the client itself)."""
    client = getattr(graph, "client", graph)
    if not isinstance(client, Client):
        raise TypeError(f"expected a DistGraph or Client, got {type(graph).__name__}")
    return client


def mask_or_ids(ids: Any) -> np.ndarray:
    """IDs as a numpy array: a boolean mask becomes the positions it selects."""
    arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    if arr.dtype == bool:
        arr = np.flatnonzero(arr)
    return arr


@dataclass
class Sampled:
    """A batch's blocks with ``node_feats`` in ``blocks[0].srcdata`` (labels in ``blocks[-1]``)."""

    input_nodes: np.ndarray
    output_nodes: np.ndarray
    blocks: list[Block]
    sample_time: float
    pull_time: float


async def sample_and_pull(
    aio: AsyncClient,
    sampler: NeighborSampler,
    seeds: np.ndarray,
    batch_seed: int,
    stats: LoaderStats,
    *,
    node_feats: Sequence[str],
    labels: str | None = None,
    exclude: np.ndarray | None = None,
    started: float | None = None,
) -> Sampled:
    """Sample blocks for ``seeds`` then pull ``node_feats`` of the inputs (and ``labels`` of the seeds).

    Layer ``l`` samples with seed ``batch_seed * 8 + l``; edges whose IDs are in ``exclude`` are
    dropped from every block. ``sample_time`` runs from ``started`` (default: now) to the end of
    sampling, and both times are added to ``stats``.
    """
    t0 = time.perf_counter() if started is None else started
    layer = 0
    replace = sampler.replace
    traffic = Traffic()

    async def sample_fn(layer_seeds: np.ndarray, fanout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nonlocal layer
        layer += 1
        before = traffic.remote_requests
        src, dst, sampled = await aio.sample_neighbors(
            layer_seeds, fanout, replace=replace, seed=batch_seed * 8 + layer, traffic=traffic
        )
        traffic.waves += traffic.remote_requests > before
        if exclude is not None and sampled.size:
            keep = ~np.isin(sampled, exclude)
            src, dst, sampled = src[keep], dst[keep], sampled[keep]
        return src, dst, sampled

    input_nodes, output_nodes, blocks = await sampler.sample_blocks(sample_fn, seeds)
    for block in blocks:  # the CSR aggregation layers use, built here rather than in training
        block.csr()
    t1 = time.perf_counter()
    before = traffic.remote_requests
    pulls = [aio.pull_numpy(f"node:{name}", input_nodes, traffic) for name in node_feats]
    if labels is not None:
        pulls.append(aio.pull_numpy(f"node:{labels}", output_nodes, traffic))
    tensors = [torch.from_numpy(t) for t in await asyncio.gather(*pulls)]
    traffic.waves += traffic.remote_requests > before
    t2 = time.perf_counter()
    for name, tensor in zip(node_feats, tensors[: len(node_feats)], strict=True):
        blocks[0].srcdata[name] = tensor
    if labels is not None:
        blocks[-1].dstdata[labels] = tensors[-1]
    stats.sample += t1 - t0
    stats.pull += t2 - t1
    stats.traffic.add(traffic)
    return Sampled(input_nodes, output_nodes, blocks, sample_time=t1 - t0, pull_time=t2 - t1)


async def build_feature_cache(
    aio: AsyncClient,
    sampler: NeighborSampler,
    nids: np.ndarray,
    node_feats: Sequence[str],
    budget_bytes: int,
    *,
    batch_size: int,
    presample_batches: int = 8,
    seed: int = 0,
) -> dict[str, int]:
    """Cache the remote input rows of ``node_feats`` most likely to be needed, within ``budget_bytes``.

    Likelihood: how often a node is an input node in ``presample_batches`` batches sampled here
    from ``nids`` (the loader's own seeds and sampler); ties and never-sampled nodes are ranked by
    their in-edges into the partitions held in this process (the edges seeds sampled here follow).
    Every name in ``node_feats`` caches the same IDs. Returns what was cached (rows, bytes).
    """
    candidates = aio.remote_ids("node")
    metas = [await aio.tensor_meta(f"node:{name}") for name in node_feats]
    row_bytes = sum(meta_row_bytes(m) for m in metas)
    max_rows = min(int(budget_bytes) // max(row_bytes, 1), candidates.size)
    if max_rows <= 0 or not node_feats:
        return {"rows": 0, "bytes": 0, "candidates": int(candidates.size)}
    num_nodes = aio.book.num_nodes
    scores = np.zeros(num_nodes, dtype=np.float64)
    for part in aio.partitions:
        if part.store is not None and part.store.indices.size:
            fan_in = np.bincount(part.store.indices, minlength=num_nodes)[:num_nodes]
            scores += fan_in / (float(fan_in.max()) + 1.0)
    rng = np.random.default_rng(seed)
    order = rng.permutation(nids.size)
    for b in range(min(presample_batches, -(-nids.size // max(batch_size, 1)))):
        batch = np.sort(nids[order[b * batch_size : (b + 1) * batch_size]])
        layer = 0

        async def sample_fn(
            layer_seeds: np.ndarray, fanout: int, b: int = b
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            nonlocal layer
            layer += 1
            return await aio.sample_neighbors(
                layer_seeds, fanout, replace=sampler.replace, seed=(seed + b) * 8 + layer
            )

        input_nodes, _, _ = await sampler.sample_blocks(sample_fn, batch)
        scores += np.bincount(input_nodes, minlength=num_nodes)[:num_nodes]
    ids = pick_cached_ids(scores, candidates, max_rows)
    total = 0
    for name in node_feats:
        total += (await aio.build_cache(f"node:{name}", ids)).nbytes
    return {"rows": int(ids.size), "bytes": total, "candidates": int(candidates.size)}
