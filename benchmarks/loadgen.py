"""Load generator for asyncgraph servers: throughput, latency percentiles, overload, sweeps.

Starts its own servers (one per partition of ``--graph``, partitioned once and cached under
``benchmarks/data/loadgen/``) or drives running ones (``--ip-config``, ``--secret-file``), with
``--clients`` concurrent clients spread over ``--processes`` worker processes and a request mix::

    python -m benchmarks.loadgen --graph benchmarks/data/synth17.npz --partitions 2 \\
        --mix pull=0.7,push=0.2,sample=0.1 --rows 1000 --fanout 10 --clients 32 --processes 2 \\
        --duration 30                                   # closed loop: as fast as answered
    ... --rate 2000                                     # open loop: 2000 requests/s by the clock
    ... --sweep --sweep-clients 1,2,4,8,16,32,64 --sweep-partitions 1,2,4 --duration 5
    ... --overload --overload-factor 2 --duration 30    # saturate, then offer 2x that rate

Every run is bounded (``--duration``, ``--max-requests``, per-request ``--timeout``) and stops
every process it started. Reports per op: requests/s, rows/s, MB/s, latency p50/p95/p99/max
(from 1%-resolution log histograms merged across processes), errors by kind, requests dropped
by the open-loop generator, and the servers' idle/peak RSS and CPU; next to ceilings measured in
the same run (loopback socket bandwidth, a numpy gather of the same rows, the in-process sampling
kernel). Writes JSON and PNGs under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.loadgen_worker import OPS, LatencyHistogram, OpStats, WorkerConfig, run_worker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
CACHE = HERE / "data" / "loadgen"
PUSH_TENSOR = "node:loadgen_scratch"


# --- configuration ----------------------------------------------------------------------------
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


# --- servers ------------------------------------------------------------------------------------
def ensure_partitions(npz: Path, num_parts: int, cache: Path = CACHE) -> Path:
    """Partition ``npz`` into ``num_parts`` (random, seeded) once; returns the partition config."""
    name = npz.stem
    out = cache / f"{name}_random{num_parts}"
    config = out / f"{name}.json"
    if config.exists():
        return config
    from asyncgraph.graph import Graph
    from asyncgraph.partition import partition_graph

    t0 = time.perf_counter()
    tmp = cache / f".tmp-{name}-{num_parts}-{os.getpid()}"
    partition_graph(Graph.from_npz(npz), name, num_parts, tmp, part_method="random", overwrite=True)
    tmp.rename(out)
    print(f"partitioned {npz.name} into {num_parts} in {time.perf_counter() - t0:.1f} s -> {out}")
    return config


@dataclass
class Cluster:
    """Servers to drive: addresses, secret, and the PIDs we may watch (our own servers only)."""

    addresses: list[tuple[str, int]]
    secret: bytes | None
    pids: list[int]
    part_config: Path | None


@contextmanager
def own_servers(part_config: Path, num_parts: int, extra_args: list[str] | None = None) -> Iterator[Cluster]:
    """Start one server per partition (tests/servers.py) and always stop them."""
    sys.path.insert(0, str(ROOT / "tests"))
    from servers import start_servers  # type: ignore[import-not-found]

    workdir = Path(tempfile.mkdtemp(prefix="loadgen-"))
    secret = os.urandom(16).hex().encode()
    group = start_servers(part_config, workdir, num_parts=num_parts, secret=secret, extra_args=extra_args)
    try:
        yield Cluster(group.addresses, secret, [p.pid for p in group.procs], part_config)
    finally:
        group.stop()


async def _graph_meta(cluster: Cluster, need_push: bool) -> tuple[int, int, str]:
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


# --- ceilings -------------------------------------------------------------------------------------
def loopback_ceiling(total: int = 256 << 20, chunk: int = 4 << 20) -> float:
    """Bytes/s one TCP loopback stream carries (one sender thread, one receiver thread)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received = [0]

    def receive() -> None:
        conn, _ = listener.accept()
        buf = bytearray(chunk)
        view = memoryview(buf)
        with conn:
            while received[0] < total:
                n = conn.recv_into(view)
                if n == 0:
                    break
                received[0] += n

    thread = threading.Thread(target=receive)
    thread.start()
    payload = b"\0" * chunk
    with socket.create_connection(("127.0.0.1", port)) as sender:
        t0 = time.perf_counter()
        sent = 0
        while sent < total:
            sender.sendall(payload)
            sent += chunk
        thread.join()
        elapsed = time.perf_counter() - t0
    listener.close()
    return received[0] / elapsed


