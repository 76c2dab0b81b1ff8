"""What the composed client and its derived blocking facade cost per call (issue 21).

``AsyncClient`` offers its parts' methods through ``forward`` and the blocking ``Client`` wraps
``AsyncClient``'s through ``blocking`` / ``mirror``: one extra Python call each. Measured in one
run, standalone (every partition in this process, so no socket noise), each figure beside the
same work called without the wrapper (the ceiling: the wrapper should add ~0):

* ``pull_numpy`` of 100 rows awaited on a loop: ``AsyncClient.pull_numpy`` (forward) vs
  ``TensorReads.pull_numpy`` called on the part,
* ``degrees`` of 100 nodes through the facade: ``Client.degrees`` (blocking) vs
  ``client.loop.run(client.async_client.degrees(...))`` written by hand, and the bare hop to the
  loop thread (``loop.run`` of a coroutine that does nothing) for scale,
* ``cached_meta``: ``Client.cached_meta`` (mirror) vs ``AsyncClient.cached_meta``.

Run: ``.venv/bin/python -m benchmarks.facade_cost [--scale 15] [--calls 5000]``; writes
``benchmarks/results/facade_cost.json``. Compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.client import Client
from benchmarks.common import RESULTS, add_graph_options, graph_npz, partitioned


def median_us(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(min(calls, 200)):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def median_us_async(make: Callable[[], Awaitable[Any]], calls: int) -> float:
    async def run() -> float:
        for _ in range(min(calls, 200)):
            await make()
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await make()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e6

    return asyncio.run(run())


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.facade_cost", description=__doc__.split("\n\n")[0])
    add_graph_options(p, default_scale=15)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--out", type=Path, default=RESULTS / "facade_cost.json")
    args = p.parse_args()
    client = Client.standalone(partitioned(graph_npz(args), 2, balance=True))
    try:
        aio = client.async_client
        ids = np.arange(0, client.book.num_nodes, client.book.num_nodes // 100, dtype=np.int64)[:100]
        name = next(n for n in client.tensor_names() if n.startswith("node:"))

        async def noop() -> None:
            return None

        pairs = {
            "pull_numpy_100_rows_async": (
                median_us_async(lambda: aio.pull_numpy(name, ids), args.calls),
                median_us_async(lambda: aio.reads.pull_numpy(name, ids), args.calls),
            ),
            "degrees_100_sync": (
                median_us(lambda: client.degrees(ids, "in"), args.calls),
                median_us(lambda: client.loop.run(aio.degrees(ids, "in")), args.calls),
            ),
            "cached_meta_sync": (
                median_us(lambda: client.cached_meta(name), args.calls),
                median_us(lambda: aio.cached_meta(name), args.calls),
            ),
        }
        hop = median_us(lambda: client.loop.run(noop()), args.calls)
    finally:
        client.close()
    rows: dict[str, Any] = {"hop_to_loop_thread_us": round(hop, 2)}
    print(f"hop to the loop thread (loop.run of a no-op): {hop:8.2f} us")
    for case, (wrapped, bare) in pairs.items():
        rows[case] = {
            "wrapped_us": round(wrapped, 2),
            "bare_us": round(bare, 2),
            "ratio": round(wrapped / bare, 3),
        }
        print(f"{case:28s} wrapped {wrapped:8.2f} us  bare {bare:8.2f} us  ratio {wrapped / bare:5.3f}")
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
