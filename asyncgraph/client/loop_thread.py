"""An event loop running forever on a daemon thread, and the cheapest blocking hand-off to it.

The blocking ``Client`` runs each call of its ``AsyncClient`` here, and the loaders run their
prefetching pipelines on the same loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["EventLoopThread", "new_event_loop"]

T = TypeVar("T")


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