def _best(fn: Any, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gather_ceiling(part_config: Path, rows: int) -> dict[str, float]:
    """numpy gather of ``rows`` random rows of partition 0's features, in this process."""
    from asyncgraph.partition import load_partition

    part = load_partition(part_config, 0, mmap=False)
    feat = part.node_feats.get("feat", next(iter(part.node_feats.values())))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, feat.shape[0], rows)
    seconds = _best(lambda: feat[ids])
    row_bytes = int(feat[0].nbytes)
    return {"rows_per_s": rows / seconds, "MB_per_s": rows * row_bytes / seconds / 1e6, "seconds": seconds}


def sample_ceiling(part_config: Path, rows: int, fanout: int) -> dict[str, float]:
    """``sample_csc`` on partition 0 with ``rows`` random seeds, in this process."""
    from asyncgraph.kernels.sampling import sample_csc
    from asyncgraph.partition import load_partition

    part = load_partition(part_config, 0, mmap=False)
    rng = np.random.default_rng(0)
    seeds = rng.integers(0, part.num_owned_nodes, rows)
    out: list[int] = [0]

    def run() -> None:
        src, _, _ = sample_csc(part.indptr, part.indices, part.eids, seeds, fanout, False, rng)
        out[0] = int(src.size)

    seconds = _best(run)
    return {"seeds_per_s": rows / seconds, "edges_per_s": out[0] / seconds, "seconds": seconds}


def measure_ceilings(part_config: Path | None, rows: int, fanout: int) -> dict[str, Any]:
    """All ceilings for one row count (loopback always; the others need the partition files)."""
    result: dict[str, Any] = {"loopback_MB_per_s": loopback_ceiling() / 1e6}
    if part_config is not None:
        result["gather"] = gather_ceiling(part_config, rows)
        result["sample_kernel"] = sample_ceiling(part_config, rows, fanout)
    return result


# --- running a load point -------------------------------------------------------------------------
def run_load(cfg: LoadConfig, cluster: Cluster) -> dict[str, Any]:
    """Drive one load point against ``cluster``; returns the merged, summarised result."""
    num_nodes, dim, feat = asyncio.run(_graph_meta(cluster, cfg.mix.get("push", 0) > 0))
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


