"""A loader worker process: builds batches on its own cores and client, into shared slots.

Started by ``dataloading/workers.py`` as ``python -m asyncgraph.dataloading.worker_main MSG_FD
SLOT_FD``. It reads an ``init`` message (how to open a client like the loader's, the batch
recipe, the gather threads), opens its own client (connections to the servers and shared memory
of the co-located partitions; standalone, the loader's in-process stores mapped through their
fd exporters), loads its compiled kernels, says ``ready``, then builds every ``task`` it is sent
into a slot and answers ``result`` or ``error``: at most ``BUILDS_AT_ONCE`` at a time on its event
loop (one computing while another waits on a server), the rest queued in the order sent, so a
deeper prefetch queues batches instead of interleaving more of them in one process. It exits
when its loader says ``stop`` or the channel closes (its loader died): it never outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np
import torch

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.dataloading.worker_cache import adopt_caches
from asyncgraph.dataloading.worker_channel import (
    Slot,
    WorkerSlots,
    aligned,
    decode_frame,
    encode_frame,
    pack_batch,
    tensor_bytes,
)
from asyncgraph.kernels import gather

__all__ = ["BUILDS_AT_ONCE", "WorkerThread", "main", "open_client"]

#: Batches a worker builds at once. Two keep its core busy while one waits on a remote server;
#: more only interleave batches (each then finishes later, and their buffers compete for cache):
#: prefetch 4 on one worker took 2-5% longer than prefetch 0 when every sent batch was built at once.
BUILDS_AT_ONCE = 2


async def open_client(origin: dict[str, Any], exports: list[tuple[str, bytes]] | None) -> AsyncClient:
    """A client like the loader's: the same servers and options, or its stores' fd exporters."""
    if origin.get("kind") == "servers":
        options = {k: v for k, v in origin.items() if k not in ("kind", "servers")}
        return await AsyncClient.connect(origin["servers"], **options)
    if origin.get("kind") == "standalone" and exports is not None:
        return AsyncClient.attached(origin["part_config"], exports)
    raise RuntimeError(f"a loader worker cannot open a client from {origin.get('kind')!r}")


class _Worker:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slots: WorkerSlots
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.slots = slots
        self.client: AsyncClient | None = None
        self.recipe: Any = None
        self.cache_maps: list[Any] = []  # the loader's feature caches, mapped (worker_cache.py)
        self.tasks: set[asyncio.Task[None]] = set()
        self.building = asyncio.Semaphore(BUILDS_AT_ONCE)  # FIFO: batches start in the order sent

    def send(self, msg: tuple[Any, ...]) -> None:
        self.writer.write(encode_frame(msg))

    async def build(self, key: Any, seeds: np.ndarray, batch_seed: int) -> None:
        async with self.building:
            await self._build(key, seeds, batch_seed)

    async def _build(self, key: Any, seeds: np.ndarray, batch_seed: int) -> None:
        stats = LoaderStats()
        slot_box: list[Slot] = []
        feature_end = 0

        def allocate(
            specs: list[tuple[str, tuple[int, ...], np.dtype[Any]]], blocks: list[Any]
        ) -> list[np.ndarray]:
            nonlocal feature_end
            sizes = [
                aligned(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize) for _, shape, dtype in specs
            ]
            structure = tensor_bytes(blocks) + 2 * aligned(seeds.nbytes) + aligned(8 * max(1, seeds.size))
            slot = self.slots.acquire(sum(sizes) + structure + 4 * 4096)
            slot_box.append(slot)
            out, offset = [], 0
            for (_, shape, dtype), size in zip(specs, sizes, strict=True):
                out.append(slot.view(offset, dtype, shape))
                offset += size
            feature_end = offset
            return out

        try:
            assert self.client is not None
            batch = await self.recipe.build(self.client, seeds, batch_seed, stats, allocate)
            if slot_box:
                slot = slot_box[0]
            else:  # typed batches pull into arrays of their own: the slot is sized afterwards
                slot = self.slots.acquire(tensor_bytes(batch) + 4096)
                slot_box.append(slot)
            t0 = time.perf_counter()
            try:
                layout, copied = pack_batch(batch, slot, feature_end)
            except RuntimeError:  # structure larger than estimated: a bigger slot, everything packed
                self.slots.release(slot.slot_id)
                slot = self.slots.acquire(tensor_bytes(batch) + 4096)
                slot_box[0] = slot
                layout, copied = pack_batch(batch, slot, 0)
                stats.host_copy_bytes += stats.feature_bytes
            if not feature_end:
                stats.host_copy_bytes += min(copied, stats.feature_bytes)
            stats.structure_bytes += copied - (0 if feature_end else min(copied, stats.feature_bytes))
            stats.copy += time.perf_counter() - t0
            stats.batches = 1
            self.send(("result", key, layout, stats, self.slots.take_retired()))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the loader re-raises it in the training loop
            for slot in slot_box:
                self.slots.release(slot.slot_id)
            self.send(("error", key, _portable(exc)))

    async def run(self) -> None:
        buffer = bytearray()
        while True:
            msg = decode_frame(buffer)
            if msg is None:
                chunk = await self.reader.read(1 << 20)
                if not chunk:
                    return  # the loader is gone
                buffer += chunk
                continue
            kind = msg[0]
            if kind == "init":
                await self.init(msg[1])
            elif kind == "task":
                _, key, seed_bytes, batch_seed = msg
                seeds = np.frombuffer(bytearray(seed_bytes), dtype=np.int64)  # writable, as a loader's are
                task = asyncio.get_running_loop().create_task(self.build(key, seeds, batch_seed))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif kind == "free":
                for slot_id in msg[1]:
                    self.slots.release(slot_id)
            elif kind == "stop":
                return
            await self.writer.drain()

    async def init(self, spec: dict[str, Any]) -> None:
        try:
            if spec.get("process", True):  # a thread of the training process keeps its torch threads
                torch.set_num_threads(1)
            gather.set_gather_threads(int(spec.get("gather_threads", 1)))
            self.client = await open_client(spec["origin"], spec.get("exports"))
            self.cache_maps = adopt_caches(
                self.client, spec.get("caches", []), inherited=bool(spec.get("process", True))
            )
            self.recipe = spec["recipe"]
            from asyncgraph.dataloading.relabel_kernel import wait_batch_kernels

            wait_batch_kernels(float(spec.get("jit_timeout", 120.0)))
            self.send(("ready", os.getpid()))
        except BaseException as exc:
            self.send(("failed", _portable(exc)))
            raise


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles (typed errors keep their type), else a RuntimeError with its text."""
    import pickle

    with contextlib.suppress(Exception):
        exc.add_note("in the loader worker:\n" + "".join(traceback.format_tb(exc.__traceback__)))
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return RuntimeError(f"loader worker: {text}")


