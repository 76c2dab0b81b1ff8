"""A blocking facade over ``AsyncClient``: one event loop on a daemon thread.

Plain scripts and Jupyter cells call ``client.pull(...)`` without touching asyncio; each call is
submitted to the background loop with ``run_coroutine_threadsafe`` and waited for. The typed
surface stays in two small classes (async and sync) instead of one class whose methods return
"a value or an awaitable".
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.store import TensorMeta

from .async_client import AsyncClient

T = TypeVar("T")

logger = logging.getLogger("asyncgraph.client")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where available (faster socket I/O), else the default loop."""
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


class EventLoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self, name: str = "asyncgraph-loop") -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it finishes (or ``timeout`` passes).

        The hand-off is one ``call_soon_threadsafe`` and one lock released by the task's done
        callback: a third of ``run_coroutine_threadsafe``'s cost (no concurrent future, no
        future chaining), which every blocking call pays. If the wait ends early (timeout,
        KeyboardInterrupt) the task is cancelled.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "blocking call made from the client's own event loop thread; use the async API"
            )
        done = threading.Lock()
        done.acquire()
        box: list[asyncio.Task[T] | BaseException] = []

        def start() -> None:
            try:
                task = self.loop.create_task(coro)
            except BaseException as exc:  # pragma: no cover - the loop refused the task
                coro.close()
                box.append(exc)
                done.release()
                return
            box.append(task)
            task.add_done_callback(lambda _: done.release())

        self.loop.call_soon_threadsafe(start)
        finished = False
        try:
            finished = done.acquire(timeout=-1 if timeout is None else timeout)
        finally:
            if not finished:
                self.loop.call_soon_threadsafe(self._cancel, box)
        if not finished:
            raise TimeoutError(f"call did not finish within {timeout} s")
        outcome = box[0]
        if isinstance(outcome, BaseException):  # pragma: no cover
            raise outcome
        return outcome.result()

    @staticmethod
    def _cancel(box: list[asyncio.Task[Any] | BaseException]) -> None:
        if box and isinstance(box[0], asyncio.Task):
            box[0].cancel()

    def submit(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """Schedule ``coro`` and return a concurrent future for it (non-blocking)."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class Client:
    """Blocking client: the same operations as ``AsyncClient``."""

    def __init__(self, aio: AsyncClient, loop: EventLoopThread) -> None:
        self.aio = aio
        self.loop = loop
        self._releases: collections.deque[str] = collections.deque()  # appended from any thread

    @classmethod
    def connect(cls, servers: Sequence[tuple[str, int]], **kwargs: Any) -> Client:
        loop = EventLoopThread()
        try:
            aio = loop.run(AsyncClient.connect(servers, **kwargs))
        except BaseException:
            loop.stop()
            raise
        return cls(aio, loop)

    @classmethod
    def standalone(cls, part_config: str | Path) -> Client:
        return cls(AsyncClient.standalone(part_config), EventLoopThread())

    # --- metadata ---------------------------------------------------------------------------
    @property
    def graph_name(self) -> str:
        return self.aio.graph_name

    @property
    def book(self) -> RangePartitionBook:
        return self.aio.book

    @property
    def is_standalone(self) -> bool:
        """True when every partition is held in this process (no server)."""
        return self.aio.is_standalone

    def info(self, part_id: int = 0) -> dict[str, Any]:
        return self.loop.run(self.aio.info(part_id))

    def tensor_meta(self, name: str) -> TensorMeta:
        meta = self.aio.cached_meta(name)
        return meta if meta is not None else self.loop.run(self.aio.tensor_meta(name))

    def refresh_tensors(self) -> list[TensorMeta]:
        return self.loop.run(self.aio.refresh_tensors())

    # --- data ---------------------------------------------------------------------------------
    def pull(self, name: str, ids: Any) -> torch.Tensor:
        rows = self.aio.pull_here(name, ids)  # standalone, one owner: no hop to the loop thread
        if rows is not None:
            return torch.from_numpy(rows)
        return self.loop.run(self.aio.pull(name, ids))

    def push(self, name: str, ids: Any, values: Any, op: str = "assign") -> None:
        self.loop.run(self.aio.push(name, ids, values, op))

    def create_tensor(
        self, name: str, policy: str, shape: Sequence[int], dtype: str, init: Mapping[str, Any] | None = None
    ) -> TensorMeta:
        return self.loop.run(self.aio.create_tensor(name, policy, shape, dtype, init))

    def create_tensor_parts(
        self,
        name: str,
        policy: str,
        shape: Sequence[int],
        dtype: str,
        init: Mapping[str, Any] | None = None,
        persistent: bool = True,
    ) -> tuple[TensorMeta, list[int]]:
        """``create_tensor`` and the partitions this call created it on."""
        return self.loop.run(self.aio.create_tensor_parts(name, policy, shape, dtype, init, persistent))

    def release_later(self, name: str) -> None:
        """Queue the release of one reference to non-persistent tensor ``name``; never blocks.

        Safe from any thread, a garbage-collection finalizer on the loop thread included: the
        name is queued and a flush is scheduled on the loop.
        """
        self._releases.append(name)
        if self.loop.loop.is_closed():
            return
        flush = self._flush_releases()
        try:
            asyncio.run_coroutine_threadsafe(flush, self.loop.loop)
        except RuntimeError:  # the loop is shutting down; close() releases everything anyway
            flush.close()

    async def _flush_releases(self) -> None:
        names: list[str] = []
        while self._releases:
            names.append(self._releases.popleft())
        if not names:
            return
        try:
            await self.aio.release_tensors(names)
        except Exception as exc:  # a finalizer has nobody to raise to
            logger.warning("releasing tensors %s failed: %s", names, exc)

    def flush_releases(self) -> None:
        """Send the queued releases now (they are otherwise sent as soon as the loop runs)."""
        self.loop.run(self._flush_releases())

    def delete_tensor(self, name: str) -> None:
        self.loop.run(self.aio.delete_tensor(name))

    def sample_neighbors(
        self, seeds: Any, fanout: int, *, replace: bool = False, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.loop.run(self.aio.sample_neighbors(seeds, fanout, replace=replace, seed=seed))

    def sample_edges(
        self, seeds: Any, fanout: int, **options: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``AsyncClient.sample_edges``: direction, weights and excluded edges."""
        return self.loop.run(self.aio.sample_edges(seeds, fanout, **options))

    def sample_etypes(
        self, seeds: Any, etype_fanouts: np.ndarray, *, seed: int | None = None, prob: str | None = None
    ) -> dict[str, np.ndarray]:
        """``AsyncClient.sample_etypes``: in-edges with a fanout per edge type."""
        return self.loop.run(self.aio.sample_etypes(seeds, etype_fanouts, seed=seed, prob=prob))

    def degrees(self, ids: Any, edge_dir: str) -> np.ndarray:
        """In- or out-degrees of node ``ids`` (None: all nodes)."""
        return self.loop.run(self.aio.degrees(ids, edge_dir))

    @property
    def num_clients(self) -> int:
        return self.aio.num_clients

    def barrier(self, name: str = "default", timeout: float = 300.0) -> None:
        self.loop.run(self.aio.barrier(name, timeout))

    def snapshot(self) -> int:
        """Snapshot every server's state as one new epoch (see ``AsyncClient.snapshot``)."""
        return self.loop.run(self.aio.snapshot())

    def server_stats(self) -> list[dict[str, Any]]:
        return self.loop.run(self.aio.server_stats())

    def shutdown_servers(self) -> None:
        self.loop.run(self.aio.shutdown_servers())

    def close(self) -> None:
        """Release every non-persistent tensor reference of this client, then disconnect."""
        try:
            self._releases.clear()
            try:
                self.loop.run(self.aio.release_tensors([], every=True), timeout=10)
            except Exception as exc:  # servers already gone: nothing left to free
                logger.debug("releasing tensors at close failed: %s", exc)
            self.loop.run(self.aio.close(), timeout=10)
        finally:
            self.loop.stop()

    def sparse_update(self, name: str, ids: Any, grads: Any, spec: Mapping[str, Any]) -> None:
        """One sparse Adagrad/Adam step run on the owners of ``ids`` (see ``AsyncClient.sparse_update``)."""
        self.loop.run(self.aio.sparse_update(name, ids, grads, spec))

    def find_edges(self, eids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Global ``(src, dst)`` of edge IDs ``eids`` (see ``AsyncClient.find_edges``)."""
        return self.loop.run(self.aio.find_edges(eids))