# --- reporting --------------------------------------------------------------------------------------
def format_report(result: dict[str, Any], ceilings: dict[str, Any] | None = None) -> str:
    """A plain table per op, the servers' resources and the ceilings."""
    cfg = result["config"]
    mode = f"open loop at {cfg['rate']:,.0f} req/s" if cfg["rate"] else "closed loop"
    lines = [
        f"{mode}, {cfg['clients']} clients in {cfg['processes']} processes, rows {cfg['rows']}, "
        f"fanout {cfg['fanout']}, window {result['window_s']:.1f} s",
        f"{'op':>7} {'req/s':>9} {'rows/s':>11} {'MB/s':>8} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'max ms':>8} {'dropped':>8}  errors",
    ]
    for op, r in result["ops"].items():
        errors = ", ".join(f"{k}={v}" for k, v in r["errors"].items()) or "none"
        lines.append(
            f"{op:>7} {r['requests_per_s']:>9,.0f} {r['rows_per_s']:>11,.0f} {r['MB_per_s']:>8,.1f} "
            f"{r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.1f} "
            f"{r['dropped']:>8}  {errors}"
        )
    srv = result["servers"]
    if "peak_rss" in srv:
        for i, (idle, peak, cpu) in enumerate(
            zip(srv["idle_rss"], srv["peak_rss"], srv["cpu_percent"], strict=True)
        ):
            lines.append(
                f"server {i}: RSS idle {idle / 2**20:,.0f} MiB, peak {peak / 2**20:,.0f} MiB, CPU {cpu:.0f}%"
            )
    if ceilings:
        lines.append(f"ceiling: loopback TCP {ceilings['loopback_MB_per_s']:,.0f} MB/s (one stream)")
        if "gather" in ceilings:
            g, k = ceilings["gather"], ceilings["sample_kernel"]
            lines.append(
                f"ceiling: numpy gather of {cfg['rows']} rows {g['rows_per_s']:,.0f} rows/s "
                f"({g['MB_per_s']:,.0f} MB/s); sample_csc {k['seeds_per_s']:,.0f} seeds/s "
                f"({k['edges_per_s']:,.0f} edges/s), one core, in-process"
            )
    return "\n".join(lines)


