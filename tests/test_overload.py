"""Overload behaviour: a flooding client neither starves another client nor grows server memory.

Real servers (Cora, 2 partitions). The flood runs in its own process (so its client-side work
cannot slow the measured client's event loop): many concurrent tasks pulling and pushing large
batches as fast as the servers answer. Meanwhile a second client sends a steady trickle of small
pulls; each must succeed, with a bounded p99. The servers' RSS is sampled throughout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.testing import ServerGroup, start_servers

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"overload-test-secret"
FLOOD_SECONDS = 4.0

FLOOD_SCRIPT = r"""
import asyncio, json, sys, time
import numpy as np
from asyncgraph.client import AsyncClient

async def main(addresses, secret, seconds):
    client = await AsyncClient.connect(addresses, secret=secret, use_shared_memory=False,
                                       call_timeout=30.0, max_inflight=16)
    n = client.book.num_nodes
    meta = await client.tensor_meta("node:feat")
    values = np.ones((1000, *meta.shape[1:]), dtype=meta.dtype)
    counts = {"ok": 0, "errors": {}}
    rng = np.random.default_rng(0)
    end = time.perf_counter() + seconds
    print("started", flush=True)

    async def flood(i):
        while time.perf_counter() < end:
            ids = rng.integers(0, n, 1000)
            try:
                if i % 4 == 0:
                    await client.push("node:flood_scratch", ids, values, op="add")
                else:
                    await client.pull_numpy("node:feat", ids)
                counts["ok"] += 1
            except Exception as exc:
                counts["errors"][type(exc).__name__] = counts["errors"].get(type(exc).__name__, 0) + 1

    await client.create_tensor("node:flood_scratch", "node", list(meta.shape), meta.dtype)
    await asyncio.gather(*(flood(i) for i in range(64)))
    await client.close()
    print(json.dumps(counts), flush=True)

addresses = json.loads(sys.argv[1])
asyncio.run(main([tuple(a) for a in addresses], sys.argv[2].encode(), float(sys.argv[3])))
"""


@pytest.fixture(scope="module")
def servers(cora2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path_factory.mktemp("overload"),
        num_parts=2,
        secret=SECRET,
        extra_args=["--max-inflight", "2", "--log-level", "WARNING"],
    )
    yield group
    group.stop()


class RssSampler:
    """Peak RSS of the server processes, sampled every 50 ms in a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = [psutil.Process(pid) for pid in pids]
        self.idle = self.sample()
        self.peak = list(self.idle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> list[int]:
        return [int(p.memory_info().rss) for p in self.procs]

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = [max(a, b) for a, b in zip(self.peak, self.sample(), strict=True)]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.perf
@pytest.mark.timeout(60)
async def test_flood_does_not_starve_a_second_client(servers: ServerGroup) -> None:
    addresses = json.dumps([list(a) for a in servers.addresses])
    flood = subprocess.Popen(
        [sys.executable, "-c", FLOOD_SCRIPT, addresses, SECRET.decode(), str(FLOOD_SECONDS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    sampler = RssSampler([p.pid for p in servers.procs])
    try:
        assert flood.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(flood.stdout.readline), 30)
        assert line.strip() == b"started", flood.stderr.read() if flood.stderr else line
        await asyncio.sleep(0.5)  # let the flood build up
        client = await AsyncClient.connect(
            servers.addresses, secret=SECRET, use_shared_memory=False, call_timeout=10.0
        )
        latencies: list[float] = []
        rng = np.random.default_rng(1)
        n = client.book.num_nodes
        end = time.perf_counter() + FLOOD_SECONDS - 1.0
        while time.perf_counter() < end:
            ids = rng.integers(0, n, 16)
            t0 = time.perf_counter()
            rows = await client.pull_numpy("node:feat", ids)  # any error fails the test
            latencies.append(time.perf_counter() - t0)
            assert rows.shape[0] == 16
            await asyncio.sleep(0.01)
        await client.close()
        out, err = await asyncio.to_thread(flood.communicate, timeout=40)
    finally:
        sampler.stop()
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    assert flood.returncode == 0, err.decode()
    counts = json.loads(out.decode().strip().splitlines()[-1])
    assert counts["ok"] > 0 and not counts["errors"], counts  # the flood waits, it is not refused
    p99 = float(np.percentile(latencies, 99))
    print(
        f"trickle n={len(latencies)} p50={np.median(latencies) * 1e3:.1f} ms p99={p99 * 1e3:.1f} ms; "
        f"flood {counts}; server RSS idle {sampler.idle} peak {sampler.peak}"
    )
    assert len(latencies) >= 20
    assert p99 < 1.0, f"trickle p99 {p99 * 1e3:.0f} ms under a flood"
    growth = max(b - a for a, b in zip(sampler.idle, sampler.peak, strict=True))
    assert growth < 256 << 20, f"server RSS grew by {growth / 2**20:.0f} MiB under a flood"
    assert all(p.poll() is None for p in servers.procs)


@pytest.mark.timeout(30)
async def test_flood_past_tiny_max_inflight_waits_instead_of_failing(servers: ServerGroup) -> None:
    """Servers run with --max-inflight 2 and clients with 2 slots per connection; 400 calls wait."""
    client = await AsyncClient.connect(
        servers.addresses, secret=SECRET, use_shared_memory=False, max_inflight=2, call_timeout=20.0
    )
    try:
        n = client.book.num_nodes

        async def one(i: int) -> None:
            if i % 2:
                await client.barrier(f"b{i % 7}", timeout=10.0)  # async on the server: counts in flight
            else:
                await client.pull_numpy("node:feat", np.arange(i % n, min(i % n + 64, n)))

        results = await asyncio.gather(*(one(i) for i in range(400)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[:3]
    finally:
        await client.close()
