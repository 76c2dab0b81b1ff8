"""Prefetching dataloaders: batch k+1..k+prefetch are prepared while the model trains on batch k.

Batches are built as coroutines on the client's event-loop thread: sampling requests go to all
servers concurrently, then input features and labels are pulled concurrently. The training loop
only waits when the next batch is not ready yet; that wait is measured (``stats.wait``).

Every batch's randomness is keyed by (seed, epoch, batch index), so a loader gives the same
batches whatever its ``prefetch``. An exception raised while preparing a batch is re-raised in
the training loop when that batch is reached; ``break`` or the end of an epoch cancels every
batch still in flight, leaving no task or thread behind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.client.sync_client import Client, EventLoopThread
from asyncgraph.dataloading.block import Block
from asyncgraph.dataloading.negative import NegativeSampler
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.book import as_id_array

T = TypeVar("T")

_SEED_STRIDE = 1_000_003


@dataclass
class LoaderStats:
    """Seconds spent per phase over an epoch (sample and pull run in the background)."""

    batches: int = 0
    sample: float = 0.0
    pull: float = 0.0
    wait: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"batches": self.batches, "sample": self.sample, "pull": self.pull, "wait": self.wait}


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


class _Prefetcher(Generic[T]):
    """Runs ``make(i)`` for batch indices on the loop thread, keeping ``depth`` ahead."""

    def __init__(
        self, loop: EventLoopThread, make: Callable[[int], Awaitable[T]], count: int, depth: int
    ) -> None:
        self._loop = loop
        self._make = make
        self._count = count
        self._depth = max(0, depth)
        self._next_submit = 0
        self._pending: deque[concurrent.futures.Future[T]] = deque()
        self._tasks: set[asyncio.Task[Any]] = set()  # touched on the loop thread only

    def _submit_until(self, upto: int) -> None:
        while self._next_submit < min(upto, self._count):
            index = self._next_submit

            async def run(i: int = index) -> T:
                task = asyncio.current_task()
                if task is not None:
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                return await self._make(i)

            self._pending.append(asyncio.run_coroutine_threadsafe(run(), self._loop.loop))
            self._next_submit += 1

    def next_future(self, index: int) -> concurrent.futures.Future[T]:
        """The future of batch ``index`` (the next one), with ``depth`` more submitted behind it."""
        self._submit_until(index + 1 + self._depth)
        return self._pending.popleft()

    def cancel(self) -> None:
        """Cancel every batch in flight and wait until their tasks have unwound."""
        if not self._pending:
            return
        while self._pending:
            self._pending.popleft().cancel()

        async def drain() -> None:
            # cancellations were queued on the loop before this coroutine, so every task of
            # ours has either finished or received its CancelledError by now
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

        if not self._loop.loop.is_closed():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(drain(), self._loop.loop).result(timeout=30)


class _PrefetchingLoader(Generic[T]):
    """Shared epoch machinery for the loaders below."""

    def __init__(
        self,
        loop: EventLoopThread,
        num_items: int,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        prefetch: int,
        seed: int | None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        self._loop = loop
        self._num_items = num_items
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.prefetch = prefetch
        self.seed = int(np.random.default_rng().integers(1 << 31)) if seed is None else int(seed)
        self.epoch = 0
        self.stats = LoaderStats()
        self._prefetcher: _Prefetcher[T] | None = None

    def __len__(self) -> int:
        if self.drop_last:
            return self._num_items // self.batch_size
        return -(-self._num_items // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order and sampling to reproduce (advanced automatically)."""
        self.epoch = epoch

    def _order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(self._num_items)
        return np.arange(self._num_items)

    def _batch_seed(self, epoch: int, index: int) -> int:
        return (self.seed * _SEED_STRIDE + epoch * 65_537 + index) % (1 << 62)

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[T]:
        raise NotImplementedError

    def _epoch_maker(self) -> tuple[int, Callable[[int], Awaitable[T]]]:
        epoch = self.epoch
        self.epoch += 1
        order = self._order(epoch)
        count = len(self)
        bs = self.batch_size

        def make(i: int) -> Awaitable[T]:
            return self._make_batch(order[i * bs : (i + 1) * bs], epoch, i)

        return count, make

    def __iter__(self) -> Iterator[T]:
        self.stats = LoaderStats()
        count, make = self._epoch_maker()
        prefetcher = _Prefetcher(self._loop, make, count, self.prefetch)
        try:
            for i in range(count):
                future = prefetcher.next_future(i)
                t0 = time.perf_counter()
                result = future.result()
                self.stats.wait += time.perf_counter() - t0
                self.stats.batches += 1
                yield result
        finally:
            prefetcher.cancel()

    async def __aiter__(self) -> AsyncIterator[T]:
        self.stats = LoaderStats()
        count, make = self._epoch_maker()
        prefetcher = _Prefetcher(self._loop, make, count, self.prefetch)
        try:
            for i in range(count):
                future = prefetcher.next_future(i)
                t0 = time.perf_counter()
                result = await asyncio.wrap_future(future)
                self.stats.wait += time.perf_counter() - t0
                self.stats.batches += 1
                yield result
        finally:
            await asyncio.to_thread(prefetcher.cancel)


