"""Node-wise mini-batches: seed nodes, their sampled blocks, input features and labels."""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import as_id_array
from asyncgraph.client.async_client import AsyncClient
from asyncgraph.dataloading.block import Block
from asyncgraph.dataloading.fetch import (
    AUTO,
    Allocate,
    Auto,
    build_feature_cache,
    client_of,
    mask_or_ids,
    node_tensor_names,
    sample_and_pull,
)
from asyncgraph.dataloading.hetero_block import sample_and_pull_hetero
from asyncgraph.dataloading.hetero_edge_loader import typed_prob
from asyncgraph.dataloading.prefetch import LoaderStats, PrefetchingLoader
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.errors import InvalidRequestError, UnknownTypeError

__all__ = ["DistNodeDataLoader", "MiniBatch", "NodeBatchRecipe", "build_node_batch"]


@dataclass
class MiniBatch:
    """One batch: unpacks to ``(input_nodes, seeds, blocks)`` like DGL's node dataloader."""

    input_nodes: torch.Tensor
    seeds: torch.Tensor
    blocks: list[Block]
    sample_time: float = 0.0
    pull_time: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.input_nodes, self.seeds, self.blocks))


class DistNodeDataLoader(PrefetchingLoader[MiniBatch]):
    """Mini-batches of seed nodes with sampled blocks, input features and labels.

    Yields ``MiniBatch`` objects that unpack to ``(input_nodes, seeds, blocks)``; the node tensors
    named by ``node_feats`` are in ``blocks[0].srcdata[name]`` and ``labels`` in
    ``blocks[-1].dstdata[labels]``. A named tensor the graph lacks raises ``UnknownTensorError``
    (listing the node tensors it has) here. Left at their defaults, ``"feat"`` and ``"label"``
    are fetched if the graph has them; DGL-style code reads ``g.ndata[name][input_nodes]`` itself.
    With ``device=`` every tensor of a batch arrives on that device (copied in the background
    unless ``overlap=False``; see ``dataloading/device.py``).

    ``feature_cache_bytes > 0`` caches, in this process, the remote rows of ``node_feats`` most
    likely to be needed (ranked by ``cache_presample_batches`` batches sampled up front; see
    ``build_feature_cache``): only for tensors no process writes during training, and not yet
    for typed (heterogeneous) ``nids``; with ``num_workers`` the workers map the same cache
    read-only (``worker_cache.py``: one copy per host). ``cache_info`` says what was cached; hits
    and misses are counted in ``stats.traffic``. ``carry_features=True`` has the last sampling layer's
    answers carry the input features their servers own, saving most batches a request wave
    (``stats.traffic.waves``); results are the same either way. It is off by default: it pays
    where a round trip is long (servers on other machines), while on a CPU-bound host the
    serialised local-first sampling costs more than the wave saves (2 trainers on 2 cores, DGL's
    graph: epoch 5.2 s with it, 4.8 s without; ``benchmarks/README.md`` §0).

    ``num_workers=N`` builds batches in N worker processes (``dataloading/workers.py``): the
    training loop's thread then only trains, and each batch's feature rows are gathered once,
    straight into memory the device copy reads (pinned on CUDA hosts). ``gather_threads`` splits
    each worker's large gathers over that many threads. Results equal ``num_workers=0``'s.
    ``worker_mode="thread"`` runs the same workers on threads of this process instead (measured
    against processes in ``benchmarks/README.md`` §20; processes win, so they are the default).
    """

    def __init__(
        self,
        g: Any,
        nids: Any,
        sampler: NeighborSampler,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        prefetch: int = 2,
        node_feats: Sequence[str] | Auto = AUTO,
        labels: str | Auto | None = AUTO,
        seed: int | None = None,
        device: str | torch.device | None = None,
        overlap: bool = True,
        feature_cache_bytes: int = 0,
        cache_presample_batches: int = 8,
        carry_features: bool = False,
        num_workers: int = 0,
        gather_threads: int = 1,
        worker_mode: str = "process",
    ) -> None:
        client = client_of(g)
        # Heterogeneous graphs: {ntype: ids or mask}; batches mix types, homogeneous IDs inside.
        self.typed: list[tuple[str, np.ndarray]] | None = None
        if isinstance(nids, Mapping):
            book = client.book
            bad = [k for k in nids if k not in book.ntypes]
            if bad:
                raise UnknownTypeError(f"nids: unknown node type(s) {bad}; known: {book.ntypes}")
            typed = [(str(t), mask_or_ids(v).astype(np.int64, copy=False)) for t, v in nids.items()]
            self.typed = typed
            self.nids = np.concatenate([book.map_to_homo_nid(v, t) for t, v in typed])
        else:
            self.nids = mask_or_ids(nids).astype(np.int64, copy=False)
        super().__init__(
            client.loop,
            self.nids.size,
            batch_size,
            shuffle,
            drop_last,
            prefetch,
            seed,
            device,
            overlap,
            num_workers=num_workers,
            gather_threads=gather_threads,
            worker_mode=worker_mode,
        )
        self.client = client
        self.async_client: AsyncClient = client.async_client
        self.sampler = sampler
        self.node_feats, self.labels = node_tensor_names(client, node_feats, labels)
        self.typed_prob = typed_prob(g, client.book, getattr(sampler, "prob", None))  # per edge type
        self.carry_features = carry_features
        self.cache_info: dict[str, int] = {}
        if feature_cache_bytes > 0:
            if self.typed is not None:
                raise InvalidRequestError(
                    "feature_cache_bytes: a feature cache for typed (heterogeneous) nids is not supported yet"
                )
            self.cache_info = client.loop.run(
                build_feature_cache(
                    self.async_client,
                    sampler,
                    self.nids,
                    self.node_feats,
                    feature_cache_bytes,
                    batch_size=batch_size,
                    presample_batches=cache_presample_batches,
                    seed=self.seed,
                    carry_features=carry_features,
                )
            )
        if num_workers > 0:  # they start now, while the caller sets up its model
            self._worker_pool()

    def add_seeds(self, ids: Any) -> None:
        """Add nodes to the seed set from the next epoch on (a live graph's added nodes, issue
        35): global IDs, e.g. this trainer's share of what ``add_nodes`` returned
        (``new[rank::world_size]``); ``{ntype: per-type IDs}`` for typed (heterogeneous) seeds.
        An epoch already running keeps its batches; the next one shuffles the grown set
        (``len(loader)`` grows). ``OutOfRangeError`` (nothing added) for an ID that is not a
        node, ``UnknownTypeError`` for an unknown type."""
        book = self.client.book
        if self.typed is not None or isinstance(ids, Mapping):
            if self.typed is None or not isinstance(ids, Mapping):
                raise InvalidRequestError("add_seeds: {ntype: ids} exactly when the loader's nids are typed")
            bad = [k for k in ids if k not in book.ntypes]
            if bad:
                raise UnknownTypeError(f"add_seeds: unknown node type(s) {bad}; known: {book.ntypes}")
            typed = [(str(t), as_id_array(v, f"ids[{t!r}]")) for t, v in ids.items()]
            gids = np.concatenate([book.map_to_homo_nid(v, t) for t, v in typed] or [np.empty(0, np.int64)])
        else:
            gids = as_id_array(ids, "ids")
        if gids.size:
            self.client.loop.run(self.async_client.degrees(gids, "in"))  # each owner: it exists
        if self.typed is not None:
            self.typed = [*self.typed, *typed]
        self.nids = np.concatenate([self.nids, gids])
        self._num_items = int(self.nids.size)

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[MiniBatch]:
        return build_node_batch(
            self.async_client, self._recipe, self.nids[positions], self._batch_seed(epoch, index), self.stats
        )

    @property
    def _recipe(self) -> NodeBatchRecipe:
        return NodeBatchRecipe(
            self.sampler,
            self.node_feats,
            self.labels,
            self.carry_features,
            self.typed is not None,
            self.typed_prob,
        )

    def _worker_task(self, positions: np.ndarray, epoch: int, index: int) -> tuple[np.ndarray, int]:
        return self.nids[positions], self._batch_seed(epoch, index)

    def _client_for_workers(self) -> Any:
        return self.client

    def _worker_recipe(self) -> NodeBatchRecipe:
        return self._recipe


