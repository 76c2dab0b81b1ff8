"""Bounded fault soak: servers are SIGKILLed and restarted under load; no acknowledged write lost.

2 servers (``--state-dir`` + ``--wal``), ``--clients`` clients in this process (each its own
connections, reconnect window 30 s) running a mixed load (pull, push-add of known deltas,
neighbour sampling) for ``--seconds``; every ``--kill-every`` seconds a random server is killed
with SIGKILL and restarted on its port from its state folder. At the end the tensor is compared
with the model of acknowledged adds. Prints and writes (``benchmarks/results/faults.json``)
requests done, retried and failed, acknowledged writes lost (must be 0), and latency p50/p99
outside and during recovery (a request is "during recovery" when it started between a kill and
one second after the restarted server was ready).

    python -m benchmarks.faults --graph examples/data/cora.npz --seconds 45 --kill-every 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.client import AsyncClient
from asyncgraph.errors import AsyncGraphError
from asyncgraph.testing import ServerGroup, start_servers
from benchmarks.common import RESULTS, add_graph_options, graph_npz, partitioned

WIDTH = 8


class Soak:
    """Shared counters, the acknowledged-writes model and the recovery windows."""

    def __init__(self, num_nodes: int) -> None:
        self.acked = np.zeros((num_nodes, WIDTH))
        self.unacked = np.zeros((num_nodes, WIDTH))
        self.done = 0
        self.failed = 0
        self.latencies: list[tuple[float, float]] = []  # (start, seconds)
        self.windows: list[tuple[float, float]] = []
        self.kills = 0
        self.errors: list[str] = []

    def in_recovery(self, t: float) -> bool:
        return any(a <= t <= b for a, b in self.windows)


async def worker(client: AsyncClient, soak: Soak, seed: int, until: float) -> None:
    rng = np.random.default_rng(seed)
    n = client.book.num_nodes
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        ids = rng.integers(0, n, 128)
        kind = rng.integers(0, 3)
        t0 = time.monotonic()
        try:
            if kind == 0:
                await client.pull_numpy("soak", ids)
            elif kind == 1:
                vals = rng.integers(1, 4, (128, WIDTH)).astype(np.float64)
                try:
                    await client.push("soak", ids, vals, op="add")
                except AsyncGraphError:
                    np.add.at(soak.unacked, ids, vals)
                    raise
                np.add.at(soak.acked, ids, vals)
            else:
                await client.sample_neighbors(ids[:32], 10)
        except AsyncGraphError as exc:
            soak.failed += 1
            soak.errors.append(f"{type(exc).__name__}: {exc}")
            continue
        soak.done += 1
        soak.latencies.append((t0, time.monotonic() - t0))


def killer(group: ServerGroup, soak: Soak, every: float, until: float, stop: threading.Event) -> None:
    rng = random.Random(0)
    while not stop.wait(every) and time.monotonic() + 5 < until:
        victim = rng.randrange(len(group.procs))
        t0 = time.monotonic()
        group.kill(victim, signal.SIGKILL)
        group.restart(victim)
        soak.kills += 1
        soak.windows.append((t0, time.monotonic() + 1.0))


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q) * 1e3) if values else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = partitioned(graph_npz(args), 2)
    with tempfile.TemporaryDirectory(prefix="asyncgraph-faults-") as tmp:
        extra = ["--log-level", "WARNING", "--state-dir", f"{tmp}/state", "--wal", "--wal-fsync", args.fsync]
        group = start_servers(config, Path(tmp) / "run", num_parts=2, extra_args=extra)
        try:
            clients = [
                await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=30.0)
                for _ in range(args.clients)
            ]
            n = clients[0].book.num_nodes
            await clients[0].create_tensor("soak", "node", [n, WIDTH], "float64")
            await clients[0].snapshot()
            soak = Soak(n)
            loop = asyncio.get_running_loop()
            until = loop.time() + args.seconds
            stop = threading.Event()
            kill_thread = threading.Thread(
                target=killer, args=(group, soak, args.kill_every, time.monotonic() + args.seconds, stop)
            )
            kill_thread.start()
            try:
                await asyncio.gather(*(worker(c, soak, i, until) for i, c in enumerate(clients)))
            finally:
                stop.set()
                await asyncio.to_thread(kill_thread.join)
            got = await clients[0].pull_numpy("soak", np.arange(n))
            lost = int(np.sum(got < soak.acked - 1e-9))
            extra_applied = int(np.sum(got > soak.acked + soak.unacked + 1e-9))
            retried = sum(c.retries() for c in clients)
            for c in clients:
                await c.close()
        finally:
            group.stop()
    during = [d for t, d in soak.latencies if soak.in_recovery(t)]
    outside = [d for t, d in soak.latencies if not soak.in_recovery(t)]
    return {
        "graph": config.stem,
        "seconds": args.seconds,
        "clients": args.clients,
        "kill_every_s": args.kill_every,
        "wal_fsync": args.fsync,
        "kills": soak.kills,
        "requests_done": soak.done,
        "requests_retried": retried,
        "requests_failed": soak.failed,
        "lost_acknowledged_rows": lost,
        "rows_above_model": extra_applied,
        "p50_ms": pct(outside, 50),
        "p99_ms": pct(outside, 99),
        "p50_recovery_ms": pct(during, 50),
        "p99_recovery_ms": pct(during, 99),
        "max_recovery_ms": (max(during) * 1e3) if during else None,
        "first_errors": soak.errors[:5],
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_options(ap, default_scale=14)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--kill-every", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--fsync", choices=("always", "interval"), default="always")
    ap.add_argument("--out", type=Path, default=RESULTS / "faults.json")
    args = ap.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result["lost_acknowledged_rows"]:
        raise SystemExit("acknowledged writes were lost")


if __name__ == "__main__":
    main()