def _client_of(graph: Any) -> Client:
    client = getattr(graph, "client", graph)
    if not isinstance(client, Client):
        raise TypeError(f"expected a DistGraph or Client, got {type(graph).__name__}")
    return client


class DistNodeDataLoader(_PrefetchingLoader[MiniBatch]):
    """Mini-batches of seed nodes with sampled blocks, input features and labels.

    Yields ``MiniBatch`` objects that unpack to ``(input_nodes, seeds, blocks)``; features are in
    ``blocks[0].srcdata[name]`` and labels in ``blocks[-1].dstdata["label"]``.
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
        node_feats: Sequence[str] = ("feat",),
        labels: str | None = "label",
        seed: int | None = None,
    ) -> None:
        client = _client_of(g)
        ids = nids.detach().cpu().numpy() if isinstance(nids, torch.Tensor) else np.asarray(nids)
        if ids.dtype == bool:
            ids = np.flatnonzero(ids)
        self.nids = ids.astype(np.int64, copy=False)
        super().__init__(client.loop, self.nids.size, batch_size, shuffle, drop_last, prefetch, seed)
        self.client = client
        self.aio: AsyncClient = client.aio
        self.sampler = sampler
        self.node_feats = tuple(node_feats)
        self.labels = labels

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[MiniBatch]:
        return self._build(self.nids[positions], self._batch_seed(epoch, index))

    async def _build(self, seeds: np.ndarray, batch_seed: int) -> MiniBatch:
        aio = self.aio
        layer = 0
        replace = self.sampler.replace

        async def sample_fn(
            layer_seeds: np.ndarray, fanout: int
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            nonlocal layer
            layer += 1
            return await aio.sample_neighbors(
                layer_seeds, fanout, replace=replace, seed=batch_seed * 8 + layer
            )

        t0 = time.perf_counter()
        input_nodes, output_nodes, blocks = await self.sampler.sample_blocks(sample_fn, seeds)
        for block in blocks:  # the CSR aggregation layers use, built here rather than in training
            block.csr()
        t1 = time.perf_counter()
        names = [f"node:{name}" for name in self.node_feats]
        pulls = [aio.pull(name, input_nodes) for name in names]
        if self.labels is not None:
            pulls.append(aio.pull(f"node:{self.labels}", output_nodes))
        tensors = await asyncio.gather(*pulls)
        t2 = time.perf_counter()
        for name, tensor in zip(self.node_feats, tensors, strict=False):
            blocks[0].srcdata[name] = tensor
        if self.labels is not None:
            blocks[-1].dstdata[self.labels] = tensors[-1]
        self.stats.sample += t1 - t0
        self.stats.pull += t2 - t1
        return MiniBatch(
            torch.from_numpy(np.asarray(input_nodes)),
            torch.from_numpy(np.asarray(output_nodes)),
            blocks,
            sample_time=t1 - t0,
            pull_time=t2 - t1,
        )


class DistDataLoader(_PrefetchingLoader[Any]):
    """DGL's low-level loader: batches of dataset items through ``collate_fn``, prefetched.

    A plain ``collate_fn`` runs on a worker thread (it may call the blocking client API); an
    ``async def`` collate_fn runs on the client's event loop and may await the async client.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        collate_fn: Callable[[Any], Any] | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        prefetch: int = 2,
        seed: int | None = None,
        loop: EventLoopThread | None = None,
    ) -> None:
        if loop is None:
            from asyncgraph.distributed.context import _STATE

            loop = (
                _STATE.client.loop if _STATE.client is not None else EventLoopThread("asyncgraph-dataloader")
            )
        super().__init__(loop, len(dataset), batch_size, shuffle, drop_last, prefetch, seed)
        self.dataset = dataset
        self.collate_fn = collate_fn
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, prefetch), thread_name_prefix="asyncgraph-collate"
        )

    def _items(self, positions: np.ndarray) -> Any:
        data = self.dataset
        if isinstance(data, torch.Tensor):
            return data[torch.from_numpy(positions)]
        if isinstance(data, np.ndarray):
            return data[positions]
        return [data[int(i)] for i in positions]

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[Any]:
        return self._collate(self._items(positions))

    async def _collate(self, items: Any) -> Any:
        fn = self.collate_fn
        if fn is None:
            return items
        if inspect.iscoroutinefunction(fn):
            return await fn(items)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, items)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