@dataclass
class NodeBatchRecipe:
    """What a node batch is made of (picklable: a loader worker builds batches from it)."""

    sampler: NeighborSampler
    node_feats: tuple[str, ...]
    labels: str | None
    carry_features: bool = False
    typed: bool = False
    typed_prob: Any = None

    async def build(
        self,
        aio: AsyncClient,
        seeds: np.ndarray,
        batch_seed: int,
        stats: LoaderStats,
        allocate: Allocate | None,
    ) -> MiniBatch:
        """``build_node_batch`` with this recipe (the loader workers' entry point)."""
        return await build_node_batch(aio, self, seeds, batch_seed, stats, allocate)


async def build_node_batch(
    aio: AsyncClient,
    recipe: NodeBatchRecipe,
    seeds: np.ndarray,
    batch_seed: int,
    stats: LoaderStats,
    allocate: Allocate | None = None,
) -> MiniBatch:
    """One batch of ``seeds``: blocks sampled with ``batch_seed``, features and labels pulled
    (into ``allocate``'s arrays when given; typed batches pull into arrays of their own)."""
    if recipe.typed:
        return await _build_hetero(aio, recipe, seeds, batch_seed, stats)
    s = await sample_and_pull(
        aio,
        recipe.sampler,
        seeds,
        batch_seed,
        stats,
        node_feats=recipe.node_feats,
        labels=recipe.labels,
        carry_features=recipe.carry_features,
        allocate=allocate,
    )
    return MiniBatch(
        torch.from_numpy(np.asarray(s.input_nodes)),
        torch.from_numpy(np.asarray(s.output_nodes)),
        s.blocks,
        sample_time=s.sample_time,
        pull_time=s.pull_time,
    )


async def _build_hetero(
    aio: AsyncClient, recipe: NodeBatchRecipe, seeds: np.ndarray, batch_seed: int, stats: LoaderStats
) -> MiniBatch:
    """Typed batch: ``input_nodes``/``seeds`` are dicts by node type, blocks HeteroBlocks."""
    types, per_type = aio.book.map_to_per_ntype(seeds)
    names = aio.book.ntypes
    seed_dict = {names[t]: per_type[types == t] for t in np.unique(types).tolist()}
    inputs, outputs, blocks, sample_time, pull_time = await sample_and_pull_hetero(
        aio,
        recipe.sampler,
        seed_dict,
        batch_seed,
        node_feats=recipe.node_feats,
        labels=recipe.labels,
        prob=recipe.typed_prob,
    )
    stats.sample += sample_time
    stats.pull += pull_time
    stats.input_nodes += sum(int(v.numel()) for v in inputs.values())
    typed: Any = {"input_nodes": inputs, "seeds": outputs, "blocks": blocks}  # dicts, HeteroBlocks
    return MiniBatch(**typed, sample_time=sample_time, pull_time=pull_time)
