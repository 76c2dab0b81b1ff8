"""What the graph loaders share: the client they use, the IDs they batch, and one batch's
sample-and-pull step (blocks for the seeds through the sampler, then their features)."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading.block import Block
from asyncgraph.dataloading.prefetch import LoaderStats
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.errors import DTypeMismatchError, UnknownTensorError
from asyncgraph.names import is_state_key, tensor_prefix

__all__ = ["AUTO", "Auto", "Sampled", "client_of", "mask_or_ids", "node_tensor_names", "sample_and_pull"]


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
    existing = sorted(
        m.name[len(prefix) :]
        for m in client.refresh_tensors()
        if m.name.startswith(prefix) and not is_state_key(m.name)
    )
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
) -> Sampled:
    """Sample blocks for ``seeds`` then pull ``node_feats`` of the inputs (and ``labels`` of the seeds).

    Layer ``l`` samples with seed ``batch_seed * 8 + l``; edges whose IDs are in ``exclude`` are
    dropped from every block. ``sample_time`` runs from ``started`` (default: now) to the end of
    sampling, and both times are added to ``stats``.
    """
    t0 = time.perf_counter() if started is None else started
    layer = 0
    replace = sampler.replace

    async def sample_fn(layer_seeds: np.ndarray, fanout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nonlocal layer
        layer += 1
        src, dst, sampled = await aio.sample_neighbors(
            layer_seeds, fanout, replace=replace, seed=batch_seed * 8 + layer
        )
        if exclude is not None and sampled.size:
            keep = ~np.isin(sampled, exclude)
            src, dst, sampled = src[keep], dst[keep], sampled[keep]
        return src, dst, sampled

    input_nodes, output_nodes, blocks = await sampler.sample_blocks(sample_fn, seeds)
    for block in blocks:  # the CSR aggregation layers use, built here rather than in training
        block.csr()
    t1 = time.perf_counter()
    pulls = [aio.pull(f"node:{name}", input_nodes) for name in node_feats]
    if labels is not None:
        pulls.append(aio.pull(f"node:{labels}", output_nodes))
    tensors = await asyncio.gather(*pulls)
    t2 = time.perf_counter()
    for name, tensor in zip(node_feats, tensors[: len(node_feats)], strict=True):
        blocks[0].srcdata[name] = tensor
    if labels is not None:
        blocks[-1].dstdata[labels] = tensors[-1]
    stats.sample += t1 - t0
    stats.pull += t2 - t1
    stats.input_nodes += len(input_nodes)
    return Sampled(input_nodes, output_nodes, blocks, sample_time=t1 - t0, pull_time=t2 - t1)
