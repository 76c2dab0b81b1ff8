"""Trainer process for ``benchmarks.pull_bench``: JSON-line commands on stdin, results on stdout.

Commands (one JSON object per line; every reply is one JSON line):

- ``{"cmd": "connect", "servers": [[host, port], ...], "rank": r}``: connect an ``AsyncClient``
  with shared memory restricted to partition ``r`` (the trainer's own), reply the wall time.
- ``{"cmd": "create", "name": ..., "dim": d}``: create a float32 node tensor (idempotent).
- ``{"cmd": "bench", "op": "pull"|"push"|"gather", "case": ..., "size": n, "iters": k,
  "cap_s": s, "start_at": t}``: wait until wall time ``t`` (so both trainers start together),
  run at most ``k`` timed calls (after 2 warm-up calls) or until ``cap_s`` passes; reply the
  per-call latencies and the start/end wall times. ``gather`` is the numpy ceiling: ``np.take``
  of the same number of random rows from an array the size of one partition's features.
- ``{"cmd": "quit"}``.

``python -m benchmarks.pull_worker --sock-send HOST PORT MIB ITERS``: the sender half of the raw
loopback socket ceiling (``sendall`` of a MIB-MiB buffer ITERS times).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from typing import Any

import numpy as np

from asyncgraph.client import AsyncClient  # imported before the start-up clock starts

FEAT = "node:feat"
PUSH = "node:bench_push"


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Trainer:
    def __init__(self) -> None:
        self.client: Any = None
        self.rank = 0
        self.rng = np.random.default_rng(12345)
        self._gather_src: np.ndarray | None = None

    async def connect(self, servers: list[list[Any]], rank: int) -> dict[str, Any]:
        self.rank = rank
        self.rng = np.random.default_rng(1000 + rank)
        self.client = await AsyncClient.connect(
            [(str(h), int(p)) for h, p in servers], local_partitions=[rank]
        )
        return {"ready_t": time.time(), "local": self.client.local_partitions()}

    def _ids(self, case: str, size: int) -> np.ndarray:
        book = self.client.book
        if case == "mixed":
            lo, hi = 0, book.num_nodes
        else:
            part = self.rank if case == "local" else 1 - self.rank
            lo, hi = book.node_range(part)
        return self.rng.integers(lo, hi, size, dtype=np.int64)

    async def bench(
        self, op: str, case: str, size: int, iters: int, cap_s: float, start_at: float
    ) -> dict[str, Any]:
        pool = 8
        if op == "gather":
            if self._gather_src is None:
                lo, hi = self.client.book.node_range(self.rank)
                meta = await self.client.tensor_meta(FEAT)
                self._gather_src = self.rng.standard_normal((hi - lo, *meta.shape[1:]), dtype=np.float32)
            src = self._gather_src
            id_pool = [self.rng.integers(0, src.shape[0], size, dtype=np.int64) for _ in range(pool)]
        else:
            id_pool = [self._ids(case, size) for _ in range(pool)]
        values = self.rng.standard_normal((size, 128), dtype=np.float32) if op == "push" else None
        client = self.client

        async def once(i: int) -> None:
            ids = id_pool[i % pool]
            if op == "pull":
                await client.pull_numpy(FEAT, ids)
            elif op == "push":
                await client.push(PUSH, ids, values)
            else:
                np.take(src, ids, axis=0)

        for i in range(2):
            await once(i)
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        lat: list[float] = []
        t0 = time.time()
        deadline = time.perf_counter() + cap_s
        for i in range(iters):
            s = time.perf_counter()
            await once(i)
            e = time.perf_counter()
            lat.append(e - s)
            if e > deadline:
                break
        t1 = time.time()
        return {"lat": lat, "t0": t0, "t1": t1, "rows": size * len(lat)}


async def serve() -> None:
    trainer = Trainer()
    loop = asyncio.get_running_loop()
    _reply({"hello": True})
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        msg = json.loads(line)
        cmd = msg.pop("cmd")
        if cmd == "quit":
            break
        if cmd == "connect":
            _reply(await trainer.connect(msg["servers"], int(msg["rank"])))
        elif cmd == "create":
            n = trainer.client.book.num_nodes
            await trainer.client.create_tensor(msg["name"], "node", [n, int(msg["dim"])], "float32")
            _reply({"ok": True})
        elif cmd == "bench":
            _reply(await trainer.bench(**msg))
        else:
            _reply({"error": f"unknown command {cmd}"})
    if trainer.client is not None:
        await trainer.client.close()


def sock_send(host: str, port: int, mib: int, iters: int) -> None:
    buf = np.ones(mib << 20, dtype=np.uint8)
    with socket.create_connection((host, port)) as sock:
        for _ in range(iters):
            sock.sendall(memoryview(buf))
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sock-send":
        sock_send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    import uvloop

    uvloop.run(serve())


if __name__ == "__main__":
    main()
