"""End-to-end training benchmark: one GraphSAGE epoch on the synthetic graph, 2 servers.

Set-up: by default the scale-20 synthetic graph (2**20 nodes, ~10.6M edges, 10% train nodes;
``--graph PATH.npz`` for another) partitioned with METIS into 2 parts, one server per part, fanouts
``[10, 25]``, batch 1000, hidden 256, Adam, DDP over gloo. Cases:

* ``2 trainers, prefetch 0`` and ``prefetch 2``: per-batch breakdown (sample, pull, compute,
  waiting for data) of a steady-state epoch (the last of ``--epochs``; the first also warms up).
  With 2 trainers on a 2-core machine every trainer uses one torch thread.
* ``1 trainer, torch.set_num_threads(1), prefetch 2``: epoch time against
  ``max(data time, compute time)`` of the same run (data = sample + pull, done on the client's
  loop thread while the training loop computes).
* ``sample_neighbors`` for 1,024 uniformly random seeds, fanout 10, one request in flight:
  requests/s and sampled edges/s, distributed (servers started here, and timed once they
  sample with the compiled kernel; both co-located partitions through shared memory, only the
  trainer's own one (DGL's setting), and everything over the socket) and standalone
  (in-process stores). The ``trainers2_*`` rows run one trainer process per partition at once
  and add their rates, as DGL's harness does: those are the figures divided by DGL's.

Trainers are ``examples/train_dist.py`` processes started here (``asyncgraph.testing`` starts
the servers), so what is measured is what a user runs. Writes ``benchmarks/results/train_bench.json``
and ``benchmarks/results/train_bench.png`` (stacked per-batch bars, prefetch 0 vs 2).

Run: ``.venv/bin/python -m benchmarks.train_bench`` (about 2-3 minutes; ``--quick`` for a
smoke run of a few batches). Ratios to another system only with ``--dgl-results R.json`` from a
same-day run (``"training": {"epoch_s", "per_batch_ms"}``, ``"sample_neighbors": {"distributed":
{"requests_per_s"}, "standalone": {...}}``; see ``benchmarks.common.load_reference``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.launch.processes import free_port
from asyncgraph.testing import start_servers
from benchmarks.common import (
    RESULTS,
    ROOT,
    add_graph_options,
    add_reference_option,
    graph_npz,
    load_reference,
    partitioned,
    provenance,
    subprocess_env,
    wait_for_sampler,
)

TARGETS = {"wait_fraction": 0.15, "single_thread_ratio": 1.2}


# --- training runs ------------------------------------------------------------------------------
def run_training(
    part_config: Path,
    *,
    trainers: int,
    prefetch: int,
    threads: int,
    epochs: int,
    max_batches: int,
    timeout: float,
    extra: tuple[str, ...] = (),
    device: str = "cpu",
    sync_copy: bool = False,
) -> list[dict[str, Any]]:
    """Start 2 servers and ``trainers`` train_dist.py processes; every rank's summary."""
    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        workdir = Path(tmp)
        group = start_servers(part_config, workdir, num_parts=2, num_clients=trainers)
        try:
            wait_for_sampler(group.addresses)  # time the steady state, not the kernel's loading
            ip_config = group.ip_config()
            port = free_port()
            procs = []
            for rank in range(trainers):
                env = {
                    **os.environ,
                    "PYTHONPATH": subprocess_env()["PYTHONPATH"],
                    "ASYNCGRAPH_IP_CONFIG": str(ip_config),
                    "ASYNCGRAPH_PART_CONFIG": str(part_config),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(trainers),
                    "LOCAL_RANK": str(rank),
                }
                cmd = [
                    sys.executable, str(ROOT / "examples" / "train_dist.py"),
                    "--part-config", str(part_config),
                    "--epochs", str(epochs), "--eval-every", "0", "--no-progress",
                    "--fanouts", "10,25", "--batch-size", "1000", "--hidden", "256",
                    "--prefetch", str(prefetch), "--num-threads", str(threads),
                    "--max-batches", str(max_batches),
                    "--result-file", str(workdir / "result{rank}.json"), *extra,
                    "--device", device if device != "cuda" else f"cuda:{rank}",
                ]  # fmt: skip
                if sync_copy:
                    cmd.append("--sync-copy")
                log = open(workdir / f"trainer{rank}.log", "wb")  # noqa: SIM115 (closed below)
                procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
            deadline = time.monotonic() + timeout
            failed = None
            for rank, (proc, _log) in enumerate(procs):
                try:
                    code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = None
                if code != 0 and failed is None:
                    failed = rank
            for proc, log in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
                log.close()
            if failed is not None:
                text = (workdir / f"trainer{failed}.log").read_text(errors="replace")
                raise RuntimeError(f"trainer {failed} failed or timed out:\n{text[-4000:]}")
            return [json.loads((workdir / f"result{r}.json").read_text()) for r in range(trainers)]
        finally:
            group.stop()