def plot_cdf(result: dict[str, Any], path: Path, title: str) -> None:
    """Latency CDF per op (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for op, r in result["ops"].items():
        x, y = LatencyHistogram.from_dict(r["hist"]).cdf()
        if x.size:
            ax.step(x * 1e3, y, where="post", label=f"{op} (p99 {r['p99_ms']:.1f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(points: list[dict[str, Any]], path: Path, title: str) -> None:
    """Throughput and p99 against client count, one line per partition count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for parts in sorted({p["partitions"] for p in points}):
        pts = sorted((p for p in points if p["partitions"] == parts), key=lambda p: p["clients"])
        xs = [p["clients"] for p in pts]
        ax1.plot(xs, [p["result"]["total"]["requests_per_s"] for p in pts], "o-", label=f"{parts} partitions")
        for op in pts[0]["result"]["ops"]:
            ax2.plot(
                xs, [p["result"]["ops"][op]["p99_ms"] for p in pts], "o-", label=f"{op}, {parts} partitions"
            )
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("requests/s (all ops)")
    ax2.set_ylabel("p99 latency (ms, log)")
    ax2.set_yscale("log")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def saturation(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per partition count: peak throughput, the fewest clients reaching 90% of it, and p99 there."""
    out: dict[str, Any] = {}
    for parts in sorted({p["partitions"] for p in points}):
        pts = sorted((p for p in points if p["partitions"] == parts), key=lambda p: p["clients"])
        peak = max(p["result"]["total"]["requests_per_s"] for p in pts)
        knee = next(p for p in pts if p["result"]["total"]["requests_per_s"] >= 0.9 * peak)
        out[str(parts)] = {
            "peak_requests_per_s": peak,
            "saturating_clients": knee["clients"],
            "p99_ms_at_knee": knee["result"]["total"]["p99_ms"],
            "p99_ms_at_max_clients": pts[-1]["result"]["total"]["p99_ms"],
            "max_clients": pts[-1]["clients"],
        }
    return out


def save(data: dict[str, Any], name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=float))
    return path


def _strip_hists(result: dict[str, Any]) -> dict[str, Any]:
    return {
        **result,
        "ops": {op: {k: v for k, v in r.items() if k != "hist"} for op, r in result["ops"].items()},
    }


# --- modes ------------------------------------------------------------------------------------------
@contextmanager
def cluster_for(args: argparse.Namespace, partitions: int) -> Iterator[Cluster]:
    """Our own servers for ``partitions`` parts of ``--graph``, or the ``--ip-config`` servers."""
    if args.ip_config:
        from asyncgraph.client.ipconfig import IpConfig

        secret = args.secret_file.read_bytes().strip() if args.secret_file else None
        yield Cluster(IpConfig.load(args.ip_config).addresses(), secret, [], args.part_config)
        return
    part_config = args.part_config or ensure_partitions(args.graph, partitions)
    extra = ["--max-inflight", str(args.server_max_inflight), "--log-level", "WARNING"]
    with own_servers(part_config, partitions, extra) as cluster:
        yield cluster


def single(args: argparse.Namespace, cfg: LoadConfig) -> dict[str, Any]:
    with cluster_for(args, args.partitions) as cluster:
        ceilings = measure_ceilings(cluster.part_config, cfg.rows, cfg.fanout)
        result = run_load(cfg, cluster)
    result["ceilings"] = ceilings
    print(format_report(result, ceilings))
    tag = args.tag or ("open" if cfg.rate else "closed")
    path = save(result, f"loadgen-{tag}")
    plot_cdf(result, RESULTS / f"loadgen-{tag}-cdf.png", f"latency CDF: {tag}, {cfg.clients} clients")
    print(f"wrote {path} and loadgen-{tag}-cdf.png")
    return result


def sweep(args: argparse.Namespace, cfg: LoadConfig) -> dict[str, Any]:
    clients = [int(c) for c in args.sweep_clients.split(",")]
    partitions = [int(p) for p in args.sweep_partitions.split(",")]
    points: list[dict[str, Any]] = []
    ceilings: dict[str, Any] = {}
    for parts in partitions:
        with cluster_for(args, parts) as cluster:
            if not ceilings:
                ceilings = measure_ceilings(cluster.part_config, cfg.rows, cfg.fanout)
            for c in clients:
                result = run_load(replace(cfg, clients=c), cluster)
                t = result["total"]
                print(
                    f"partitions {parts} clients {c:>3}: {t['requests_per_s']:>8,.0f} req/s "
                    f"{t['MB_per_s']:>7,.0f} MB/s p99 {t['p99_ms']:>8.2f} ms errors {t['errors']}"
                )
                points.append({"partitions": parts, "clients": c, "result": _strip_hists(result)})
    sat = saturation(points)
    tag = args.tag or "sweep"
    data = {"points": points, "saturation": sat, "ceilings": ceilings, "config": asdict(cfg)}
    path = save(data, f"loadgen-{tag}")
    mix = ",".join(f"{k}={v:g}" for k, v in cfg.mix.items())
    plot_sweep(points, RESULTS / f"loadgen-{tag}.png", f"closed loop, mix {mix}, rows {cfg.rows}")
    for key, s in sat.items():
        print(
            f"{key} partitions: saturates at ~{s['saturating_clients']} clients, "
            f"{s['peak_requests_per_s']:,.0f} req/s peak; p99 {s['p99_ms_at_knee']:.1f} ms there, "
            f"{s['p99_ms_at_max_clients']:.1f} ms at {s['max_clients']} clients"
        )
    print(f"wrote {path} and loadgen-{tag}.png")
    return data


def overload(args: argparse.Namespace, cfg: LoadConfig) -> dict[str, Any]:
    with cluster_for(args, args.partitions) as cluster:
        probe = run_load(replace(cfg, rate=None, duration=args.probe_duration), cluster)
        sat = probe["total"]["requests_per_s"]
        rate = args.overload_factor * sat
        print(
            f"saturation (closed loop, {cfg.clients} clients): {sat:,.0f} req/s; offering {rate:,.0f} req/s"
        )
        result = run_load(replace(cfg, rate=rate), cluster)
    print(format_report(result))
    srv, probe_srv = result["servers"], probe["servers"]
    idle = sum(probe_srv["idle_rss"])  # before any load, not after the probe
    peak = sum(max(a, b) for a, b in zip(probe_srv["peak_rss"], srv["peak_rss"], strict=True))
    errors: dict[str, int] = {}
    for r in result["ops"].values():
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    print(
        f"overload: servers RSS idle {idle / 2**20:,.0f} MiB -> peak {peak / 2**20:,.0f} MiB "
        f"(+{(peak - idle) / 2**20:,.0f} MiB); errors {errors or 'none'}; "
        f"dropped by the generator {result['total']['dropped']:,}"
    )
    tag = args.tag or "overload"
    data = {
        "saturation_probe": _strip_hists(probe),
        "saturation_requests_per_s": sat,
        "offered_requests_per_s": rate,
        "result": result,
        "rss_idle": idle,
        "rss_peak": peak,
        "errors": errors,
    }
    path = save(data, f"loadgen-{tag}")
    plot_cdf(
        result,
        RESULTS / f"loadgen-{tag}-cdf.png",
        f"overload: {rate:,.0f} req/s offered ({args.overload_factor}x saturation)",
    )
    print(f"wrote {path} and loadgen-{tag}-cdf.png")
    return data


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = ap.add_argument_group("servers")
    src.add_argument(
        "--graph", type=Path, default=HERE / "data" / "synth17.npz", help="npz to partition and serve"
    )
    src.add_argument("--part-config", type=Path, help="serve this partition config instead of --graph")
    src.add_argument("--partitions", type=int, default=1)
    src.add_argument("--ip-config", type=Path, help="drive running servers instead of starting our own")
    src.add_argument("--secret-file", type=Path, help="their shared secret (with --ip-config)")
    src.add_argument("--server-max-inflight", type=int, default=64, help="--max-inflight of our servers")
    load = ap.add_argument_group("load")
    load.add_argument("--mix", default="pull=0.7,push=0.2,sample=0.1")
    load.add_argument("--rows", type=int, default=1000, help="IDs per request (seeds for sample)")
    load.add_argument("--fanout", type=int, default=10)
    load.add_argument("--clients", type=int, default=8)
    load.add_argument("--processes", type=int, default=2)
    load.add_argument("--duration", type=float, default=10.0, help="measured seconds (after --warmup)")
    load.add_argument("--warmup", type=float, default=0.5)
    load.add_argument("--rate", type=float, help="open loop: offered requests/s (default closed loop)")
    load.add_argument("--max-requests", type=int, help="stop after this many requests")
    load.add_argument("--client-inflight", type=int, default=4, help="open loop: in flight per client")
    load.add_argument("--timeout", type=float, default=5.0, help="per-request timeout (s)")
    load.add_argument("--shared-memory", action="store_true", help="let co-located clients bypass TCP")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--no-progress", action="store_true")
    modes = ap.add_argument_group("modes")
    modes.add_argument("--sweep", action="store_true", help="sweep clients x partitions (closed loop)")
    modes.add_argument("--sweep-clients", default="1,2,4,8,16,32,64")
    modes.add_argument("--sweep-partitions", default="1,2,4")
    modes.add_argument("--overload", action="store_true", help="saturate, then offer --overload-factor x")
    modes.add_argument("--overload-factor", type=float, default=2.0)
    modes.add_argument("--probe-duration", type=float, default=5.0)
    ap.add_argument("--tag", help="result file name suffix")
    return ap


def main(argv: list[str] | None = None) -> None:
    """CLI entry point."""
    args = build_parser().parse_args(argv)
    if args.secret_file and not args.ip_config:
        raise SystemExit("--secret-file goes with --ip-config")
    cfg = LoadConfig(
        mix=parse_mix(args.mix),
        rows=args.rows,
        fanout=args.fanout,
        clients=args.clients,
        processes=args.processes,
        duration=args.duration,
        warmup=args.warmup,
        rate=args.rate,
        max_requests=args.max_requests,
        client_inflight=args.client_inflight,
        timeout=args.timeout,
        use_shared_memory=args.shared_memory,
        seed=args.seed,
        progress=not args.no_progress,
    )
    if args.sweep:
        sweep(args, cfg)
    elif args.overload:
        overload(args, cfg)
    else:
        single(args, cfg)


if __name__ == "__main__":
    main()
