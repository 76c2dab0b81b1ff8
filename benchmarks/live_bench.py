"""A live graph under updates (issue 35): ``python -m benchmarks.live_bench``.

On DGL's 2^20-node graph (``benchmarks/data/dgl20.npz`` if present, else the seeded synthetic
graph of ``--scale``; or a partition given by ``--part-config``), METIS 2-way, 2 servers on
127.0.0.1, each figure beside the static one of the same run:

* **sampling**: one co-located trainer (shared memory) asks ``sample_neighbors`` of 1,024 random
  seeds, fanout 10, back to back: requests/s and p50/p99, on the static graph, then while a
  writer process adds ``--update-rate`` edges/s (target: >= 0.8x the static rate), then after
  a compaction;
* **update throughput**: edges/s acknowledged by one client sending ``add_edges`` batches of
  1, 100 and 10,000 edges back to back, without and with ``--wal`` (fsync always);
* **staleness**: a writer adds one edge to one of 16 probe nodes every 20 ms; a co-located
  reader process samples the probes (fanout -1) back to back: time from the writer's
  acknowledgement to the first sample that returns the edge, p50/p99 (target p99 <= 100 ms);
* **compaction**: the overlay topped up to ``--overlay-fraction`` of the edges, then
  ``compact()``: wall time, the servers' fold times, and each server's peak RSS over its RSS
  before (``/proc/<pid>/clear_refs`` reset, ``VmHWM``).

Writes ``benchmarks/results/live_bench.json``. ``--quick``: Cora, 1 s per figure (the test runs
it). Run it alone: ``flock -x /tmp/asyncgraph-bench.lock python -m benchmarks.live_bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.client import AsyncClient
from asyncgraph.testing import ServerGroup, start_servers
from benchmarks.common import DATA, RESULTS, ROOT, graph_npz, partitioned, subprocess_env, wait_for_sampler

TARGETS = {"sampling_under_updates_over_static": 0.8, "staleness_p99_ms": 100.0}
BATCHES = (1, 100, 10_000)
PROBES = 16


def _ms(values: list[float] | np.ndarray, q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)) * 1e3, 3) if len(values) else float("nan")


async def sample_loop(client: AsyncClient, num_nodes: int, seconds: float, stream: int = 0) -> dict[str, Any]:
    """Back-to-back ``sample_neighbors`` of 1,024 random seeds, fanout 10, for ``seconds``."""
    rng = np.random.default_rng(stream)
    seed_sets = [rng.choice(num_nodes, min(1024, num_nodes), replace=False) for _ in range(32)]
    for i in range(3):  # warm-up (the kernels compiled, the overlay mapped)
        await client.sample_neighbors(seed_sets[i], 10, seed=i)
    lat: list[float] = []
    edges = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds and len(lat) < 1_000_000:
        t = time.perf_counter()
        src, _, _ = await client.sample_neighbors(seed_sets[len(lat) % 32], 10, seed=len(lat))
        lat.append(time.perf_counter() - t)
        edges += src.size
    wall = time.perf_counter() - t0
    return {
        "requests": len(lat),
        "requests_per_s": round(len(lat) / wall, 1),
        "edges_per_s": round(edges / wall, 1),
        "p50_ms": _ms(lat, 50),
        "p99_ms": _ms(lat, 99),
    }


async def update_throughput(
    client: AsyncClient, num_nodes: int, batch: int, seconds: float
) -> dict[str, Any]:
    """Edges/s acknowledged for back-to-back ``add_edges`` of ``batch`` random edges."""
    rng = np.random.default_rng(batch)
    lat: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds and len(lat) < 100_000:
        src, dst = rng.integers(0, num_nodes, batch), rng.integers(0, num_nodes, batch)
        t = time.perf_counter()
        await client.add_edges(src, dst)
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    return {
        "batches": len(lat),
        "edges_per_s": round(len(lat) * batch / wall, 1),
        "batch_p50_ms": _ms(lat, 50),
        "batch_p99_ms": _ms(lat, 99),
    }


def _helper(role: str, addresses: list[tuple[str, int]], out: Path, **kw: Any) -> subprocess.Popen[bytes]:
    spec = json.dumps({"role": role, "addresses": addresses, "out": str(out), **kw})
    cmd = [sys.executable, "-m", "benchmarks.live_bench", "--helper", spec]
    return subprocess.Popen(cmd, cwd=ROOT, env=subprocess_env())


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"helper exited with {proc.returncode} before {path.name}")
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"no {path.name} after {timeout} s")
        time.sleep(0.02)


async def _pacer(spec: dict[str, Any]) -> None:
    """A writer process: ``rate`` random edges/s in batches of ``batch``, until ``stop`` exists."""
    client = await AsyncClient.connect([tuple(a) for a in spec["addresses"]], use_shared_memory=False)
    rng = np.random.default_rng(7)
    n, batch, period = spec["num_nodes"], spec["batch"], spec["batch"] / spec["rate"]
    stop, sent = Path(spec["stop"]), 0
    Path(spec["ready"]).touch()
    t0 = time.perf_counter()
    while not stop.exists() and time.perf_counter() - t0 < 600:
        await client.add_edges(rng.integers(0, n, batch), rng.integers(0, n, batch))
        sent += batch
        await asyncio.sleep(max(0.0, t0 + sent / spec["rate"] - time.perf_counter()))
    wall = time.perf_counter() - t0
    Path(spec["out"]).write_text(
        json.dumps({"edges": sent, "edges_per_s": round(sent / wall, 1), "period_s": period})
    )
    await client.close()


async def _watcher(spec: dict[str, Any]) -> None:
    """A co-located reader process: samples the probes (fanout -1) back to back and records when
    it first saw each added edge (``time.monotonic``: one clock for every process here)."""
    client = await AsyncClient.connect([tuple(a) for a in spec["addresses"]], use_shared_memory=True)
    probes, base = np.asarray(spec["probes"]), int(spec["num_edges"])
    await client.sample_neighbors(probes, -1)
    seen: dict[int, float] = {}
    stop = Path(spec["stop"])
    Path(spec["ready"]).touch()
    polls = 0
    while not stop.exists():
        _, _, eids = await client.sample_neighbors(probes, -1)
        now = time.monotonic()
        polls += 1
        for e in eids[eids >= base].tolist():
            seen.setdefault(e, now)
    Path(spec["out"]).write_text(json.dumps({"seen": seen, "polls": polls}))
    await client.close()


async def staleness(
    client: AsyncClient, group: ServerGroup, num_nodes: int, seconds: float, tmp: Path
) -> dict[str, Any]:
    """Acknowledged ``add_edges`` of one edge -> the first sample (another process) holding it."""
    rng = np.random.default_rng(3)
    probes = rng.choice(num_nodes, PROBES, replace=False)
    stop, ready, out = tmp / "watch.stop", tmp / "watch.ready", tmp / "watch.json"
    proc = _helper(
        "watcher", group.addresses, out, probes=probes.tolist(), num_edges=client.book.num_edges,
        stop=str(stop), ready=str(ready),
    )  # fmt: skip
    acked: dict[int, float] = {}
    try:
        _wait_file(ready, proc)
        t0 = time.monotonic()
        k = 0
        while time.monotonic() - t0 < seconds:
            dst = np.array([probes[k % PROBES]])
            (eid,) = (await client.add_edges(rng.integers(0, num_nodes, 1), dst)).tolist()
            acked[eid] = time.monotonic()
            k += 1
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # the last ones reach the reader
    finally:
        stop.touch()
        proc.wait(60)
    seen = {int(e): t for e, t in json.loads(out.read_text())["seen"].items()}
    delays = [seen[e] - t for e, t in acked.items() if e in seen]
    return {
        "edges": len(acked),
        "seen": len(delays),
        "p50_ms": _ms(delays, 50),
        "p99_ms": _ms(delays, 99),
        "max_ms": round(max(delays) * 1e3, 3) if delays else None,
        "note": "negative: the reader saw the edge before the writer got its acknowledgement",
    }


async def under_updates(
    client: AsyncClient, group: ServerGroup, num_nodes: int, seconds: float, rate: float, tmp: Path
) -> dict[str, Any]:
    stop, ready, out = tmp / "pace.stop", tmp / "pace.ready", tmp / "pace.json"
    batch = max(1, int(rate // 10))
    proc = _helper(
        "pacer",
        group.addresses,
        out,
        num_nodes=num_nodes,
        rate=rate,
        batch=batch,
        stop=str(stop),
        ready=str(ready),
    )
    try:
        _wait_file(ready, proc)
        await asyncio.sleep(0.5)  # updates are flowing
        sampled = await sample_loop(client, num_nodes, seconds, stream=1)
    finally:
        stop.touch()
        proc.wait(120)
    return {**sampled, "writer": json.loads(out.read_text()), "writer_batch": batch}


def _proc_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


async def compaction(
    client: AsyncClient,
    group: ServerGroup,
    num_nodes: int,
    fraction: float,
    sampler: AsyncClient,
    seconds: float,
) -> dict[str, Any]:
    """Top the overlay up to ``fraction`` of the base edges, then compact: time and peak RSS,
    and the sampling rate before and after."""
    stats = await client.server_stats()
    want = int(fraction * client.book.num_edges) - sum(int(s["overlay_edges"]) for s in stats)
    rng = np.random.default_rng(11)
    t0 = time.perf_counter()
    while want > 0:
        k = min(want, 100_000)
        await client.add_edges(rng.integers(0, num_nodes, k), rng.integers(0, num_nodes, k))
        want -= k
    fill = time.perf_counter() - t0
    stats = await client.server_stats()
    sampled_before = await sample_loop(sampler, num_nodes, seconds, stream=2)
    pids = [p.pid for p in group.procs[:2]]
    before = [_proc_kib(pid, "VmRSS") for pid in pids]
    for pid in pids:  # reset each server's peak RSS to its RSS now
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    t0 = time.perf_counter()
    done = await client.compact()
    wall = time.perf_counter() - t0
    peaks = [_proc_kib(pid, "VmHWM") for pid in pids]
    return {
        "sampling_before": sampled_before,
        "sampling_after": await sample_loop(sampler, num_nodes, seconds, stream=2),
        "overlay_edges_before": [int(s["overlay_edges"]) for s in stats],
        "overlay_share_of_edges": round(
            sum(int(s["overlay_edges"]) for s in stats) / client.book.num_edges, 4
        ),
        "fill_s": round(fill, 3),
        "wall_s": round(wall, 3),
        "servers": done,
        "rss_before_mib": [round(b / 1024, 1) for b in before],
        "peak_over_before_mib": [round((p - b) / 1024, 1) for p, b in zip(peaks, before, strict=True)],
    }


async def run_group(part_config: Path, args: argparse.Namespace, tmp: Path, wal: bool) -> dict[str, Any]:
    """One server group: every figure on the plain one (the update throughputs last, so the
    overlay compacted is the one asked for), the update throughputs on the durable one."""
    extra = ["--log-level", "WARNING"]
    if wal:
        extra += ["--state-dir", str(tmp / "state"), "--wal"]
    group = start_servers(part_config, tmp / ("wal" if wal else "plain"), num_parts=2, extra_args=extra)
    out: dict[str, Any] = {}
    try:
        wait_for_sampler(group.addresses)
        writer = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        n = writer.book.num_nodes
        if not wal:
            sampler = await AsyncClient.connect(group.addresses, use_shared_memory=True)
            await sample_loop(sampler, n, max(1.0, args.seconds / 2), stream=9)  # warm: pages, kernels
            out["static"] = await sample_loop(sampler, n, args.seconds)
            out["under_updates"] = await under_updates(sampler, group, n, args.seconds, args.update_rate, tmp)
            out["idle_after_updates"] = await sample_loop(sampler, n, args.seconds)  # overlay, no writer
            out["staleness"] = await staleness(writer, group, n, args.seconds, tmp)
            out["compaction"] = await compaction(
                writer, group, n, args.overlay_fraction, sampler, args.seconds
            )
            await sampler.close()
        out["updates"] = {str(b): await update_throughput(writer, n, b, args.seconds / 2) for b in BATCHES}
        await writer.close()
    finally:
        group.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.live_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--graph", type=Path, help="an npz graph (default: benchmarks/data/dgl20.npz, else --scale)"
    )
    ap.add_argument(
        "--scale", type=int, default=20, help="the synthetic graph's 2**scale nodes (no dgl20.npz)"
    )
    ap.add_argument(
        "--part-config", type=Path, help="a 2-part partition to serve instead (skips partitioning)"
    )
    ap.add_argument("--cache", type=Path, default=DATA, help="where partitions are kept")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds per figure")
    ap.add_argument("--update-rate", type=float, default=10_000.0, help="edges/s added while sampling")
    ap.add_argument(
        "--overlay-fraction", type=float, default=0.1, help="overlay compacted: share of the edges"
    )
    ap.add_argument("--quick", action="store_true", help="Cora, 1 s per figure: the smoke test")
    ap.add_argument("--out", type=Path, default=RESULTS / "live_bench.json")
    ap.add_argument("--helper", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.helper:
        spec = json.loads(args.helper)
        asyncio.run((_pacer if spec["role"] == "pacer" else _watcher)(spec))
        return
    if args.quick:
        args.seconds, args.graph = 1.0, args.graph or ROOT / "examples" / "data" / "cora.npz"
    if args.graph is None and (DATA / "dgl20.npz").is_file():
        args.graph = DATA / "dgl20.npz"
    part_config = args.part_config
    if part_config is None:
        part_config = partitioned(graph_npz(args), 2, balance=True, cache=args.cache)
    results: dict[str, Any] = {
        "setup": {
            "partition": str(part_config),
            "servers": 2,
            "seconds_per_figure": args.seconds,
            "update_rate": args.update_rate,
            "sampler": "one co-located client (shared memory), 1,024 seeds, fanout 10, back to back",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python -m benchmarks.live_bench", *sys.argv[1:]]),
        },
        "targets": TARGETS,
    }
    with tempfile.TemporaryDirectory(prefix="live-bench-") as tmp:
        results["plain"] = asyncio.run(run_group(part_config, args, Path(tmp), wal=False))
        results["wal"] = asyncio.run(run_group(part_config, args, Path(tmp), wal=True))
    plain, comp = results["plain"], results["plain"]["compaction"]
    ratio = plain["under_updates"]["requests_per_s"] / plain["static"]["requests_per_s"]
    results["summary"] = {
        "sampling_under_updates_over_static": round(ratio, 3),
        "sampling_idle_overlay_over_static": round(
            plain["idle_after_updates"]["requests_per_s"] / plain["static"]["requests_per_s"], 3
        ),
        "sampling_after_over_before_compaction": round(
            comp["sampling_after"]["requests_per_s"] / comp["sampling_before"]["requests_per_s"], 3
        ),
        "compaction_wall_s": comp["wall_s"],
        "compaction_peak_over_before_mib": comp["peak_over_before_mib"],
        "updates_edges_per_s": {k: v["edges_per_s"] for k, v in plain["updates"].items()},
        "updates_wal_edges_per_s": {k: v["edges_per_s"] for k, v in results["wal"]["updates"].items()},
        "staleness_p99_ms": plain["staleness"]["p99_ms"],
        "met": {
            "sampling_under_updates": ratio >= TARGETS["sampling_under_updates_over_static"],
            "staleness": plain["staleness"]["p99_ms"] <= TARGETS["staleness_p99_ms"],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["summary"], indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
