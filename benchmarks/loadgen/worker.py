"""Load-generator worker: one process driving a share of the clients, plus the latency histogram.

``benchmarks.loadgen`` spawns ``--processes`` of these. Each opens its clients (one ``AsyncClient``
per simulated client, so the servers see one connection per client and partition), waits for the
common start, drives the request mix closed-loop or open-loop, sends cumulative counts to the
parent every second and finally its latency histograms (HDR, encoded; merged by the parent).

Open loop is coordinated-omission-correct: request ``k`` of this process is *scheduled* at
``t0 + phase + k / rate`` and its latency is measured from that scheduled time, so a slow server
cannot lower the offered load or hide its queueing. A client keeps at most ``client_inflight``
requests in flight; a request scheduled while its client is full is counted as ``dropped`` instead
of being queued without limit.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

OPS = ("pull", "push", "sample")

# Latencies are recorded in microseconds, 1 µs .. 1 h, at 3 significant digits (0.1%).
HIST_UNIT_S = 1e-6
HIST_MAX_US = 3_600_000_000
HIST_DIGITS = 3
LATE_AFTER_S = 0.010


class LatencyHistogram:
    """Latency counts in an HDR histogram (the ``hdrhistogram`` library), mergeable across
    processes through its compressed encoding. Values are seconds; stored as whole microseconds
    at 3 significant digits, so a percentile is within 0.1% (or 1 µs) of the recorded value."""

    def __init__(self, hist: HdrHistogram | None = None) -> None:
        self.hist = hist if hist is not None else HdrHistogram(1, HIST_MAX_US, HIST_DIGITS)

    @property
    def total(self) -> int:
        return int(self.hist.get_total_count())

    @property
    def max_s(self) -> float:
        return float(self.hist.get_max_value()) * HIST_UNIT_S if self.total else 0.0

    def record(self, seconds: float) -> None:
        self.hist.record_value(min(max(1, round(seconds * 1e6)), HIST_MAX_US))

    def merge(self, other: LatencyHistogram) -> None:
        self.hist.add(other.hist)

    def percentile(self, q: float) -> float:
        """Latency at percentile ``q`` (0..100), in seconds."""
        if self.total == 0:
            return float("nan")
        return float(self.hist.get_value_at_percentile(q)) * HIST_UNIT_S

    def cdf(self) -> tuple[np.ndarray, np.ndarray]:
        """(latency in seconds, cumulative fraction) at every recorded value."""
        steps = [
            (it.value_iterated_to, it.total_count_to_this_value) for it in self.hist.get_recorded_iterator()
        ]
        if not steps:
            return np.empty(0), np.empty(0)
        values, counts = np.array(steps, dtype=np.float64).T
        return values * HIST_UNIT_S, counts / max(self.total, 1)

    def to_dict(self) -> dict[str, Any]:
        encoded = self.hist.encode()
        return {"hdr": encoded.decode() if isinstance(encoded, bytes) else str(encoded)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencyHistogram:
        return cls(HdrHistogram.decode(data["hdr"]))


@dataclass
class OpStats:
    """What one process measured for one op."""

    ok: int = 0
    rows: int = 0
    bytes: int = 0
    edges: int = 0
    dropped: int = 0
    late: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    hist: LatencyHistogram = field(default_factory=LatencyHistogram)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": self.rows,
            "bytes": self.bytes,
            "edges": self.edges,
            "dropped": self.dropped,
            "late": self.late,
            "errors": dict(self.errors),
            "hist": self.hist.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpStats:
        return cls(
            ok=data["ok"],
            rows=data["rows"],
            bytes=data["bytes"],
            edges=data["edges"],
            dropped=data["dropped"],
            late=data["late"],
            errors=dict(data["errors"]),
            hist=LatencyHistogram.from_dict(data["hist"]),
        )

    def merge(self, other: OpStats) -> None:
        self.ok += other.ok
        self.rows += other.rows
        self.bytes += other.bytes
        self.edges += other.edges
        self.dropped += other.dropped
        self.late += other.late
        for kind, count in other.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + count
        self.hist.merge(other.hist)


@dataclass
class WorkerConfig:
    """One process's share of the load (picklable; rates and budgets are already divided)."""

    servers: list[tuple[str, int]]
    secret: bytes | None
    mix: dict[str, float]
    rows: int
    fanout: int
    clients: int
    duration: float
    warmup: float
    rate: float | None
    phase: float
    max_requests: int | None
    client_inflight: int
    timeout: float
    use_shared_memory: bool
    feat_name: str
    push_name: str
    num_nodes: int
    feat_dim: int
    seed: int
    progress_interval: float = 1.0


def run_worker(cfg: WorkerConfig, index: int, queue: Any, start: Any) -> None:
    """Process entry point: report ('ready'|'tick'|'done'|'error', index, payload) on ``queue``."""
    try:
        try:
            import uvloop

            uvloop.install()
        except ImportError:  # pragma: no cover
            pass
        asyncio.run(_main(cfg, index, queue, start))
    except BaseException:
        queue.put(("error", index, traceback.format_exc()))


async def _main(cfg: WorkerConfig, index: int, queue: Any, start: Any) -> None:
    from asyncgraph.client import AsyncClient

    clients = [
        await AsyncClient.connect(
            cfg.servers,
            secret=cfg.secret,
            use_shared_memory=cfg.use_shared_memory,
            call_timeout=cfg.timeout,
            max_inflight=max(cfg.client_inflight, 1),
        )
        for _ in range(cfg.clients)
    ]
    try:
        queue.put(("ready", index, None))
        if not await asyncio.to_thread(start.wait, 120.0):
            raise RuntimeError("the parent never gave the start signal")
        driver = _Driver(cfg, clients, queue, index)
        result = await driver.run()
        queue.put(("done", index, result))
    finally:
        for client in clients:
            await client.close()


