"""One load point: spread clients over worker processes, watch the servers, merge the results."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.loadgen.cluster import PUSH_TENSOR, Cluster, ServerMonitor, graph_meta
from benchmarks.loadgen.worker import OPS, LatencyHistogram, OpStats, WorkerConfig, run_worker


@dataclass
class LoadConfig:
    """One load point."""

    mix: dict[str, float]
    rows: int = 1000
    fanout: int = 10
    clients: int = 8
    processes: int = 2
    duration: float = 5.0
    warmup: float = 0.5
    rate: float | None = None
    max_requests: int | None = None
    client_inflight: int = 4
    timeout: float = 5.0
    use_shared_memory: bool = False
    seed: int = 0
    progress: bool = True


def parse_mix(text: str) -> dict[str, float]:
    """``pull=0.7,push=0.2,sample=0.1`` -> weights (normalised to sum 1)."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        name = name.strip()
        if name not in OPS:
            raise ValueError(f"unknown op {name!r} in --mix; expected some of {list(OPS)}")
        mix[name] = float(weight) if weight else 1.0
    total = sum(mix.values())
    if total <= 0 or any(w < 0 for w in mix.values()):
        raise ValueError(f"--mix weights must be non-negative and not all zero: {text!r}")
    return {k: v / total for k, v in mix.items()}


def run_load(cfg: LoadConfig, cluster: Cluster) -> dict[str, Any]:
    """Drive one load point against ``cluster``; returns the merged, summarised result."""
    num_nodes, dim, feat = asyncio.run(graph_meta(cluster, cfg.mix.get("push", 0) > 0))
    procs = max(1, min(cfg.processes, cfg.clients))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = ctx.Event()
    workers = []
    for i in range(procs):
        share = cfg.clients // procs + (1 if i < cfg.clients % procs else 0)
        wcfg = WorkerConfig(
            servers=cluster.addresses,
            secret=cluster.secret,
            mix=cfg.mix,
            rows=cfg.rows,
            fanout=cfg.fanout,
            clients=share,
            duration=cfg.duration,
            warmup=cfg.warmup,
            rate=None if cfg.rate is None else cfg.rate / procs,
            phase=0.0 if cfg.rate is None else i / cfg.rate,
            max_requests=None if cfg.max_requests is None else -(-cfg.max_requests // procs),
            client_inflight=cfg.client_inflight,
            timeout=cfg.timeout,
            use_shared_memory=cfg.use_shared_memory,
            feat_name=feat,
            push_name=PUSH_TENSOR,
            num_nodes=num_nodes,
            feat_dim=dim,
            seed=cfg.seed,
        )
        proc = ctx.Process(target=run_worker, args=(wcfg, i, queue, start), daemon=True)
        proc.start()
        workers.append(proc)
    monitor = ServerMonitor(cluster)
    results: dict[int, dict[str, Any]] = {}
    try:
        ready = 0
        deadline = time.monotonic() + 120
        while ready < procs:
            kind, index, payload = queue.get(timeout=max(deadline - time.monotonic(), 0.1))
            if kind == "error":
                raise RuntimeError(f"load worker {index} failed:\n{payload}")
            ready += kind == "ready"
        idle_rss, _ = monitor.sample()
        monitor.start()
        t_start = time.perf_counter()
        start.set()
        ticks: dict[int, dict[str, list[int]]] = {}
        hard_deadline = t_start + cfg.warmup + cfg.duration + cfg.timeout + 60
        while len(results) < procs:
            try:
                kind, index, payload = queue.get(timeout=1.0)
            except Exception:  # queue.Empty
                kind, index, payload = "idle", -1, None
            if kind == "error":
                raise RuntimeError(f"load worker {index} failed:\n{payload}")
            if kind == "tick":
                ticks[index] = payload
            elif kind == "done":
                results[index] = payload
            if time.perf_counter() > hard_deadline:
                raise RuntimeError("load workers did not finish in time")
            if cfg.progress and kind in ("tick", "idle"):
                _progress(ticks, time.perf_counter() - t_start, cfg, monitor)
        monitor.stop()
    finally:
        monitor.stop()
        start.set()
        for proc in workers:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    if cfg.progress:
        print(file=sys.stderr)
    return summarise(cfg, list(results.values()), monitor.summary(idle_rss))


def _progress(
    ticks: dict[int, dict[str, list[int]]], elapsed: float, cfg: LoadConfig, mon: ServerMonitor
) -> None:
    total = {op: [sum(t[op][j] for t in ticks.values()) for j in range(4)] for op in OPS}
    measured = max(elapsed - cfg.warmup, 1e-9)
    parts = [
        f"{op} {c[0] / measured:,.0f}/s err {c[1]} drop {c[2]}" for op, c in total.items() if cfg.mix.get(op)
    ]
    mb = sum(c[3] for c in total.values()) / measured / 1e6
    line = f"\r[{elapsed:5.1f}/{cfg.warmup + cfg.duration:.0f}s] " + " | ".join(parts)
    line += f" | {mb:,.0f} MB/s | server RSS {mon.latest_rss() / 2**20:,.0f} MiB"
    print(line.ljust(120), end="", file=sys.stderr, flush=True)


def summarise(cfg: LoadConfig, results: list[dict[str, Any]], servers: dict[str, Any]) -> dict[str, Any]:
    """Merge the workers' results into per-op figures."""
    window = float(np.mean([r["window_s"] for r in results]))
    merged = {op: OpStats() for op in OPS}
    for r in results:
        for op in OPS:
            merged[op].merge(OpStats.from_dict(r["ops"][op]))
    ops: dict[str, Any] = {}
    for op, s in merged.items():
        if not cfg.mix.get(op):
            continue
        h = s.hist
        ops[op] = {
            "requests": s.ok,
            "requests_per_s": s.ok / window,
            "rows_per_s": s.rows / window,
            "MB_per_s": s.bytes / window / 1e6,
            "edges_per_s": s.edges / window,
            "p50_ms": h.percentile(50) * 1e3,
            "p95_ms": h.percentile(95) * 1e3,
            "p99_ms": h.percentile(99) * 1e3,
            "max_ms": h.max_s * 1e3,
            "errors": s.errors,
            "dropped": s.dropped,
            "late": s.late,
            "hist": h.to_dict(),
        }
    total_ok = sum(s.ok for s in merged.values())
    all_hist = LatencyHistogram()
    for s in merged.values():
        all_hist.merge(s.hist)
    return {
        "config": asdict(cfg),
        "window_s": window,
        "drain_s": max(r["drain_s"] for r in results),
        "total": {
            "requests_per_s": total_ok / window,
            "MB_per_s": sum(s.bytes for s in merged.values()) / window / 1e6,
            "p99_ms": all_hist.percentile(99) * 1e3,
            "errors": sum(sum(s.errors.values()) for s in merged.values()),
            "dropped": sum(s.dropped for s in merged.values()),
        },
        "ops": ops,
        "servers": servers,
    }
