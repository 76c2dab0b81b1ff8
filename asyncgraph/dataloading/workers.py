"""A loader's worker processes: batches prepared on several cores, outside the training loop.

``num_workers=N`` (DGL's and PyTorch's name) starts N processes (``worker_main.py``), each with
its own client: connections to the servers, the co-located partitions through shared memory
(standalone: the loader's own stores, mapped through fd exporters). Batch ``i`` of an epoch is
built by worker ``i % N``: sampling, relabelling and feature gathers run there, on its core and
under its own GIL, never in the training process. Processes rather than threads: a batch is
mostly Python (sampling rounds, blocks, the client's calls) between compiled kernels, and one
GIL shared with the training loop's kernel launches serialised it (``benchmarks/README.md`` §20
has both measured).

Rows land once: each worker gathers a batch's feature rows straight into a **slot** it shares
with the loader (``worker_channel.py``), and the loader builds the batch over views of that
memory. On a CUDA device the slots are pinned in the loader (``cudaHostRegister``), and a
receiver thread copies each batch to the device in one ``non_blocking`` copy on a side stream
as soon as it arrives; the training loop's stream only waits on an event. Without a device copy
to start early there is no receiver thread: the training loop's thread reads the workers'
answers when it asks for its next batch (``WorkerPool.wait``), so no third thread competes for
the GIL with a training loop that holds it, nor for a core with the workers. A slot goes back
to its worker when the batch's host tensors are gone (the copy done, or the user dropped a CPU
batch).

Bounded: at most ``max(prefetch, N)`` batches are requested ahead of the one being trained on.
A failed batch is re-raised in the training loop when it is reached; a worker that dies fails
its batches with ``LoaderWorkerError`` naming it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading.device import map_tensors
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.dataloading.worker_cache import cache_fds, share_caches
from asyncgraph.dataloading.worker_channel import (
    BatchLayout,
    SlotMapping,
    decode_frame,
    encode_frame,
    recv_slot_fd,
    unpack_batch,
)
from asyncgraph.errors import AsyncGraphError

__all__ = ["LoaderWorkerError", "WorkerBatch", "WorkerPool", "WorkerPrefetcher"]


class LoaderWorkerError(AsyncGraphError):
    """A loader worker process failed to start or died while building batches."""


@dataclass
class WorkerBatch:
    """A batch built by a worker: on the host (slot views) or queued to the device."""

    batch: Any
    stats: LoaderStats
    event: Any = None  # torch.cuda.Event after the device copy
    device_buffer: torch.Tensor | None = None


class _Worker:
    def __init__(
        self, index: int, proc: subprocess.Popen[bytes], sock: socket.socket, slot_sock: socket.socket
    ) -> None:
        self.index = index
        self.proc = proc
        self.sock = sock
        self.slot_sock = slot_sock
        self.buffer = bytearray()
        self.slots: dict[int, SlotMapping] = {}
        self.frees: collections.deque[int] = collections.deque()
        self.pending: dict[Any, concurrent.futures.Future[WorkerBatch]] = {}
        self.send_lock = threading.Lock()
        self.dead: str | None = None

    def send(self, msg: tuple[Any, ...] | None) -> None:
        """Send ``msg`` (None: nothing else), after a ``free`` of the slots given back meanwhile."""
        frees = []
        while self.frees:
            frees.append(self.frees.popleft())
        with self.send_lock:
            if frees:
                self.sock.sendall(encode_frame(("free", frees)))
            if msg is not None:
                self.sock.sendall(encode_frame(msg))


class WorkerPool:
    """``num_workers`` processes building batches of ``recipe`` for one loader (see the module)."""

    def __init__(
        self,
        client: Client,
        recipe: Any,
        num_workers: int,
        *,
        device: torch.device | None,
        overlap: bool,
        gather_threads: int = 1,
        startup_timeout: float = 180.0,
        mode: str = "process",
    ) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"worker mode must be 'process' or 'thread', got {mode!r}")
        self.mode = mode
        if num_workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {num_workers}")
        self.client = client
        self.device = device
        self.cuda = device is not None and device.type == "cuda"
        self.overlap = overlap
        self._workers: list[_Worker] = []
        self._exporters: list[Any] = []
        self._closed = False
        self._copies: collections.deque[tuple[Any, torch.Tensor]] = collections.deque()
        self._stream: Any = None
        self._lock = threading.Lock()
        origin = client.async_client.state.origin
        exports = self._export_stores() if origin.get("kind") == "standalone" else None
        # the loader's feature caches, once per host: memfds every worker maps read-only
        cache_specs, self._cache_arrays = share_caches(client.async_client)
        self._inherit = cache_fds(cache_specs)
        spec = {
            "origin": origin,
            "exports": exports,
            "caches": cache_specs,
            "recipe": recipe,
            "gather_threads": gather_threads,
            "process": mode == "process",
        }
        try:
            for i in range(num_workers):
                self._workers.append(self._spawn(i))
            for w in self._workers:
                w.send(("init", spec))
            self._await_ready(startup_timeout)
        except BaseException:
            self.close()
            raise
        self._selector = selectors.DefaultSelector()
        for w in self._workers:
            self._selector.register(w.sock, selectors.EVENT_READ, w)
        self._pump_lock = threading.Lock()
        self._receiver: threading.Thread | None = None
        if self.cuda and self.overlap:  # device copies start as batches arrive, not when asked for
            self._receiver = threading.Thread(
                target=self._receive_loop, name="asyncgraph-loader-recv", daemon=True
            )
            self._receiver.start()

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    # --- start-up -----------------------------------------------------------------------------
    def _export_stores(self) -> list[tuple[str, bytes]]:
        from asyncgraph.storage.fdpass import FdExporter

        exports = []
        for part in self.client.partitions:
            store = part.store
            if store is None:
                raise LoaderWorkerError(f"num_workers: partition {part.part_id} is not held in this process")
            exporter = FdExporter(store, label=f"loader.p{part.part_id}")
            self.client.loop.run(exporter.start())
            self._exporters.append(exporter)
            exports.append((exporter.address, exporter.token))
        return exports

    def _spawn(self, index: int) -> _Worker:
        msg_parent, msg_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        slot_parent, slot_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        if self.mode == "thread":
            from asyncgraph.dataloading.worker_main import WorkerThread

            proc: Any = WorkerThread(msg_child.detach(), slot_child.detach())
            return _Worker(index, proc, msg_parent, slot_parent)
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "asyncgraph.dataloading.worker_main",
                    str(msg_child.fileno()),
                    str(slot_child.fileno()),
                ],
                pass_fds=(msg_child.fileno(), slot_child.fileno(), *self._inherit),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        finally:
            msg_child.close()
            slot_child.close()
        return _Worker(index, proc, msg_parent, slot_parent)

    def _await_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in self._workers:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LoaderWorkerError(
                        f"loader worker {w.index} (pid {w.proc.pid}) not ready after {timeout:.0f} s"
                    )
                msg = decode_frame(w.buffer)
                if msg is not None:
                    if msg[0] == "ready":
                        break
                    if msg[0] == "failed":
                        raise LoaderWorkerError(
                            f"loader worker {w.index} could not start: {msg[1]}"
                        ) from msg[1]
                    continue
                w.sock.settimeout(min(left, 1.0))
                try:
                    chunk = w.sock.recv(1 << 20)
                except TimeoutError:
                    if w.proc.poll() is not None:
                        raise LoaderWorkerError(
                            f"loader worker {w.index} (pid {w.proc.pid}) exited at start "
                            f"(status {w.proc.returncode})"
                        ) from None
                    continue
                if not chunk:
                    raise LoaderWorkerError(f"loader worker {w.index} (pid {w.proc.pid}) exited at start")
                w.buffer += chunk
            w.sock.settimeout(None)

    # --- batches ------------------------------------------------------------------------------
    def submit(self, key: Any, seeds: np.ndarray, batch_seed: int) -> concurrent.futures.Future[WorkerBatch]:
        """Ask worker ``key[-1] % N`` for a batch; its future resolves on the receiver thread."""
        w = self._workers[int(key[-1]) % len(self._workers)]
        future: concurrent.futures.Future[WorkerBatch] = concurrent.futures.Future()
        with self._lock:
            if w.dead is not None:
                future.set_exception(LoaderWorkerError(w.dead))
                return future
            w.pending[key] = future
        try:
            w.send(("task", key, np.ascontiguousarray(seeds, dtype=np.int64).tobytes(), int(batch_seed)))
        except OSError as exc:
            self._worker_died(w, f"loader worker {w.index} (pid {w.proc.pid}): {exc}")
        return future

    def forget(self, keys: list[Any]) -> None:
        """Stop waiting for these batches (their slots come back when their results are dropped)."""
        with self._lock:
            for w in self._workers:
                for key in keys:
                    w.pending.pop(key, None)

    def wait(self, future: concurrent.futures.Future[WorkerBatch]) -> WorkerBatch:
        """``future``'s batch; without a receiver thread, read the workers' answers on this
        thread until it is settled (one thread at a time reads them)."""
        while not future.done() and self._receiver is None:
            with self._pump_lock:
                if not future.done() and not self._receive_once(0.05):
                    break  # closed: the future was failed by close()
        return future.result()

    def _receive_loop(self) -> None:
        while not self._closed and self._receive_once(0.05):
            pass

    def _receive_once(self, timeout: float) -> bool:
        """Read what the workers sent within ``timeout``, settle its futures, flush freed slots;
        False once the pool is closed."""
        if self._closed:
            return False
        try:
            events = self._selector.select(timeout=timeout)
        except (OSError, ValueError):
            return False
        for sel_key, _ in events:
            w: _Worker = sel_key.data
            try:
                chunk = w.sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self._selector.unregister(w.sock)
                code = w.proc.poll()
                self._worker_died(w, f"loader worker {w.index} (pid {w.proc.pid}) exited (status {code})")
                continue
            w.buffer += chunk
            while (msg := decode_frame(w.buffer)) is not None:
                self._handle(w, msg)
        self._reap_copies()
        for w in self._workers:
            if w.frees and w.dead is None and not self._closed:
                with contextlib.suppress(OSError):
                    w.send(None)
        return True

    def _handle(self, w: _Worker, msg: tuple[Any, ...]) -> None:
        kind, key = msg[0], msg[1]
        if kind == "result":
            _, _, layout, stats, retired = msg
            for slot_id in retired:
                slot = w.slots.pop(slot_id, None)
                if slot is not None:
                    slot.close()
            try:
                result = self._open(w, layout, stats)
            except BaseException as exc:
                self._settle(w, key, exc=exc)
                return
            self._settle(w, key, result=result)
        elif kind == "error":
            self._settle(w, key, exc=msg[2])

    def _settle(
        self, w: _Worker, key: Any, *, result: WorkerBatch | None = None, exc: BaseException | None = None
    ) -> None:
        with self._lock:
            future = w.pending.pop(key, None)
        if future is None or future.cancelled():
            return  # a batch no one waits for any more: dropping it frees its slot
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def _open(self, w: _Worker, layout: BatchLayout, stats: LoaderStats) -> WorkerBatch:
        while layout.slot_id not in w.slots:
            slot_id, nbytes, fd = recv_slot_fd(w.slot_sock)
            w.slots[slot_id] = SlotMapping(fd, nbytes, pin=self.cuda)
        slot = w.slots[layout.slot_id]
        host_np = np.frombuffer(slot.mm, dtype=np.uint8, count=layout.nbytes)
        frees = w.frees
        weakref.finalize(host_np, frees.append, layout.slot_id)  # the slot is free once the batch is gone
        host = torch.from_numpy(host_np)
        if not (self.cuda and self.overlap):
            return WorkerBatch(unpack_batch(layout, host), stats)
        t0 = time.perf_counter()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            device_buffer = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.device)
            device_buffer.copy_(host, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._stream)
        self._copies.append((event, host))  # the slot stays out until the copy is done
        stats.copy += time.perf_counter() - t0
        return WorkerBatch(unpack_batch(layout, device_buffer), stats, event, device_buffer)

    def _reap_copies(self) -> None:
        while self._copies and self._copies[0][0].query():
            self._copies.popleft()

    def _worker_died(self, w: _Worker, why: str) -> None:
        with self._lock:
            if w.dead is None:
                w.dead = why
            pending, w.pending = w.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(LoaderWorkerError(why))

    # --- the end ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (asked, then killed after 5 s) and unmap their slots."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            with contextlib.suppress(OSError):
                w.send(("stop",))
        receiver = getattr(self, "_receiver", None)
        if receiver is not None and receiver is not threading.current_thread():
            receiver.join(timeout=5)
        for w in self._workers:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(timeout=5)
            self._worker_died(w, f"loader worker {w.index} stopped: the loader was closed")
            w.sock.close()
            w.slot_sock.close()
            for slot in w.slots.values():
                slot.close()
        with contextlib.suppress(Exception):
            self._selector.close()
        for exporter in self._exporters:
            with contextlib.suppress(Exception):
                self.client.loop.run(exporter.close(), timeout=5)
        for shared in getattr(self, "_cache_arrays", ()):
            shared.close()  # the loader's client keeps its view mapped; the descriptors go


class WorkerPrefetcher:
    """``Prefetcher``'s interface over a ``WorkerPool``: batch futures, ``ahead`` in flight."""

    def __init__(self, pool: WorkerPool, task: Any, epoch_key: int, count: int, ahead: int) -> None:
        self._pool = pool
        self._task = task  # index -> (seeds, batch_seed)
        self._epoch_key = epoch_key
        self._count = count
        self._ahead = max(ahead, 2 * pool.num_workers)  # a worker never idles between two batches
        self._next_submit = 0
        self._pending: collections.deque[tuple[Any, concurrent.futures.Future[WorkerBatch]]] = (
            collections.deque()
        )

    def next_future(self, index: int) -> concurrent.futures.Future[WorkerBatch]:
        while self._next_submit < min(index + self._ahead, self._count):
            i = self._next_submit
            seeds, batch_seed = self._task(i)
            key = (self._epoch_key, i)
            self._pending.append((key, self._pool.submit(key, seeds, batch_seed)))
            self._next_submit += 1
        return self._pending.popleft()[1]

    def wait(self, future: concurrent.futures.Future[WorkerBatch]) -> WorkerBatch:
        """``future``'s batch (see ``WorkerPool.wait``)."""
        return self._pool.wait(future)

    def cancel(self) -> None:
        keys = [key for key, _ in self._pending]
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.forget(keys)


def deliver(result: WorkerBatch, stats: LoaderStats, device: torch.device | None, overlap: bool) -> Any:
    """The batch for the training loop (its thread): stats counted, device copy waited on."""
    stats.add_batch(result.stats)
    if result.event is not None:
        stream = torch.cuda.current_stream(device)
        stream.wait_event(result.event)  # GPU-side wait: the host does not block
        if result.device_buffer is not None:
            result.device_buffer.record_stream(stream)
        return result.batch
    if device is not None and device.type != "cpu":
        t0 = time.perf_counter()
        batch = map_tensors(result.batch, lambda t: t.to(device))
        stats.copy += time.perf_counter() - t0
        return batch
    return result.batch
