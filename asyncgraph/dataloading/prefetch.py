"""The prefetch engine: batch k+1..k+prefetch are prepared while the model trains on batch k.

It knows nothing about graphs: a loader supplies ``_make_batch(positions, epoch, index)``, a
coroutine run on the client's event-loop thread, and the engine keeps ``prefetch`` of them in
flight. The training loop only waits when the next batch is not ready yet; that wait is
measured (``stats.wait``).

Every batch's randomness is keyed by (seed, epoch, batch index), so a loader gives the same
batches whatever its ``prefetch``. An exception raised while preparing a batch is re-raised in
the training loop when that batch is reached; ``break`` or the end of an epoch cancels every
batch still in flight, leaving no task or thread behind.

With ``device=`` each prepared batch is also packed and copied to that device in the background
(``dataloading/device.py``: pinned staging pool, side CUDA stream, an event the training loop's
stream waits on); the time spent is ``stats.copy``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from asyncgraph.client.loop_thread import EventLoopThread
from asyncgraph.dataloading.device import DeviceCopier, as_device
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.dataloading.workers import WorkerBatch, WorkerPool, WorkerPrefetcher, deliver

__all__ = ["DistDataLoader", "LoaderStats", "Prefetcher", "PrefetchingLoader"]

T = TypeVar("T")

_SEED_STRIDE = 1_000_003


def _feature_bytes(batch: Any) -> int:
    """Bytes of a batch's pulled tensors (its first block's ``srcdata``, its last's ``dstdata``)."""
    blocks = getattr(batch, "blocks", None)
    if not isinstance(blocks, list) or not blocks:
        return 0
    frames = [getattr(blocks[0], "srcdata", {}), getattr(blocks[-1], "dstdata", {})]
    return sum(
        int(t.numel() * t.element_size()) for f in frames for t in f.values() if isinstance(t, torch.Tensor)
    )


class Prefetcher(Generic[T]):
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

    def wait(self, future: concurrent.futures.Future[T]) -> T:
        """``future``'s batch (built on the client's event loop: only waited for here)."""
        return future.result()

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