class _Driver:
    """Issues requests for one process and records what happened to them."""

    def __init__(self, cfg: WorkerConfig, clients: list[Any], queue: Any, index: int) -> None:
        self.cfg = cfg
        self.clients = clients
        self.queue = queue
        self.index = index
        self.rng = np.random.default_rng([cfg.seed, index])
        self.stats = {op: OpStats() for op in OPS}
        names = [op for op in OPS if cfg.mix.get(op, 0.0) > 0]
        weights = np.array([cfg.mix[op] for op in names], dtype=np.float64)
        self.op_names = names
        self.op_cdf = np.cumsum(weights / weights.sum())
        self.values = self.rng.standard_normal((cfg.rows, cfg.feat_dim), dtype=np.float32) * 1e-3
        self.issued = 0
        self.t0 = 0.0
        self.t_measure = 0.0
        self.t_end = 0.0
        self.ops: dict[str, Callable[[Any], Awaitable[tuple[int, int, int]]]] = {
            "pull": self._pull,
            "push": self._push,
            "sample": self._sample,
        }

    def _pick(self) -> str:
        return self.op_names[int(np.searchsorted(self.op_cdf, self.rng.random(), side="right"))]

    def _ids(self) -> np.ndarray:
        return self.rng.integers(0, self.cfg.num_nodes, self.cfg.rows, dtype=np.int64)

    async def _pull(self, client: Any) -> tuple[int, int, int]:
        out = await client.pull_numpy(self.cfg.feat_name, self._ids())
        return self.cfg.rows, int(out.nbytes), 0

    async def _push(self, client: Any) -> tuple[int, int, int]:
        await client.push(self.cfg.push_name, self._ids(), self.values, op="add")
        return self.cfg.rows, int(self.values.nbytes), 0

    async def _sample(self, client: Any) -> tuple[int, int, int]:
        src, dst, eids = await client.sample_neighbors(self._ids(), self.cfg.fanout)
        return self.cfg.rows, int(src.nbytes + dst.nbytes + eids.nbytes), int(src.size)

    async def _execute(self, op: str, client: Any, started: float) -> None:
        from asyncgraph.errors import AsyncGraphError

        stats = self.stats[op]
        try:
            rows, nbytes, edges = await self.ops[op](client)
        except (AsyncGraphError, OSError, TimeoutError) as exc:
            if started >= self.t_measure:
                kind = type(exc).__name__
                stats.errors[kind] = stats.errors.get(kind, 0) + 1
            return
        if started >= self.t_measure:
            stats.hist.record(time.perf_counter() - started)
            stats.ok += 1
            stats.rows += rows
            stats.bytes += nbytes
            stats.edges += edges

    def _budget_left(self) -> bool:
        return self.cfg.max_requests is None or self.issued < self.cfg.max_requests

    async def _closed_client(self, client: Any) -> None:
        while self._budget_left():
            now = time.perf_counter()
            if now >= self.t_end:
                return
            self.issued += 1
            await self._execute(self._pick(), client, now)

    async def _open_loop(self) -> None:
        cfg = self.cfg
        assert cfg.rate is not None and cfg.rate > 0
        interval = 1.0 / cfg.rate
        inflight = [0] * len(self.clients)
        tasks: set[asyncio.Task[None]] = set()
        k = 0
        while self._budget_left():
            scheduled = self.t0 + cfg.phase + k * interval
            if scheduled >= self.t_end:
                break
            delay = scheduled - time.perf_counter()
            await asyncio.sleep(max(delay, 0.0))
            ci = k % len(self.clients)
            k += 1
            op = self._pick()
            measured = scheduled >= self.t_measure
            if inflight[ci] >= cfg.client_inflight:
                if measured:
                    self.stats[op].dropped += 1
                continue
            if measured and time.perf_counter() - scheduled > LATE_AFTER_S:
                self.stats[op].late += 1
            self.issued += 1
            inflight[ci] += 1
            task = asyncio.ensure_future(self._execute(op, self.clients[ci], scheduled))
            tasks.add(task)

            def _done(t: asyncio.Task[None], ci: int = ci) -> None:
                inflight[ci] -= 1
                tasks.discard(t)

            task.add_done_callback(_done)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.progress_interval)
            self.queue.put(("tick", self.index, self._counts()))

    def _counts(self) -> dict[str, list[int]]:
        return {op: [s.ok, sum(s.errors.values()), s.dropped, s.bytes] for op, s in self.stats.items()}

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.t0 = time.perf_counter()
        self.t_measure = self.t0 + cfg.warmup
        self.t_end = self.t0 + cfg.warmup + cfg.duration
        ticker = asyncio.ensure_future(self._ticker())
        try:
            if cfg.rate is None:
                await asyncio.gather(*(self._closed_client(c) for c in self.clients))
            else:
                await self._open_loop()
        finally:
            ticker.cancel()
        finished = time.perf_counter()
        window = min(finished, self.t_end) - self.t_measure
        return {
            "ops": {op: s.to_dict() for op, s in self.stats.items()},
            "window_s": max(window, 1e-9),
            "drain_s": max(finished - self.t_end, 0.0),
            "issued": self.issued,
        }
