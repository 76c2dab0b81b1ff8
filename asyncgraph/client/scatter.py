"""Reach several partitions with one request: split by owner, scatter, gather in caller order.

``scatter`` is the only place that starts per-partition calls: remote ones are started first,
local ones run while those fly, and a failure cancels the rest and is raised once every call has
finished. Each client method supplies one small callable, as DGL's ``_distributed_access`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from asyncgraph.partition.book import split_by_owner
from asyncgraph.protocol.ops import Op
from asyncgraph.service.base import Partition

__all__ = ["broadcast", "gather_rows", "scatter", "split_by_owner", "take"]

T = TypeVar("T")
P = TypeVar("P")
# A call on one partition: its positions in the request, or None when it owns the whole request.
PartCall = Callable[[Partition, "np.ndarray | None"], Awaitable[T]]


def take(array: np.ndarray, pos: np.ndarray | None) -> np.ndarray:
    """``array[pos]``, or ``array`` itself for a single-owner request (no copy)."""
    return array if pos is None else array[pos]


async def scatter(
    partitions: Sequence[Partition], positions: Sequence[np.ndarray], op: Op, call: PartCall[T]
) -> list[tuple[np.ndarray | None, T]]:
    """Run ``call`` on every partition with positions; ``(positions, result)`` in partition order.

    A single owner is called with ``None`` (the whole request, nothing split or copied).
    Otherwise calls that do not run here start first as tasks; after one ``sleep(0)`` (so their
    requests are written) the local calls run inline. On any error the unfinished calls are
    cancelled, and the first error is raised once all of them have finished.
    """
    owned = [i for i, pos in enumerate(positions) if pos.size]
    if len(owned) == 1:
        return [(None, await call(partitions[owned[0]], None))]
    remote: list[tuple[int, asyncio.Future[T]]] = []
    local: list[int] = []
    for i in owned:
        if partitions[i].runs_here(op):
            local.append(i)
        else:
            remote.append((i, asyncio.ensure_future(call(partitions[i], positions[i]))))
    results: dict[int, T] = {}
    try:
        if remote and local:
            await asyncio.sleep(0)
        for i in local:
            results[i] = await call(partitions[i], positions[i])
        if len(remote) == 1:
            results[remote[0][0]] = await remote[0][1]
        elif remote:
            await asyncio.wait([task for _, task in remote], return_when=asyncio.FIRST_EXCEPTION)
            for _, task in remote:  # the first failure in partition order, if any
                error = task.exception() if task.done() and not task.cancelled() else None
                if error is not None:
                    raise error
            for i, task in remote:
                results[i] = task.result()
    except BaseException:
        tasks = [task for _, task in remote]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return [(positions[i], results[i]) for i in owned]


def gather_rows(
    parts: Sequence[tuple[np.ndarray | None, Any]], size: int, row_shape: Sequence[int], dtype: Any
) -> np.ndarray:
    """Each part's rows placed at its positions: ``size`` rows in the caller's order.

    A single owner's result is returned as it is.
    """
    if len(parts) == 1 and parts[0][0] is None:
        return np.asarray(parts[0][1])
    out = np.empty((size, *row_shape), dtype=dtype)
    for pos, rows in parts:
        out[pos] = rows
    return out


async def broadcast(targets: Sequence[P], call: Callable[[P], Awaitable[T]]) -> list[T]:
    """``call`` on every target concurrently; the first error is raised once all have finished."""
    results = await asyncio.gather(*(call(t) for t in targets), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if not isinstance(r, BaseException)]
