"""Where the partitioner's chunk tasks run: inline, a local process pool, or a Dask cluster.

``Runner.map(fn, args, stage)`` runs ``fn(*a)`` for every ``a`` and returns the results in
order, with a tqdm bar per stage (tasks, bytes read and written, ETA) when ``progress`` is set.
Workers are spawned, not forked: a forked worker would share (and be charged for) the main
process' pages. They die with the main process (a parent-death signal) and leave SIGTERM and
SIGINT to it; when a stage fails or is interrupted, the main process kills them by PID rather
than waiting for their tasks (see :mod:`asyncgraph.partition.interrupt`). With a
``distributed.Client`` (opened by :func:`asyncgraph.partition.placement.dask_client`) the same
tasks go to the cluster's workers, which must see the input and the work folder on shared
storage.

``pins`` (``--part-worker P=ADDRESS``) pins partition ``P``'s tasks to one Dask worker: a task
given ``parts[i] == P`` runs there only (``workers=[ADDRESS]``, ``allow_other_workers=False``),
so ``P``'s files may live on that worker's local disk; its key names the part
(``<stage>-p<P>-<i>-<token>``). :meth:`Runner.at_parts` runs the small per-part set-up steps
(folders, preallocation) on the pinned worker, or in this process for a part without one.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from types import TracebackType
from typing import Any

from asyncgraph.partition.interrupt import paused_task, worker_init
from asyncgraph.partition.memory import format_size

__all__ = ["Runner"]


class Runner:
    """Runs chunk tasks on ``workers`` processes (inline when 1) or on a Dask cluster."""

    def __init__(
        self, workers: int, client: Any = None, progress: bool = False, pins: Mapping[int, str] | None = None
    ) -> None:
        """``client``: an open ``distributed.Client`` (its owner closes it), or None for the pool."""
        self.workers = workers
        self.progress = progress
        self.pins = dict(pins or {})
        self._pool: ProcessPoolExecutor | None = None
        self._client: Any = client

    def __enter__(self) -> Runner:
        if self._client is None and self.workers > 1:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=worker_init, initargs=(os.getpid(),))  # fmt: skip
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            if et is not None:  # failed or interrupted: the tasks still running are not waited for
                for proc in list(self._pool._processes.values()):
                    proc.kill()
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(
        self,
        fn: Callable[..., tuple[int, int]],
        args: Sequence[tuple[Any, ...]],
        stage: str,
        sizes: Sequence[int] | None = None,
        parts: Sequence[int | None] | None = None,
    ) -> list[tuple[int, int]]:
        """``[fn(*a) for a in args]``, run where this runner runs tasks; the first error is raised.

        ``sizes``: the input bytes of each task, so the stage's bar counts bytes (rate, ETA)
        rather than tasks. ``parts``: the partition whose files each task writes (None: only
        shared files), so a pinned part's tasks go to its worker and their keys name it.
        """
        bar = None
        if self.progress:
            from tqdm import tqdm

            if sizes is not None:
                bar = tqdm(total=int(sum(sizes)), desc=stage, unit="B", unit_scale=True, unit_divisor=1024,
                           file=sys.stderr, leave=True)  # fmt: skip
            else:
                bar = tqdm(total=len(args), desc=stage, unit="task", file=sys.stderr, leave=True)
        moved = [0, 0]

        def tick(i: int, result: tuple[int, int]) -> None:
            moved[0] += result[0]
            moved[1] += result[1]
            if bar is not None:
                bar.update(1 if sizes is None else int(sizes[i]))
                bar.set_postfix_str(f"read {format_size(moved[0])}, wrote {format_size(moved[1])}")

        results: list[tuple[int, int]] = []
        if os.environ.get("ASYNCGRAPH_PARTITION_PAUSE_IN") == stage:  # the testing hook
            fn = functools.partial(paused_task, fn, stage)
        try:
            if self._client is not None:
                from distributed import as_completed as dask_completed

                futs = self._submit(fn, args, stage, parts)
                index = {f.key: i for i, f in enumerate(futs)}
                out: list[Any] = [None] * len(futs)
                for f in dask_completed(futs):  # type: ignore[no-untyped-call]
                    out[index[f.key]] = f.result()
                    tick(index[f.key], out[index[f.key]])
                results = out
            elif self._pool is not None:
                pfuts: list[Future[tuple[int, int]]] = [self._pool.submit(fn, *a) for a in args]
                where = {f: i for i, f in enumerate(pfuts)}
                for f in as_completed(pfuts):
                    tick(where[f], f.result())
                results = [f.result() for f in pfuts]
            else:
                for i, a in enumerate(args):
                    results.append(fn(*a))
                    tick(i, results[-1])
        finally:
            if bar is not None:
                bar.close()
        return results

    def at_parts(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], parts: Sequence[int],
                 stage: str) -> list[Any]:  # fmt: skip
        """``fn(*a)`` for each part's set-up: on the part's pinned worker, else in this process;
        the results in ``parts`` order.

        Without pins this is what the partitioner always did (the main process creates the
        parts' folders and preallocates their files); a pinned part's folder may exist only on
        its worker's host, so its set-up runs there.
        """
        remote = [i for i, p in enumerate(parts) if p in self.pins]
        futs = self._submit(fn, [args[i] for i in remote], stage, [parts[i] for i in remote])
        results: list[Any] = [None] * len(parts)
        for i, p in enumerate(parts):
            if p not in self.pins:
                results[i] = fn(*args[i])
        for i, f in zip(remote, futs, strict=True):
            results[i] = f.result()
        return results

    def _submit(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], stage: str,
                parts: Sequence[int | None] | None) -> list[Any]:  # fmt: skip
        """Dask futures of ``fn(*a)``; a task of a pinned part goes to its worker only."""
        token = uuid.uuid4().hex[:12]
        slug = stage.replace(" ", "_")
        futs = []
        for i, a in enumerate(args):
            p = parts[i] if parts is not None else None
            key = f"{slug}-{i}-{token}" if p is None else f"{slug}-p{p}-{i}-{token}"
            where = [self.pins[p]] if p is not None and p in self.pins else None
            futs.append(self._client.submit(fn, *a, pure=False, key=key, workers=where,
                                            allow_other_workers=False))  # fmt: skip
        return futs
