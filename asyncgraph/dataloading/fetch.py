"""What the graph loaders share: the client they use, the IDs they batch, and one batch's
sample-and-pull step (blocks for the seeds through the sampler, then their features)."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.client import SampledRows
from asyncgraph.client.async_client import AsyncClient
from asyncgraph.client.cache import meta_row_bytes, pick_cached_ids
from asyncgraph.client.sync_client import Client
from asyncgraph.client.traffic import Traffic
from asyncgraph.dataloading.block import Block
from asyncgraph.dataloading.sampler import NeighborSampler, layer_seed
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import DTypeMismatchError, UnknownTensorError
from asyncgraph.names import is_state_key, node_key, split_typed, tensor_prefix

#: A loader worker's allocator: ``(name, shape, dtype)`` of each tensor to pull, and the
#: batch's blocks -> the arrays to pull them into.
Allocate = Callable[[list[tuple[str, tuple[int, ...], np.dtype[Any]]], list[Block]], list[np.ndarray]]

__all__ = [
    "AUTO",
    "Allocate",
    "Auto",
    "Sampled",
    "build_feature_cache",
    "client_of",
    "mask_or_ids",
    "node_tensor_names",
    "sample_and_pull",
]


class Auto(enum.Enum):
    """Marks a loader argument left at its default (``AUTO``)."""

    AUTO = "auto"


AUTO = Auto.AUTO
"""Default ``node_feats``/``labels``: fetch ``"feat"``/``"label"`` only if the graph has them."""

DEFAULT_FEAT = "feat"
DEFAULT_LABEL = "label"


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


def node_tensor_names(
    client: Client, node_feats: Sequence[str] | Auto, labels: str | Auto | None
) -> tuple[tuple[str, ...], str | None]:
    """Check the node tensors a loader is asked to fetch; returns ``(node_feats, labels)``.

    Names given explicitly must exist, else ``UnknownTensorError`` lists the node tensors that
    do (raised when the loader is built, not on its first batch). Left at ``AUTO``, ``"feat"``
    and ``"label"`` are fetched when the graph has them and skipped otherwise, so DGL-style
    scripts that read ``g.ndata[...]`` themselves work with any tensor names.
    """
    prefix = tensor_prefix("node")
    stored = [
        m.name[len(prefix) :]
        for m in client.refresh_tensors()
        if m.name.startswith(prefix) and not is_state_key(m.name)
    ]
    # a heterogeneous graph's per-type tensors ("paper/feat") are fetched by their name ("feat")
    existing = sorted({typed[1] if (typed := split_typed(n)) else n for n in stored})
    have = set(existing)

    def check(name: object, what: str) -> str:
        if not isinstance(name, str):
            raise DTypeMismatchError(f"{what} must name node tensors (str), got {name!r}")
        if name not in have:
            raise UnknownTensorError(
                f"{what}: the graph has no node tensor {name!r}; node tensors: {existing}"
            )
        return name

    if node_feats is AUTO:
        feats: tuple[str, ...] = (DEFAULT_FEAT,) if DEFAULT_FEAT in have else ()
    else:
        if isinstance(node_feats, str):
            node_feats = (node_feats,)
        feats = tuple(check(n, "node_feats") for n in node_feats)
    if labels is AUTO:
        label: str | None = DEFAULT_LABEL if DEFAULT_LABEL in have else None
    else:
        label = None if labels is None else check(labels, "labels")
    return feats, label


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
    carry_features: bool = False,
    allocate: Allocate | None = None,
) -> Sampled:
    """Sample blocks for ``seeds`` then pull ``node_feats`` of the inputs (and ``labels`` of the seeds).

    Layer ``l`` samples with seed ``layer_seed(batch_seed, l)``; edges whose IDs are in ``exclude`` are
    dropped from every block. ``sample_time`` runs from ``started`` (default: now) to the end of
    sampling, and both times are added to ``stats``. With ``carry_features`` the answers to the
    last sampling layer carry the rows of ``node_feats`` of the sampled nodes each owner holds,
    and only the rest are pulled afterwards (through the feature cache, if any): with a
    locality-aware partition most feature rows need no request wave of their own, and with a
    cache of the remaining remote nodes often none at all.

    ``allocate(specs, blocks)`` (a loader worker's batch slot) returns, for each ``(name, shape,
    dtype)`` of the tensors to pull (``node_feats``, then ``labels``), the array the rows are
    written to: each row is copied on the host once, straight to where the device copy reads
    it (``stats.host_copy_bytes``).
    """
    t0 = time.perf_counter() if started is None else started
    layer = 0
    replace = sampler.replace
    traffic = Traffic()
    # tensors whose rows the last layer's answers carry; rows they lack go through the pull path
    # (and its feature cache, which then best holds remote nodes sampled by other owners)
    carried = [node_key(n) for n in node_feats] if carry_features else []
    carry: SampledRows | None = None

    async def sample_fn(layer_seeds: np.ndarray, fanout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nonlocal layer, carry
        layer += 1
        before = traffic.remote_requests
        seed = layer_seed(batch_seed, layer)
        prob = getattr(sampler, "prob", None)
        if prob is not None:  # weighted: the owners sample with the edge tensor's weights
            src, dst, sampled = await aio.sample_edges(
                layer_seeds, fanout, replace=replace, seed=seed, prob=prob, exclude=exclude
            )
        elif carried and layer == len(sampler.fanouts):
            carry = await aio.sample_with_features(
                layer_seeds, fanout, carried, replace=replace, seed=seed, traffic=traffic
            )
            src, dst, sampled = carry.src, carry.dst, carry.eids
        else:
            src, dst, sampled = await aio.sample_neighbors(
                layer_seeds, fanout, replace=replace, seed=seed, traffic=traffic
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
    wanted = [(node_key(n), input_nodes) for n in node_feats]
    if labels is not None:
        wanted.append((node_key(labels), output_nodes))
    outs: list[np.ndarray | None] = [None] * len(wanted)
    if allocate is not None:
        metas = [await aio.tensor_meta(key) for key, _ in wanted]
        specs = [
            (key, (ids.size, *m.shape[1:]), np.dtype(m.dtype))
            for (key, ids), m in zip(wanted, metas, strict=True)
        ]
        outs = list(allocate(specs, blocks))
    pulls = [
        _pull_rest(aio, key, ids, carry.ids, carry.rows[carried.index(key)], traffic, out)
        if carry is not None and key in carried
        else aio.pull_numpy(key, ids, traffic, out=out)
        for (key, ids), out in zip(wanted, outs, strict=True)
    ]
    pulled = [await pulls[0]] if len(pulls) == 1 else await asyncio.gather(*pulls)  # one: no task
    tensors = [torch.from_numpy(t) for t in pulled]
    feature_bytes = sum(t.numel() * t.element_size() for t in tensors)
    stats.feature_bytes += feature_bytes
    if allocate is None:  # the pull gathered each row into an array of its own
        stats.host_copy_bytes += feature_bytes
    traffic.waves += traffic.remote_requests > before
    t2 = time.perf_counter()
    for name, tensor in zip(node_feats, tensors[: len(node_feats)], strict=True):
        blocks[0].srcdata[name] = tensor
    if labels is not None:
        blocks[-1].dstdata[labels] = tensors[-1]
    stats.sample += t1 - t0
    stats.pull += t2 - t1
    stats.input_nodes += len(input_nodes)
    stats.traffic.add(traffic)
    stats.host_copy_bytes += traffic.pulled_into_bytes
    return Sampled(input_nodes, output_nodes, blocks, sample_time=t1 - t0, pull_time=t2 - t1)


async def _pull_rest(
    aio: AsyncClient,
    name: str,
    ids: np.ndarray,
    known: np.ndarray,
    rows: np.ndarray,
    traffic: Traffic,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Rows ``ids`` of ``name``: those of ``known`` (sorted IDs, their ``rows``) copied, the rest
    pulled (through the client's one pull path); into ``out`` when given (the rows pulled for
    it are copied twice: pulled, then placed; ``traffic.pulled_into_bytes`` says so)."""
    if not known.size:
        return await aio.pull_numpy(name, ids, traffic, out=out)
    slot = np.minimum(np.searchsorted(known, ids), known.size - 1)
    hit = known[slot] == ids
    if out is None and bool(hit.all()):
        return rows[slot]
    if out is None:
        out = np.empty((ids.size, *rows.shape[1:]), dtype=rows.dtype)
    else:
        row_bytes = rows.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
        misses = int(ids.size - np.count_nonzero(hit))
        traffic.pulled_into_bytes += (ids.size + misses) * row_bytes
    out[hit] = rows[slot[hit]]
    miss = np.flatnonzero(~hit)
    if miss.size:
        out[miss] = await aio.pull_numpy(name, ids[miss], traffic)
    return out


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
    carry_features: bool = False,
) -> dict[str, int]:
    """Cache the remote input rows of ``node_feats`` most likely to be needed, within ``budget_bytes``.

    Likelihood: how often a node has to be pulled in ``presample_batches`` batches sampled here
    from ``nids`` (the loader's own seeds and sampler): as an input node, or, with
    ``carry_features``, as a source sampled by an owner other than its own (no sample answer
    carries it). Ties and never-sampled nodes are ranked by their in-edges into the partitions
    held in this process. Every name in ``node_feats`` caches the same IDs. Returns what was
    cached (rows, bytes, candidates).
    """
    candidates = aio.remote_ids("node")
    metas = [await aio.tensor_meta(node_key(name)) for name in node_feats]
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
                layer_seeds, fanout, replace=sampler.replace, seed=layer_seed(seed + b, layer)
            )

        input_nodes, _, blocks = await sampler.sample_blocks(sample_fn, batch)
        if carry_features:  # only inputs that no owner's answer carries need the cache
            src = blocks[0].srcnodes.numpy()[blocks[0].edge_index[0].numpy()]
            dst = blocks[0].dstnodes.numpy()[blocks[0].edge_index[1].numpy()]
            cross = aio.book.owner(src, "node") != aio.book.owner(dst, "node")
            scores += np.bincount(src[cross], minlength=num_nodes)[:num_nodes]
        else:
            scores += np.bincount(input_nodes, minlength=num_nodes)[:num_nodes]
    ids = pick_cached_ids(scores, candidates, max_rows)
    total = 0
    for name in node_feats:
        total += (await aio.build_cache(node_key(name), ids)).nbytes
    return {"rows": int(ids.size), "bytes": total, "candidates": int(candidates.size)}