async def _serve(msg_fd: int, slot_fd: int) -> None:
    sock = socket.socket(fileno=msg_fd)
    slot_sock = socket.socket(fileno=slot_fd)
    slot_sock.setblocking(True)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 24)
    worker = _Worker(reader, writer, WorkerSlots(slot_sock))
    try:
        await worker.run()
    finally:
        for task in list(worker.tasks):
            task.cancel()
        await asyncio.gather(*worker.tasks, return_exceptions=True)
        if worker.client is not None:
            with contextlib.suppress(Exception):  # leaving anyway; the servers see the socket close
                await asyncio.wait_for(worker.client.close(), 5)
        worker.slots.close()
        writer.close()


def run_in_thread(msg_fd: int, slot_fd: int) -> None:
    """A worker on a thread of the loader's process (``worker_mode="thread"``, for comparison)."""
    from asyncgraph.client.loop_thread import new_event_loop

    loop = new_event_loop()
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionError):
            loop.run_until_complete(_serve(msg_fd, slot_fd))
    finally:
        loop.close()


class WorkerThread:
    """``subprocess.Popen``'s few methods the pool uses, for a worker run on a thread."""

    def __init__(self, msg_fd: int, slot_fd: int) -> None:
        self.pid = os.getpid()
        self.returncode: int | None = None
        self._thread = threading.Thread(
            target=run_in_thread, args=(msg_fd, slot_fd), name="asyncgraph-loader-worker", daemon=True
        )
        self._thread.start()

    def poll(self) -> int | None:
        if self._thread.is_alive():
            return None
        self.returncode = 0
        return 0

    def wait(self, timeout: float | None = None) -> int:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise subprocess.TimeoutExpired("loader worker thread", timeout or 0.0)
        self.returncode = 0
        return 0

    def kill(self) -> None:
        pass  # it stops when its sockets close


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    msg_fd, slot_fd = int(args[0]), int(args[1])
    try:
        import uvloop

        uvloop.run(_serve(msg_fd, slot_fd))
    except (KeyboardInterrupt, BrokenPipeError, ConnectionError):
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
