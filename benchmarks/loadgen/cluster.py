"""Servers to drive: our own (one per partition, started and always stopped) or running ones."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.testing import start_servers
from benchmarks.common import DATA, graph_npz, partitioned, wait_for_sampler

CACHE = DATA / "loadgen"
PUSH_TENSOR = "node:loadgen_scratch"


def ensure_partitions(npz: Path, num_parts: int, cache: Path = CACHE) -> Path:
    """Partition ``npz`` into ``num_parts`` (random, seeded) once; returns the partition config."""
    return partitioned(npz, num_parts, "random", cache=cache)


@dataclass
class Cluster:
    """Servers to drive: addresses, secret, and the PIDs we may watch (our own servers only)."""

    addresses: list[tuple[str, int]]
    secret: bytes | None
    pids: list[int]
    part_config: Path | None


@contextmanager
def own_servers(
    part_config: Path, num_parts: int, extra_args: list[str] | None = None, num_servers: int = 1
) -> Iterator[Cluster]:
    """Start ``num_servers`` processes per partition (``asyncgraph.testing``: a primary and
    replicas) and always stop them; ``pids`` covers every process."""
    workdir = Path(tempfile.mkdtemp(prefix="loadgen-"))
    secret = os.urandom(16).hex().encode()
    group = start_servers(
        part_config,
        workdir,
        num_parts=num_parts,
        secret=secret,
        extra_args=extra_args,
        num_servers=num_servers,
    )
    try:
        wait_for_sampler(group.addresses, secret)
        yield Cluster(group.addresses, secret, [p.pid for p in group.procs], part_config)
    finally:
        group.stop()


def config_partitions(part_config: Path) -> int:
    """How many partitions ``part_config`` has (each gets its own server)."""
    from asyncgraph.cli import part_config_checked

    return int(part_config_checked(part_config).num_parts)


@contextmanager
def cluster_for(args: argparse.Namespace, partitions: int) -> Iterator[Cluster]:
    """The ``--ip-config`` servers; else our own: one per partition of ``--part-config``, or of
    ``--graph`` cut into ``partitions`` parts (cached)."""
    if args.ip_config:
        from asyncgraph.client.ipconfig import IpConfig

        secret = args.secret_file.read_bytes().strip() if args.secret_file else None
        yield Cluster(IpConfig.load(args.ip_config).addresses(), secret, [], args.part_config)
        return
    if args.part_config:
        part_config = args.part_config
        partitions = config_partitions(part_config)
    else:
        part_config = ensure_partitions(graph_npz(args), partitions)
    extra = ["--max-inflight", str(args.server_max_inflight), "--log-level", "WARNING"]
    with own_servers(part_config, partitions, extra, num_servers=args.servers_per_partition) as cluster:
        yield cluster


async def graph_meta(cluster: Cluster, need_push: bool) -> tuple[int, int, str]:
    """(num_nodes, feature dim, feature tensor name); creates the push target when needed."""
    from asyncgraph.client import AsyncClient

    client = await AsyncClient.connect(cluster.addresses, secret=cluster.secret, use_shared_memory=False)
    try:
        names = client.tensor_names()
        feat = "node:feat" if "node:feat" in names else next(n for n in names if n.startswith("node:"))
        meta = await client.tensor_meta(feat)
        dim = int(np.prod(meta.shape[1:]))
        if need_push:
            await client.create_tensor(PUSH_TENSOR, "node", [client.book.num_nodes, dim], "float32")
        return client.book.num_nodes, dim, feat
    finally:
        await client.close()


# --- server monitoring --------------------------------------------------------------------------
class ServerMonitor:
    """Samples the servers' RSS and CPU time: psutil on our PIDs, else the 'stats' op."""

    def __init__(self, cluster: Cluster, interval: float = 0.2) -> None:
        self.cluster = cluster
        self.interval = interval
        self.samples: list[tuple[float, list[int], list[float]]] = []  # (t, rss, cpu seconds)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> tuple[list[int], list[float]]:
        if self.cluster.pids:
            import psutil

            rss, cpu = [], []
            for pid in self.cluster.pids:
                try:
                    proc = psutil.Process(pid)
                    times = proc.cpu_times()
                    rss.append(int(proc.memory_info().rss))
                    cpu.append(float(times.user + times.system))
                except psutil.Error:
                    rss.append(0)
                    cpu.append(float("nan"))
            return rss, cpu
        return asyncio.run(self._stats())

    async def _stats(self) -> tuple[list[int], list[float]]:
        from asyncgraph.client import AsyncClient

        client = await AsyncClient.connect(
            self.cluster.addresses, secret=self.cluster.secret, use_shared_memory=False
        )
        try:
            stats = await client.server_stats()
        finally:
            await client.close()
        return [int(s["rss"]) for s in stats], [float(s["cpu_user"] + s["cpu_system"]) for s in stats]

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss, cpu = self.sample()
            self.samples.append((time.perf_counter(), rss, cpu))
            self._stop.wait(self.interval)

    def start(self) -> None:
        self.samples.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def latest_rss(self) -> int:
        return sum(self.samples[-1][1]) if self.samples else 0

    def summary(self, idle_rss: list[int]) -> dict[str, Any]:
        if len(self.samples) < 2:
            return {"idle_rss": idle_rss}
        (t0, _, c0), (t1, _, c1) = self.samples[0], self.samples[-1]
        peak = [max(s[1][i] for s in self.samples) for i in range(len(idle_rss))]
        return {
            "idle_rss": idle_rss,
            "peak_rss": peak,
            "cpu_percent": [100.0 * (b - a) / max(t1 - t0, 1e-9) for a, b in zip(c0, c1, strict=True)],
        }