def breakdown(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-batch milliseconds of the last epoch, averaged over ranks; epoch time = slowest rank."""
    last = [s["epoch_stats"][-1] for s in summaries]
    batches = int(np.mean([e["batches"] for e in last]))
    per_batch = {
        k: round(1000 * float(np.mean([e.get(k, 0.0) / max(e["batches"], 1) for e in last])), 2)
        for k in ("sample", "pull", "compute", "wait", "copy")
    }
    epoch = max(e["time"] for e in last)
    data = float(np.mean([e["sample"] + e["pull"] for e in last]))
    compute = float(np.mean([e["compute"] for e in last]))
    return {
        "batches_per_trainer": batches,
        "epoch_s": round(epoch, 3),
        "per_batch_ms": per_batch,
        "wait_fraction": round(float(np.mean([e["wait"] / e["time"] for e in last])), 4),
        "data_s": round(data, 3),
        "compute_s": round(compute, 3),
        "epoch_over_max_data_compute": round(epoch / max(data, compute, 1e-9), 3),
        "first_epoch_s": round(max(s["epoch_stats"][0]["time"] for s in summaries), 3),
        "per_batch_traffic": per_batch_traffic(last),
        "per_rank": [s["epoch_stats"] for s in summaries],
    }


def per_batch_traffic(last: list[dict[str, Any]]) -> dict[str, float]:
    """Request waves, remote feature rows/bytes and requests per batch (mean over ranks), and the
    feature cache's hit rate: load-independent figures."""
    if not all("traffic" in e for e in last):
        return {}
    out: dict[str, float] = {}
    for key in ("waves", "remote_requests", "remote_rows", "remote_bytes"):
        out[key] = round(float(np.mean([e["traffic"][key] / max(e["batches"], 1) for e in last])), 2)
    # share of the remote rows a batch needs that the cache served (misses: rows that crossed a
    # socket, whether pulled or carried by a sample answer)
    hits = sum(e["traffic"]["cache_hits"] for e in last)
    lookups = hits + sum(e["traffic"]["remote_rows"] for e in last)
    out["cache_hit_rate"] = round(hits / lookups, 4) if lookups else 0.0
    out["cache_rows"] = float(np.mean([e.get("cache", {}).get("rows", 0) for e in last]))
    return out


TRAFFIC_CASES = {  # name: (carry features with the last sampling layer, cache fraction of remote nodes)
    "two_waves_no_cache": (False, 0.0),
    "carried_no_cache": (True, 0.0),
    "two_waves_cache5": (False, 0.05),
    "two_waves_cache10": (False, 0.10),
    "two_waves_cache20": (False, 0.20),
    "carried_cache5": (True, 0.05),
    "carried_cache10": (True, 0.10),
    "carried_cache20": (True, 0.20),
}


def traffic_cases(
    part_config: Path, max_batches: int, timeout: float, only: set[str] | None = None
) -> dict[str, Any]:
    """Per-batch waves, remote bytes and cache hit rates of 2 trainers (2 servers) with the
    training step replaced by a 1 ms sleep: what requests a batch needs, independent of load.
    Each trainer maps only its own partition (as on a host of its own); the other is remote."""
    out: dict[str, Any] = {}
    for name, (carry, fraction) in TRAFFIC_CASES.items():
        if only and name not in only:
            continue
        extra = ("--sim-ms", "1", "--cache-fraction", str(fraction), "--attach", "own")
        if carry:
            extra += ("--carry-features",)
        summaries = run_training(
            part_config, trainers=2, prefetch=2, threads=1, epochs=1, max_batches=max_batches,
            timeout=timeout, extra=extra,
        )  # fmt: skip
        t = per_batch_traffic([s["epoch_stats"][-1] for s in summaries])
        out[name] = {"carry_features": carry, "cache_fraction": fraction, **t}
        print(
            f"traffic {name:20s} waves/batch {t['waves']:5.2f}  "
            f"remote KiB/batch {t['remote_bytes'] / 1024:9.1f}  "
            f"requests/batch {t['remote_requests']:5.2f}  cache hit rate {100 * t['cache_hit_rate']:5.1f}% "
            f"({t['cache_rows']:.0f} rows)",
            flush=True,
        )
    base = out.get("two_waves_no_cache", {}).get("remote_bytes")
    for r in out.values():
        r["remote_bytes_vs_no_cache"] = round(r["remote_bytes"] / base, 3) if base else None
    return out


def sim_cases(part_config: Path, epochs: int, max_batches: int, timeout: float) -> dict[str, Any]:
    """The accelerator-like epoch: forward/backward replaced by a sleep of S ms (CPU free), 2
    trainers, prefetch 2; the limit is batches x S. ``spin10_workers1``: the 10 ms step spins in
    Python instead (it holds the GIL, as a GPU loop launching kernels does), each trainer with one
    loader worker process (``benchmarks.gpu_suite`` has its limit from the data path too)."""
    out: dict[str, Any] = {}
    cases = [(f"sim{ms}", ms, ("--sim-ms", str(ms))) for ms in (10, 40)]
    cases.append(("spin10_workers1", 10, ("--sim-ms", "10", "--sim-holds-gil", "--num-workers", "1")))
    for name, sim_ms, extra in cases:
        summaries = run_training(
            part_config, trainers=2, prefetch=2, threads=1, epochs=epochs, max_batches=max_batches,
            timeout=timeout, extra=extra,
        )  # fmt: skip
        r = breakdown(summaries)
        limit = r["batches_per_trainer"] * sim_ms / 1000
        out[name] = {
            "sim_ms": sim_ms,
            "batches_per_trainer": r["batches_per_trainer"],
            "epoch_s": r["epoch_s"],
            "limit_s": round(limit, 3),
            "epoch_over_limit": round(r["epoch_s"] / limit, 3) if limit else None,
            "wait_fraction": r["wait_fraction"],
            "per_batch_ms": r["per_batch_ms"],
            "per_batch_traffic": r["per_batch_traffic"],
        }
        print(
            f"sim {sim_ms:3d} ms  {r['batches_per_trainer']:4d} batches/trainer  "
            f"epoch {r['epoch_s']:7.3f} s  "
            f"limit {limit:7.3f} s  epoch/limit {out[name]['epoch_over_limit']}  ({name})",
            flush=True,
        )
    return out


# --- sample_neighbors ---------------------------------------------------------------------------
async def _sample_rate(
    aio: Any,
    num_nodes: int,
    seconds: float,
    max_requests: int,
    stream: int = 0,
    start: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Sequential ``sample_neighbors`` of 1,024 random seeds, fanout 10, for ``seconds``;
    ``stream`` picks the seed sets, ``start`` (blocking, run in a thread) is waited for after
    the warm-up (trainers that start timing together)."""
    rng = np.random.default_rng(stream)
    seed_sets = [rng.choice(num_nodes, 1024, replace=False) for _ in range(64)]
    for i in range(5):  # warm-up
        await aio.sample_neighbors(seed_sets[i], 10, seed=i)
    if start is not None:
        await asyncio.to_thread(start)
    edges = 0
    count = 0
    t0 = time.perf_counter()
    while count < max_requests and time.perf_counter() - t0 < seconds:
        src, _, _ = await aio.sample_neighbors(seed_sets[count % 64], 10, seed=count)
        edges += src.size
        count += 1
    dt = time.perf_counter() - t0
    return {
        "requests": count,
        "requests_per_s": round(count / dt, 1),
        "edges_per_s": round(edges / dt, 1),
        "edges_per_request": round(edges / count, 1),
    }


# DGL's harness times sample_neighbors in both trainers at once and adds their rates; these modes
# do the same (one trainer process per partition, each attaching only its own partition in the
# DGL-like mode), so their figures are the ones to divide by DGL's.
TRAINER_MODES = ("own_partition_shm", "socket", "shm")


def _trainer_connect_kwargs(mode: str, rank: int) -> dict[str, Any]:
    """``Client.connect`` options of a trainer of ``TRAINER_MODES``: only its own partition in
    shared memory (DGL's setting), everything over the socket, or both co-located partitions
    (our single-host default)."""
    if mode == "own_partition_shm":
        return {"local_partitions": [rank]}
    return {"use_shared_memory": False} if mode == "socket" else {}


def _sampling_trainer(
    addresses: list[tuple[str, int]],
    mode: str,
    rank: int,
    num_nodes: int,
    seconds: float,
    max_requests: int,
    ready: Any,
    start: Any,
    results: Any,
) -> None:
    """One trainer process of ``trainers_sample_rate``: connect, warm up, wait, time, report."""
    from asyncgraph.client.sync_client import Client
    from asyncgraph.dataloading import relabel_kernel
    from asyncgraph.kernels import compiled

    compiled.wait_ready(120)
    relabel_kernel.wait_ready(120)
    client = Client.connect(addresses, **_trainer_connect_kwargs(mode, rank))
    try:

        def go() -> None:
            ready.put(rank)
            start.wait(120)

        rate = client.loop.run(
            _sample_rate(client.async_client, num_nodes, seconds, max_requests, stream=999 + rank, start=go)
        )
        results.put((rank, rate))
    finally:
        client.loop.run(client.async_client.close())
        client.loop.stop()


def trainers_sample_rate(
    addresses: list[tuple[str, int]], mode: str, num_nodes: int, seconds: float, max_requests: int
) -> dict[str, Any]:
    """``sample_neighbors`` timed in one trainer process per partition at once (DGL's harness:
    2 trainers, each its own seeds); ``requests_per_s`` is the sum of their rates."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=_sampling_trainer,
            args=(addresses, mode, rank, num_nodes, seconds, max_requests, ready, start, results),
        )
        for rank in range(len(addresses))
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=180)
        start.set()
        per_trainer = dict(results.get(timeout=seconds + 120) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    rates = [per_trainer[r] for r in sorted(per_trainer)]
    return {
        "trainers": len(rates),
        "requests_per_s": round(sum(r["requests_per_s"] for r in rates), 1),
        "edges_per_s": round(sum(r["edges_per_s"] for r in rates), 1),
        "per_trainer": rates,
    }


def sample_bench(part_config: Path, seconds: float, max_requests: int) -> dict[str, Any]:
    from asyncgraph.client.async_client import AsyncClient
    from asyncgraph.client.sync_client import Client
    from asyncgraph.dataloading import relabel_kernel
    from asyncgraph.kernels import compiled

    compiled.wait_ready(120)  # the steady state: the compiled sampler loaded (servers load it at start)
    relabel_kernel.wait_ready(120)  # and the loaders' compiled relabelling
    out: dict[str, Any] = {}
    standalone = AsyncClient.standalone(part_config)
    num_nodes = standalone.book.num_nodes
    out["standalone"] = asyncio.run(_sample_rate(standalone, num_nodes, seconds, max_requests))
    del standalone
    with tempfile.TemporaryDirectory(prefix="sample-bench-") as tmp:
        group = start_servers(part_config, Path(tmp), num_parts=2, num_clients=1)
        try:
            wait_for_sampler(group.addresses)
            modes: dict[str, dict[str, Any]] = {
                # both co-located partitions through shared memory (our single-host default)
                "distributed_shm": {},
                # only the trainer's own partition in shared memory, the other over the socket:
                # DGL's setting (its trainers read their own partition's shared memory)
                "distributed_own_partition_shm": {"local_partitions": [0]},
                "distributed_socket": {"use_shared_memory": False},
            }
            for mode, kwargs in modes.items():
                client = Client.connect(group.addresses, **kwargs)
                try:
                    out[mode] = client.loop.run(
                        _sample_rate(client.async_client, num_nodes, seconds, max_requests)
                    )
                finally:
                    client.loop.run(client.async_client.close())
                    client.loop.stop()
            for mode in TRAINER_MODES:
                out[f"trainers2_{mode}"] = trainers_sample_rate(
                    group.addresses, mode, num_nodes, seconds, max_requests
                )
        finally:
            group.stop()
    return out


# --- report -------------------------------------------------------------------------------------
def ratios(results: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """Our figures over the reference's (same-day run): epoch time and sampling rates."""
    vs: dict[str, float] = {}
    theirs = ref.get("training", {})
    if "prefetch2" in results["training"] and "epoch_s" in theirs:
        vs["epoch_time_ratio"] = round(results["training"]["prefetch2"]["epoch_s"] / theirs["epoch_s"], 3)
    for mode, r in results.get("sample_neighbors", {}).items():
        if mode != "standalone" and not mode.startswith("trainers2_"):
            continue  # one client: not DGL's figure, which adds two trainers' rates
        key = "standalone" if mode == "standalone" else "distributed"
        rate = ref.get("sample_neighbors", {}).get(key, {}).get("requests_per_s")
        if rate:
            vs[f"sample_{mode}_rate_ratio"] = round(r["requests_per_s"] / rate, 3)
    return vs


def plot(results: dict[str, Any], ref: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases: list[tuple[str, dict[str, float], float]] = []
    if ref and "per_batch_ms" in ref.get("training", {}):
        cases.append((f"{ref['system']}\n{ref['date']}", ref["training"]["per_batch_ms"], 0.0))
    for key, label in (("prefetch0", "prefetch 0"), ("prefetch2", "prefetch 2")):
        if key in results["training"]:
            r = results["training"][key]
            epoch_per_batch = 1000 * r["epoch_s"] / max(r["batches_per_trainer"], 1)
            cases.append((f"{label}\n2 trainers", r["per_batch_ms"], epoch_per_batch))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    ax = axes[0]
    colors = {"sample": "#4c72b0", "pull": "#55a868", "compute": "#c44e52", "wait": "#8172b2"}
    for i, (_label, ms, _) in enumerate(cases):
        bottom = 0.0
        for part in ("sample", "pull", "compute"):
            value = float(ms.get(part, 0.0))
            ax.bar(i, value, bottom=bottom, color=colors[part], label=part if i == 0 else None)
            bottom += value
    ax.set_xticks(range(len(cases)), [c[0] for c in cases])
    ax.set_ylabel("ms per batch (work done, background or not)")
    ax.set_title("Work per mini-batch")
    ax.legend()
    ax = axes[1]
    for i, (_label, ms, per_batch) in enumerate(cases):
        if ref and i == 0:
            total = sum(ms.values())
            ax.bar(i, total, color="#999999", label="epoch / batches")
            continue
        first = i == len(cases) - len(results["training"])
        compute_label = "compute" if first else None
        ax.bar(i - 0.2, float(ms["compute"]), width=0.4, color=colors["compute"], label=compute_label)
        ax.bar(i - 0.2, float(ms["wait"]), width=0.4, bottom=float(ms["compute"]), color=colors["wait"],
               label="waiting for data" if first else None)  # fmt: skip
        ax.bar(i + 0.2, per_batch, width=0.4, color="#999999")
    ax.set_xticks(range(len(cases)), [c[0] for c in cases])
    ax.set_ylabel("ms per batch on the training loop")
    ax.set_title("Training loop: compute + waiting vs epoch time / batch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_bench", description=__doc__.split("\n\n")[0])
    add_graph_options(p, default_scale=20)
    add_reference_option(p)
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; the last one is reported")
    p.add_argument("--max-batches", type=int, default=0, help="batches per epoch (0: all)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 epoch of 5 batches, short sampling")
    p.add_argument("--skip", default="", help="comma list of cases to skip: p0,p2,single,sample,traffic,sim")
    p.add_argument("--traffic-batches", type=int, default=20, help="batches per trainer in each traffic case")
    p.add_argument(
        "--traffic-cases", default="", help=f"comma list of {', '.join(TRAFFIC_CASES)} (default: all)"
    )
    p.add_argument(
        "--device", default="cpu", help="trainers' device: cpu (default) or cuda (trainer r on cuda:r)"
    )
    p.add_argument(
        "--sync-copy", action="store_true", help="with --device cuda: copy batches synchronously (no overlap)"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "train_bench.json")
    p.add_argument("--png", type=Path, default=RESULTS / "train_bench.png")
    args = p.parse_args()
    if args.quick:
        args.epochs, args.max_batches = 1, 5
    skip = set(filter(None, args.skip.split(",")))
    npz = graph_npz(args)
    ref = load_reference(args.dgl_results)
    part_config = partitioned(npz, 2, balance=True)
    t_start = time.perf_counter()
    results: dict[str, Any] = {
        "setup": {
            "graph": str(npz),
            "partition": str(part_config),
            "servers": 2,
            "fanouts": [10, 25],
            "batch_size": 1000,
            "hidden": 256,
            "optimizer": "Adam",
            "ddp": "gloo" if args.device == "cpu" else "nccl",
            "device": args.device,
            "sync_copy": bool(args.sync_copy),
            "epochs_run": args.epochs,
            "reported": "last epoch",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        },
        "reference": ref,
        "targets": TARGETS,
        "training": {},
    }
    timeout = 600.0
    runs = {
        "prefetch0": {"trainers": 2, "prefetch": 0, "threads": 1},
        "prefetch2": {"trainers": 2, "prefetch": 2, "threads": 1},
        "single_trainer_1thread": {"trainers": 1, "prefetch": 2, "threads": 1},
    }
    short = {"prefetch0": "p0", "prefetch2": "p2", "single_trainer_1thread": "single"}
    for name, cfg in runs.items():
        if short[name] in skip:
            continue
        t0 = time.perf_counter()
        summaries = run_training(
            part_config,
            epochs=args.epochs,
            max_batches=args.max_batches,
            timeout=timeout,
            device=args.device,
            sync_copy=args.sync_copy,
            **cfg,
        )
        r = {**cfg, **breakdown(summaries)}
        results["training"][name] = r
        print(
            f"{name:24s} {r['batches_per_trainer']:4d} batches/trainer  epoch {r['epoch_s']:7.3f} s  "
            f"per batch {r['per_batch_ms']}  wait {100 * r['wait_fraction']:.1f}%  "
            f"epoch/max(data,compute) {r['epoch_over_max_data_compute']:.2f}  "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    if "traffic" not in skip:
        batches = 3 if args.quick else args.traffic_batches
        only = set(filter(None, args.traffic_cases.split(",")))
        results["traffic"] = traffic_cases(part_config, batches, timeout, only)
    if "sim" not in skip:
        results["accelerator_like"] = sim_cases(part_config, args.epochs, args.max_batches, timeout)
    if "sample" not in skip:
        seconds, max_requests = (1.0, 200) if args.quick else (3.0, 5000)
        results["sample_neighbors"] = sample_bench(part_config, seconds, max_requests)
        for mode, r in results["sample_neighbors"].items():
            print(
                f"sample_neighbors {mode:20s} {r['requests_per_s']:8.1f} req/s  "
                f"{r['edges_per_s'] / 1e6:6.2f} M edges/s",
                flush=True,
            )
    training = results["training"]
    if ref:
        results["vs_reference"] = ratios(results, ref)
    results["wall_s"] = round(time.perf_counter() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if {"prefetch0", "prefetch2"} & training.keys():
        plot(results, ref, args.png)
    if ref:
        print(f"against {provenance(ref)}: {results['vs_reference']}")
    print(f"wrote {args.out} and {args.png} in {results['wall_s']} s")


if __name__ == "__main__":
    main()