class PrefetchingLoader(Generic[T]):
    """Epochs of batches built by ``_make_batch`` (subclasses), ``prefetch`` batches ahead.

    ``device`` (None: leave tensors where they are built) moves every batch there; ``overlap``
    chooses background copies (default) or synchronous ones in the training loop.
    """

    def __init__(
        self,
        loop: EventLoopThread,
        num_items: int,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        prefetch: int,
        seed: int | None,
        device: str | torch.device | None = None,
        overlap: bool = True,
        num_workers: int = 0,
        gather_threads: int = 1,
        worker_mode: str = "process",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
        if isinstance(gather_threads, bool) or not isinstance(gather_threads, int) or gather_threads < 1:
            raise ValueError(f"gather_threads must be an int >= 1, got {gather_threads!r}")
        if worker_mode not in ("process", "thread"):
            raise ValueError(f"worker_mode must be 'process' or 'thread', got {worker_mode!r}")
        self.num_workers = num_workers
        self.gather_threads = gather_threads
        self.worker_mode = worker_mode
        self._pool: WorkerPool | None = None
        self._epoch_key = 0
        self._loop = loop
        self._num_items = num_items
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.prefetch = prefetch
        self.seed = int(np.random.default_rng().integers(1 << 31)) if seed is None else int(seed)
        self.epoch = 0
        self.stats = LoaderStats()
        self.device = as_device(device)
        self.overlap = overlap
        self._copier = (
            None if self.device is None else DeviceCopier(self.device, slots=prefetch + 1, overlap=overlap)
        )

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

        copier = self._copier
        if copier is None:
            return count, make

        async def make_and_stage(i: int) -> Any:
            batch = await make(i)
            t0 = time.perf_counter()
            staged = await asyncio.to_thread(copier.stage, batch)
            self.stats.copy += time.perf_counter() - t0
            if copier.overlap:  # every tensor was copied into the staging buffer once more
                features = _feature_bytes(batch)
                self.stats.host_copy_bytes += features
                self.stats.structure_bytes += max(0, staged.packed - features)
            return staged

        return count, make_and_stage

    def _worker_recipe(self) -> Any:
        """What worker processes build batches from (loaders that support ``num_workers``)."""
        raise ValueError(f"{type(self).__name__} prepares batches on its event loop: use num_workers=0")

    def _worker_task(self, positions: np.ndarray, epoch: int, index: int) -> tuple[np.ndarray, int]:
        """A worker's task for batch ``index``: its seeds and batch seed."""
        raise NotImplementedError

    def _client_for_workers(self) -> Any:
        raise NotImplementedError

    def _worker_pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(
                self._client_for_workers(),
                self._worker_recipe(),
                self.num_workers,
                device=self.device,
                overlap=self.overlap,
                gather_threads=self.gather_threads,
                mode=self.worker_mode,
            )
        return self._pool

    def _start_epoch(self) -> tuple[int, Prefetcher[T] | WorkerPrefetcher]:
        """Fresh stats and a prefetcher over the next epoch's batches."""
        self.stats = LoaderStats(epoch=self.epoch)
        if self.num_workers > 0:
            pool = self._worker_pool()
            epoch = self.epoch
            self.epoch += 1
            order = self._order(epoch)
            bs = self.batch_size

            def task(i: int) -> tuple[np.ndarray, int]:
                return self._worker_task(order[i * bs : (i + 1) * bs], epoch, i)

            self._epoch_key += 1
            return len(self), WorkerPrefetcher(pool, task, self._epoch_key, len(self), self.prefetch)
        count, make = self._epoch_maker()
        return count, Prefetcher(self._loop, make, count, self.prefetch)

    def close(self) -> None:
        """Stop the worker processes, if any (also done when the loader is garbage collected)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()

    def _received(self, waited_since: float, result: Any) -> T:
        """Account the wait for ``result``; on a device, make it usable on the current stream."""
        self.stats.wait += time.perf_counter() - waited_since
        self.stats.batches += 1
        if isinstance(result, WorkerBatch):
            return deliver(result, self.stats, self.device, self.overlap)  # type: ignore[no-any-return]
        if self._copier is None:
            return result  # type: ignore[no-any-return]
        t0 = time.perf_counter()
        batch = self._copier.deliver(result)
        if not self._copier.overlap:
            self.stats.copy += time.perf_counter() - t0
        return batch  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[T]:
        count, prefetcher = self._start_epoch()
        try:
            for i in range(count):
                future = prefetcher.next_future(i)
                t0 = time.perf_counter()
                result = prefetcher.wait(future)  # type: ignore[arg-type]
                batch = self._received(t0, result)
                handed = time.perf_counter()
                yield batch
                self.stats.compute += time.perf_counter() - handed
        finally:
            prefetcher.cancel()

    async def __aiter__(self) -> AsyncIterator[T]:
        count, prefetcher = self._start_epoch()
        try:
            for i in range(count):
                future = prefetcher.next_future(i)
                t0 = time.perf_counter()
                if isinstance(prefetcher, WorkerPrefetcher):  # may read the workers' answers itself
                    result: Any = await asyncio.to_thread(prefetcher.wait, future)  # type: ignore[arg-type]
                else:
                    result = await asyncio.wrap_future(future)
                batch = self._received(t0, result)
                handed = time.perf_counter()
                yield batch
                self.stats.compute += time.perf_counter() - handed
        finally:
            await asyncio.to_thread(prefetcher.cancel)


class DistDataLoader(PrefetchingLoader[Any]):
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
        device: str | torch.device | None = None,
        overlap: bool = True,
    ) -> None:
        if loop is None:
            from asyncgraph.distributed.context import current_client

            client = current_client()
            loop = client.loop if client is not None else EventLoopThread("asyncgraph-dataloader")
        super().__init__(loop, len(dataset), batch_size, shuffle, drop_last, prefetch, seed, device, overlap)
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
        super().close()
        self._executor.shutdown(wait=True, cancel_futures=True)
