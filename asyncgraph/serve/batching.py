"""Dynamic batching (Triton's idea): concurrent requests merged into one sample and one forward.

A batch is cut when a batch slot is free (``in_flight`` batches run at once: one sampling while
another computes) and either ``max_batch`` nodes are queued or its oldest request has waited
``max_delay`` seconds while the process is busy (a batch runs, or ran when that request
came), or ``idle_delay`` (default 0) while it is not: waiting for company pays only
while the process is busy; idle, it would only add latency.
More than ``queue_limit`` queued nodes refuses a request at once (``OverloadedError``) rather
than letting latency grow without bound. Each request has a deadline: a queued request past it
is dropped before it is sampled, and its caller gets ``RequestTimeoutError``; a batch that
fails (a server lost mid-batch) fails its requests with that typed error. A request with a run
of its own (``submit_own``: an inductive request's new nodes) is a batch alone, under the same
queue limit, slots and deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from asyncgraph.errors import (
    AsyncGraphError,
    InvalidRequestError,
    OverloadedError,
    RequestTimeoutError,
    ServerUnavailableError,
)
from asyncgraph.serve.core import BatchTimes
from asyncgraph.serve.metrics import ServeMetrics

__all__ = ["BatchOptions", "DynamicBatcher", "RunBatch", "RunOwn"]

#: ``(distinct sorted node IDs, times to fill) -> output rows in that order``
RunBatch = Callable[[np.ndarray, BatchTimes], Awaitable[torch.Tensor]]
#: a request's own batch: ``times to fill -> its output rows``
RunOwn = Callable[[BatchTimes], Awaitable[torch.Tensor]]


@dataclass(frozen=True)
class BatchOptions:
    """The batcher's bounds (the serve CLI's ``--max-batch`` etc.)."""

    max_batch: int = 256
    max_delay: float = 0.002
    idle_delay: float = 0.0
    queue_limit: int = 4096
    in_flight: int = 2
    deadline: float = 1.0

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.queue_limit < 1 or self.in_flight < 1:
            raise ValueError("max_batch, queue_limit and in_flight must be at least 1")
        if self.max_delay < 0 or self.idle_delay < 0 or self.deadline <= 0:
            raise ValueError("max_delay and idle_delay must be >= 0 and deadline > 0")


@dataclass
class _Pending:
    nodes: np.ndarray
    future: asyncio.Future[torch.Tensor]
    enqueued: float
    deadline: float
    dropped: bool = False
    started: float = field(default=0.0)
    run: RunOwn | None = None  # set: a batch of its own (not merged)
    timer: asyncio.TimerHandle | None = None  # the deadline's


def _expire(item: _Pending, wait: float) -> None:
    """The request's deadline passed: its caller gets ``RequestTimeoutError``; a batch that has
    not started skips it, one that has leaves its rows unread."""
    item.dropped = True
    if not item.future.done():
        item.future.set_exception(
            RequestTimeoutError(f"no answer within the request's deadline ({wait * 1e3:.0f} ms)")
        )


class DynamicBatcher:
    """Queues requests and runs them in merged batches through ``run``."""

    def __init__(self, run: RunBatch, options: BatchOptions, metrics: ServeMetrics | None = None) -> None:
        self._run = run
        self.options = options
        self.metrics = metrics or ServeMetrics()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_nodes = 0
        self._arrived = asyncio.Event()
        self._slots = asyncio.Semaphore(options.in_flight)
        self._batches: set[asyncio.Task[None]] = set()
        self._closing = False
        self._cutter: asyncio.Task[None] | None = None
        self._last_end = float("-inf")  # perf_counter() when the last batch ended

    def start(self) -> None:
        """Start cutting batches (on the running loop)."""
        if self._cutter is None:
            self._cutter = asyncio.get_running_loop().create_task(self._cut_batches())

    @property
    def queued_nodes(self) -> int:
        return self._queued_nodes

    async def submit(self, nodes: np.ndarray, timeout: float | None = None) -> torch.Tensor:
        """The output rows for ``nodes`` (any order, repeats allowed), within ``timeout`` seconds
        (at most the batcher's deadline)."""
        return await self._enqueue(nodes, timeout, None)

    async def submit_own(self, count: int, run: RunOwn, timeout: float | None = None) -> torch.Tensor:
        """``run``'s rows for a request of ``count`` nodes, run as a batch of its own when a
        slot is free, under the queue limit and deadline of every request."""
        return await self._enqueue(np.zeros(count, dtype=np.int64), timeout, run)

    def submit_nowait(self, nodes: np.ndarray, timeout: float | None = None) -> asyncio.Future[torch.Tensor]:
        """``submit`` without a coroutine: the future of the rows (typed errors at once, or set
        on it), for callers that answer from a callback (the msgpack port: no task per request)."""
        return self._put(nodes, timeout, None).future

    async def _enqueue(self, nodes: np.ndarray, timeout: float | None, run: RunOwn | None) -> torch.Tensor:
        item = self._put(nodes, timeout, run)
        try:
            return await item.future
        finally:  # a caller cancelled meanwhile cancels the future, which the batch then skips
            assert item.timer is not None
            item.timer.cancel()

    def _put(self, nodes: np.ndarray, timeout: float | None, run: RunOwn | None) -> _Pending:
        if self._closing:
            raise ServerUnavailableError("the serving process is draining (SIGTERM): send to another")
        opts = self.options
        if nodes.size > opts.queue_limit:
            raise InvalidRequestError(
                f"a request may name at most {opts.queue_limit} nodes (the queue limit), got {nodes.size}"
            )
        if self._queued_nodes + nodes.size > opts.queue_limit:
            raise OverloadedError(
                f"queue full: {self._queued_nodes} nodes waiting, limit {opts.queue_limit}; retry later"
            )
        wait = opts.deadline if timeout is None else min(max(timeout, 0.0), opts.deadline)
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        item = _Pending(nodes, loop.create_future(), now, now + wait, run=run)
        self._queue.append(item)
        self._queued_nodes += nodes.size
        self._arrived.set()
        # A timer, not wait_for(shield()): two tasks and futures fewer per request
        item.timer = loop.call_later(wait, _expire, item, wait)
        return item

    async def _cut_batches(self) -> None:
        opts = self.options
        while True:
            await self._slots.acquire()
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            # busy: a batch runs, or the oldest request came while one ran (with one batch in
            # flight the next is always cut after the last has ended)
            busy = bool(self._batches) or self._queue[0].enqueued <= self._last_end
            delay = opts.max_delay if busy else opts.idle_delay
            cut_at = self._queue[0].enqueued + delay
            while (
                self._queue
                and self._queue[0].run is None  # a request of its own waits for no company
                and self._queued_nodes < opts.max_batch
                and (left := cut_at - time.perf_counter()) > 0
            ):
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), left)
            batch: list[_Pending] = []
            size = 0
            while self._queue and (
                not batch
                or (
                    batch[0].run is None
                    and self._queue[0].run is None
                    and size + self._queue[0].nodes.size <= opts.max_batch
                )
            ):
                item = self._queue.popleft()
                self._queued_nodes -= item.nodes.size
                if item.dropped or item.future.done():
                    continue
                batch.append(item)
                size += item.nodes.size
            if not batch:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._run_batch(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _run_batch(self, batch: list[_Pending]) -> None:
        start = time.perf_counter()
        times = BatchTimes()
        try:
            for item in batch:
                self.metrics.observe_stage("queue", start - item.enqueued)
            budget = max(item.deadline for item in batch) - start
            own = batch[0].run
            if own is not None:
                self.metrics.batch_nodes.observe(batch[0].nodes.size)
                self.metrics.batch_requests.observe(1)
                rows = await asyncio.wait_for(own(times), max(budget, 0.0))
            else:
                nodes = np.concatenate([item.nodes for item in batch])
                seeds, inverse = np.unique(nodes, return_inverse=True)
                self.metrics.batch_nodes.observe(seeds.size)
                self.metrics.batch_requests.observe(len(batch))
                out = await asyncio.wait_for(self._run(seeds, times), max(budget, 0.0))
                inverse = inverse.reshape(-1)
                if inverse.size != seeds.size or (inverse[1:] <= inverse[:-1]).any():  # else in order
                    out = torch.index_select(out, 0, torch.from_numpy(inverse))
                rows = out
            offset = 0
            for item in batch:
                n = item.nodes.size
                if not item.future.done():
                    item.future.set_result(rows[offset : offset + n])
                if item.timer is not None:
                    item.timer.cancel()
                offset += n
            for stage in ("sample", "pull", "forward"):
                self.metrics.observe_stage(stage, getattr(times, stage))
            self.metrics.remote_rows.inc(times.remote_rows)
            self.metrics.cache_hits.inc(times.cache_hits)
        except Exception as exc:
            error: BaseException = exc
            if isinstance(exc, TimeoutError):
                error = RequestTimeoutError("the batch did not finish within its requests' deadline")
            elif not isinstance(exc, AsyncGraphError):
                error = AsyncGraphError(f"inference failed: {type(exc).__name__}: {exc}")
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
                    item.future.exception()  # retrieved: a caller that timed out never reads it
                if item.timer is not None:
                    item.timer.cancel()
        finally:
            self._last_end = time.perf_counter()
            self._slots.release()

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests, finish the queued and running ones (within ``timeout`` seconds),
        then stop. True when everything finished."""
        self._closing = True
        end = time.perf_counter() + timeout
        while (self._queue or self._batches) and time.perf_counter() < end:
            await asyncio.sleep(0.01)
        done = not self._queue and not self._batches
        if self._cutter is not None:
            self._cutter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cutter
        for task in list(self._batches):
            task.cancel()
        return done