@dataclass
class PairGraph:
    """Node pairs of an edge batch: ``src``/``dst`` index ``nodes`` (the batch's seeds).

    ``nodes[src[i]]``, ``nodes[dst[i]]`` are pair ``i``'s global endpoints; ``eids`` holds the
    positive pairs' global edge IDs (empty for negative pairs).
    """

    src: torch.Tensor  # int64 local indices into nodes
    dst: torch.Tensor  # int64 local indices into nodes
    nodes: torch.Tensor  # int64 global IDs == blocks[-1].dstnodes
    eids: torch.Tensor  # int64 global edge IDs of positive pairs, or empty

    @property
    def num_nodes(self) -> int:
        """Number of nodes (the batch's seeds)."""
        return int(self.nodes.shape[0])

    @property
    def num_edges(self) -> int:
        """Number of pairs."""
        return int(self.src.shape[0])

    def edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Local ``(src, dst)``, like DGL's ``graph.edges()``."""
        return self.src, self.dst

    def global_edges(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Global ``(src, dst)`` node IDs of the pairs."""
        return self.nodes[self.src], self.nodes[self.dst]


@dataclass
class EdgeMiniBatch:
    """One edge batch: unpacks to ``(input_nodes, pair_graph, neg_pair_graph, blocks)`` like DGL.

    Without a negative sampler it unpacks to ``(input_nodes, pair_graph, blocks)``.
    """

    input_nodes: torch.Tensor
    pair_graph: PairGraph
    neg_pair_graph: PairGraph | None
    blocks: list[Block]
    sample_time: float = 0.0
    pull_time: float = 0.0

    @property
    def seeds(self) -> torch.Tensor:
        """The unique endpoints of every pair (== ``blocks[-1].dstnodes``)."""
        return self.pair_graph.nodes

    def __iter__(self) -> Iterator[Any]:
        if self.neg_pair_graph is None:
            return iter((self.input_nodes, self.pair_graph, self.blocks))
        return iter((self.input_nodes, self.pair_graph, self.neg_pair_graph, self.blocks))


_NEG_STREAM = 0x6E65675F  # keys the negative sampler's generator apart from the sampling seeds


class DistEdgeDataLoader(_PrefetchingLoader[EdgeMiniBatch]):
    """Mini-batches of edges for link prediction (DGL's ``DistEdgeDataLoader``).

    Per batch: the edges' endpoints are found, negative pairs added by ``negative_sampler``, the
    unique endpoints become the seeds whose blocks ``sampler`` samples (with ``exclude="self"``
    the batch's own edges are dropped from every block), and ``node_feats`` are pulled into
    ``blocks[0].srcdata``. Yields ``EdgeMiniBatch`` objects.
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
        node_feats: Sequence[str] = ("feat",),
        seed: int | None = None,
    ) -> None:
        client = _client_of(g)
        if exclude not in (None, "self"):
            raise InvalidRequestError(f"exclude must be None or 'self', got {exclude!r}")
        ids = eids.detach().cpu().numpy() if isinstance(eids, torch.Tensor) else np.asarray(eids)
        if ids.dtype == bool:
            ids = np.flatnonzero(ids)
        self.eids = as_id_array(ids, "eids")
        client.book.owner(self.eids, "edge")  # OutOfRangeError now rather than mid-epoch
        super().__init__(client.loop, self.eids.size, batch_size, shuffle, drop_last, prefetch, seed)
        self.client = client
        self.aio: AsyncClient = client.aio
        self.sampler = sampler
        self.negative_sampler = negative_sampler
        self.exclude = exclude
        self.node_feats = tuple(node_feats)

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[EdgeMiniBatch]:
        return self._build(self.eids[positions], self._batch_seed(epoch, index))

    async def _build(self, eids: np.ndarray, batch_seed: int) -> EdgeMiniBatch:
        aio = self.aio
        layer = 0
        replace = self.sampler.replace
        exclude = eids if self.exclude == "self" else None

        async def sample_fn(
            layer_seeds: np.ndarray, fanout: int
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            nonlocal layer
            layer += 1
            src, dst, sampled = await aio.sample_neighbors(
                layer_seeds, fanout, replace=replace, seed=batch_seed * 8 + layer
            )
            if exclude is not None and sampled.size:
                keep = ~np.isin(sampled, exclude)
                src, dst, sampled = src[keep], dst[keep], sampled[keep]
            return src, dst, sampled

        t0 = time.perf_counter()
        pos_src, pos_dst = await aio.find_edges(eids)
        ends = [pos_src, pos_dst]
        if self.negative_sampler is not None:
            rng = np.random.default_rng([batch_seed, _NEG_STREAM])
            neg_src, neg_dst = self.negative_sampler.generate(pos_src, aio.book.num_nodes, rng)
            ends += [np.asarray(neg_src, dtype=np.int64), np.asarray(neg_dst, dtype=np.int64)]
        seeds, inverse = np.unique(np.concatenate(ends), return_inverse=True)
        local = np.split(inverse.reshape(-1), np.cumsum([a.size for a in ends])[:-1])
        input_nodes, output_nodes, blocks = await self.sampler.sample_blocks(sample_fn, seeds)
        for block in blocks:  # the CSR aggregation layers use, built here rather than in training
            block.csr()
        t1 = time.perf_counter()
        names = [f"node:{name}" for name in self.node_feats]
        tensors = await asyncio.gather(*(aio.pull(name, input_nodes) for name in names))
        t2 = time.perf_counter()
        for name, tensor in zip(self.node_feats, tensors, strict=True):
            blocks[0].srcdata[name] = tensor
        self.stats.sample += t1 - t0
        self.stats.pull += t2 - t1
        nodes = torch.from_numpy(np.asarray(output_nodes))
        pair = PairGraph(
            torch.from_numpy(local[0]), torch.from_numpy(local[1]), nodes, torch.from_numpy(eids.copy())
        )
        neg = None
        if self.negative_sampler is not None:
            empty = torch.empty(0, dtype=torch.int64)
            neg = PairGraph(torch.from_numpy(local[2]), torch.from_numpy(local[3]), nodes, empty)
        return EdgeMiniBatch(
            torch.from_numpy(np.asarray(input_nodes)),
            pair,
            neg,
            blocks,
            sample_time=t1 - t0,
            pull_time=t2 - t1,
        )
