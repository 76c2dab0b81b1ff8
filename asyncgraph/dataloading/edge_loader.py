"""Edge-wise mini-batches for link prediction: edge pairs, negative pairs and their blocks."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.dataloading.fetch import (
    AUTO,
    Allocate,
    Auto,
    client_of,
    mask_or_ids,
    node_tensor_names,
    sample_and_pull,
)
from asyncgraph.dataloading.frames import Frame, GraphOps
from asyncgraph.dataloading.hetero_edge_loader import (
    TypedEdgeSeeds,
    build_typed_batch,
    excluded,
    typed_edge_seeds,
    typed_prob,
)
from asyncgraph.dataloading.hetero_pair import HeteroPairGraph
from asyncgraph.dataloading.negative import NegativeSampler
from asyncgraph.dataloading.prefetch import PrefetchingLoader
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.distributed.edge_ids import attach_edge_ids
from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.book import as_id_array

__all__ = ["DistEdgeDataLoader", "EdgeBatchRecipe", "EdgeMiniBatch", "PairGraph"]


@dataclass
class PairGraph(GraphOps):
    """Node pairs of an edge batch: ``src``/``dst`` index ``nodes`` (the batch's seeds).

    ``nodes[src[i]]``, ``nodes[dst[i]]`` are pair ``i``'s global endpoints; ``eids`` holds the
    positive pairs' global edge IDs (empty for negative pairs). As DGL's pair graphs it has
    ``ndata`` (one row per node; ``ndata[dgl.NID]`` = ``nodes``), ``edata`` (``edata[dgl.EID]`` =
    ``eids`` for positive pairs), ``local_scope()``, ``apply_edges(fn.u_dot_v(...))`` and ``to``.
    """

    src: torch.Tensor  # int64 local indices into nodes
    dst: torch.Tensor  # int64 local indices into nodes
    nodes: torch.Tensor  # int64 global IDs == blocks[-1].dstnodes
    eids: torch.Tensor  # int64 global edge IDs of positive pairs, or empty
    ndata: dict[str, torch.Tensor] = field(default_factory=dict)
    edata: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ndata = Frame(self.ndata, self.nodes)
        self.edata = Frame(self.edata, self.eids if self.eids.numel() == self.src.numel() else None)

    def num_nodes(self, ntype: str | None = None) -> int:
        """Number of nodes (the batch's seeds)."""
        return int(self.nodes.shape[0])

    def num_edges(self, etype: Any = None) -> int:
        """Number of pairs."""
        return int(self.src.shape[0])

    number_of_nodes = num_nodes
    number_of_edges = num_edges

    @property
    def srcdata(self) -> dict[str, torch.Tensor]:
        return self.ndata

    @property
    def dstdata(self) -> dict[str, torch.Tensor]:
        return self.ndata

    def edges(self, form: str = "uv") -> tuple[torch.Tensor, ...]:
        """Local ``(src, dst)``, like DGL's ``graph.edges()`` (``form="all"`` adds positions)."""
        if form == "all":
            return self.src, self.dst, torch.arange(self.src.numel(), device=self.src.device)
        return self.src, self.dst

    def global_edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Global ``(src, dst)`` node IDs of the pairs."""
        return self.nodes[self.src], self.nodes[self.dst]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PairGraph:
        """A copy with every tensor on ``device``."""

        def mv(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        return PairGraph(
            mv(self.src),
            mv(self.dst),
            mv(self.nodes),
            mv(self.eids),
            {k: mv(v) for k, v in self.ndata.items()},
            {k: mv(v) for k, v in self.edata.items()},
        )

    # GraphOps: local_scope, local_var, apply_edges, update_all
    def _endpoints(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.src, self.dst

    def _num_dst(self) -> int:
        return self.num_nodes()

    def _src_frame(self) -> Frame:
        return self.ndata  # type: ignore[return-value]

    def _dst_frame(self) -> Frame:
        return self.ndata  # type: ignore[return-value]

    def _edge_frame(self) -> Frame:
        return self.edata  # type: ignore[return-value]

    def _frames(self) -> tuple[Frame, ...]:
        return self._src_frame(), self._edge_frame()

    def _set_frames(self, frames: tuple[Frame, ...]) -> None:
        self.ndata, self.edata = frames


@dataclass
class EdgeMiniBatch:
    """One edge batch: unpacks to ``(input_nodes, pair_graph, neg_pair_graph, blocks)`` like DGL.

    Without a negative sampler it unpacks to ``(input_nodes, pair_graph, blocks)``.
    """

    input_nodes: Any  # a tensor; {ntype: tensor} for a batch of typed edges
    pair_graph: PairGraph | HeteroPairGraph
    neg_pair_graph: PairGraph | HeteroPairGraph | None
    blocks: list[Any]  # Blocks; HeteroBlocks for a batch of typed edges
    sample_time: float = 0.0
    pull_time: float = 0.0

    @property
    def seeds(self) -> Any:
        """The unique endpoints of every pair (== ``blocks[-1].dstnodes``; by type when typed)."""
        if isinstance(self.pair_graph, HeteroPairGraph):
            return self.pair_graph.nodes_of
        return self.pair_graph.nodes

    def __iter__(self) -> Iterator[Any]:
        if self.neg_pair_graph is None:
            return iter((self.input_nodes, self.pair_graph, self.blocks))
        return iter((self.input_nodes, self.pair_graph, self.neg_pair_graph, self.blocks))


_NEG_STREAM = 0x6E65675F  # keys the negative sampler's generator apart from the sampling seeds


class DistEdgeDataLoader(PrefetchingLoader[EdgeMiniBatch]):
    """Mini-batches of edges for link prediction (DGL's ``DistEdgeDataLoader``).

    Per batch: the edges' endpoints are found, negative pairs added by ``negative_sampler``, the
    unique endpoints become the seeds whose blocks ``sampler`` samples (with ``exclude="self"``
    the batch's own edges are dropped from every block; with ``exclude="reverse_id"`` their
    reverses ``reverse_eids[eids]`` too, as DGL's), and ``node_feats`` are pulled into
    ``blocks[0].srcdata``. Yields ``EdgeMiniBatch`` objects, on ``device`` when given (copied in
    the background unless ``overlap=False``).

    Heterogeneous graphs take ``eids={etype: per-type IDs or mask}`` as DGL's: batches mix types;
    pair graphs are ``HeteroPairGraph`` (pairs per relation, ``edges[etype].data[dgl.EID]`` the
    per-type IDs), negatives are drawn per relation over its destination type, blocks are
    ``HeteroBlock``; ``exclude`` is ``"self"``, ``"reverse_id"`` with ``reverse_eids={etype:
    reverse per-type IDs}`` or ``"reverse_types"`` with ``reverse_etypes={etype: reverse etype}``
    (see ``asyncgraph.dataloading.hetero_edge_loader``).

    ``num_workers``, ``gather_threads`` and ``worker_mode`` as ``DistNodeDataLoader``'s: batches
    are built in worker processes, their feature rows gathered once into shared slots; the
    results equal ``num_workers=0``'s.
    """

    def __init__(
        self,
        g: Any,
        eids: Any,
        sampler: NeighborSampler,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        prefetch: int = 2,
        negative_sampler: NegativeSampler | None = None,
        exclude: str | None = None,
        node_feats: Sequence[str] | Auto = AUTO,
        seed: int | None = None,
        device: str | torch.device | None = None,
        overlap: bool = True,
        reverse_eids: Any = None,
        reverse_etypes: Any = None,
        num_workers: int = 0,
        gather_threads: int = 1,
        worker_mode: str = "process",
    ) -> None:
        client = client_of(g)
        typed = isinstance(eids, Mapping)
        allowed = (None, "self", "reverse_id") + (("reverse_types",) if typed else ())
        if exclude not in allowed:
            raise InvalidRequestError(f"exclude must be one of {allowed}, got {exclude!r}")
        self.reverse_eids: np.ndarray | None = None
        self.typed: TypedEdgeSeeds | None = None
        if typed:  # {etype: per-type edge IDs}: mapped to homogeneous IDs once, here
            self.typed = typed_edge_seeds(
                attach_edge_ids(client), eids, exclude, reverse_eids, reverse_etypes
            )
        elif exclude == "reverse_id":  # DGL's: drop the batch's edges and their reverses
            if reverse_eids is None:
                raise InvalidRequestError(
                    "exclude='reverse_id' needs reverse_eids (the reverse of every edge ID)"
                )
            rev = as_id_array(mask_or_ids(reverse_eids), "reverse_eids")
            if rev.size != client.book.num_edges:
                raise InvalidRequestError(
                    f"reverse_eids must hold one edge ID per edge ({client.book.num_edges}), got {rev.size}"
                )
            client.book.owner(rev, "edge")
            self.reverse_eids = rev
        if self.typed is not None:
            self.eids = self.typed.homo
        else:
            self.eids = as_id_array(mask_or_ids(eids), "eids")
            client.book.owner(self.eids, "edge")  # OutOfRangeError now rather than mid-epoch
        super().__init__(
            client.loop,
            self.eids.size,
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
        self.negative_sampler = negative_sampler
        self.exclude = exclude
        self.node_feats, _ = node_tensor_names(client, node_feats, None)
        self.typed_prob = typed_prob(g, client.book, getattr(sampler, "prob", None))
        self._recipe = EdgeBatchRecipe(
            sampler,
            negative_sampler,
            exclude,
            self.reverse_eids,
            self.node_feats,
            self.typed,
            self.typed_prob,
        )
        if num_workers > 0:  # they start now, while the caller sets up its model
            self._worker_pool()

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[EdgeMiniBatch]:
        seeds, batch_seed = self._worker_task(positions, epoch, index)
        return self._recipe.build(self.async_client, seeds, batch_seed, self.stats, None)

    def _worker_task(self, positions: np.ndarray, epoch: int, index: int) -> tuple[np.ndarray, int]:
        """Typed batches are named by their positions in the typed seed arrays, others by eids."""
        return (positions if self.typed is not None else self.eids[positions]), self._batch_seed(epoch, index)

    def _client_for_workers(self) -> Any:
        return self.client

    def _worker_recipe(self) -> EdgeBatchRecipe:
        return self._recipe


@dataclass
class EdgeBatchRecipe:
    """What an edge batch is made of (picklable: a loader worker builds batches from it)."""

    sampler: NeighborSampler
    negative_sampler: NegativeSampler | None
    exclude: str | None
    reverse_eids: np.ndarray | None
    node_feats: tuple[str, ...]
    typed: TypedEdgeSeeds | None
    typed_prob: Any

    def _excluded(self, eids: np.ndarray) -> np.ndarray | None:
        """Edge IDs no block of this batch may contain."""
        if self.exclude == "self":
            return eids
        if self.reverse_eids is not None:
            return np.union1d(eids, self.reverse_eids[eids])
        return None

    async def build(
        self,
        aio: AsyncClient,
        seeds: np.ndarray,
        batch_seed: int,
        stats: LoaderStats,
        allocate: Allocate | None,
    ) -> EdgeMiniBatch:
        """The batch of edge IDs ``seeds`` (typed: positions in the typed seed arrays)."""
        if self.typed is not None:
            return await self._build_typed(aio, seeds, batch_seed, stats)
        return await self._build(aio, seeds, batch_seed, stats, allocate)

    async def _build_typed(
        self, aio: AsyncClient, positions: np.ndarray, batch_seed: int, stats: LoaderStats
    ) -> EdgeMiniBatch:
        assert self.typed is not None
        rng = np.random.default_rng([batch_seed, _NEG_STREAM])
        inputs, pair, neg, blocks, t_sample, t_pull = await build_typed_batch(
            aio,
            self.typed,
            positions,
            self.sampler,
            self.negative_sampler,
            rng,
            batch_seed,
            self.node_feats,
            excluded(self.typed, self.exclude, positions),
            self.typed_prob,
        )
        stats.sample += t_sample
        stats.pull += t_pull
        return EdgeMiniBatch(inputs, pair, neg, blocks, sample_time=t_sample, pull_time=t_pull)

    async def _build(
        self,
        aio: AsyncClient,
        eids: np.ndarray,
        batch_seed: int,
        stats: LoaderStats,
        allocate: Allocate | None,
    ) -> EdgeMiniBatch:
        t0 = time.perf_counter()
        pos_src, pos_dst = await aio.find_edges(eids)
        ends = [pos_src, pos_dst]
        if self.negative_sampler is not None:
            rng = np.random.default_rng([batch_seed, _NEG_STREAM])
            neg_src, neg_dst = self.negative_sampler.generate(pos_src, aio.book.num_nodes, rng)
            ends += [np.asarray(neg_src, dtype=np.int64), np.asarray(neg_dst, dtype=np.int64)]
        seeds, inverse = np.unique(np.concatenate(ends), return_inverse=True)
        local = np.split(inverse.reshape(-1), np.cumsum([a.size for a in ends])[:-1])
        s = await sample_and_pull(
            aio,
            self.sampler,
            seeds,
            batch_seed,
            stats,
            node_feats=self.node_feats,
            exclude=self._excluded(eids),
            started=t0,
            allocate=allocate,
        )
        nodes = torch.from_numpy(np.asarray(s.output_nodes))
        pair = PairGraph(
            torch.from_numpy(local[0]), torch.from_numpy(local[1]), nodes, torch.from_numpy(eids.copy())
        )
        neg = None
        if self.negative_sampler is not None:
            empty = torch.empty(0, dtype=torch.int64)
            neg = PairGraph(torch.from_numpy(local[2]), torch.from_numpy(local[3]), nodes, empty)
        return EdgeMiniBatch(
            torch.from_numpy(np.asarray(s.input_nodes)),
            pair,
            neg,
            s.blocks,
            sample_time=s.sample_time,
            pull_time=s.pull_time,
        )
