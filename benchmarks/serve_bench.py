"""Online inference latency against offered load (issue 36): ``python -m benchmarks.serve_bench``.

Partitions the graph (PubMed by default; ``--scale 20``: the seeded synthetic graph of 2^20
nodes and ~10.6M edges of DGL's reference benchmark, ``benchmarks/synthetic.py``, generated once
into ``--data-dir``) into 2 parts, starts 2 servers and one
``python -m asyncgraph.serve`` (2-layer GraphSAGE, fanouts 10,10, random weights: speed only),
then offers single-node requests open-loop at each ``--rates`` value for ``--seconds`` over
``--connections`` msgpack connections (``InferenceClient``'s protocol). Latency is measured from
each request's *scheduled* time (coordinated-omission-correct, HdrHistogram), so a saturated
server shows its queueing. Per rate: achieved rate, p50/p90/p99/max, errors by type, and from the
serve process's ``/metrics`` the mean batch (nodes, requests) and the mean seconds per stage,
and a timeline: p50/p99/max and the requests over 20 ms per half second of the run (a warm-up
or a hiccup shows where it happened), with the steal the hypervisor took from each vCPU in it
(``vm_steal.py``); ``p99_quiet_ms`` is the p99 of the windows where no vCPU lost over 10 ms.
Writes ``benchmarks/results/<--name>.json`` (``--results-dir``) and a latency-vs-load plot next to it.
Run it alone: ``flock -x /tmp/asyncgraph-bench.lock python -m benchmarks.serve_bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from asyncgraph.errors import AsyncGraphError
from asyncgraph.launch.lifeline import die_with_parent
from asyncgraph.nn import GraphSAGE
from asyncgraph.serve.artifact import save_model
from asyncgraph.serve.client import AsyncInferenceClient
from asyncgraph.testing import start_servers
from benchmarks.common import DATA, RESULTS, partitioned, subprocess_env
from benchmarks.loadgen.worker import LatencyHistogram
from benchmarks.serve_load import Offered, offer_frames
from benchmarks.vm_steal import StealProbe, read_steal, steal_per_window

ROOT = Path(__file__).resolve().parent.parent
OUT_DIM = 3  # the served model's classes
WINDOW_S = 0.5  # the timeline's window
QUIET_STEAL_MS = 10.0  # a window is quiet when no vCPU lost more (one tick of /proc/stat)


def graph_of(args: argparse.Namespace) -> Path:
    """The npz to serve: ``--graph``, or with ``--scale`` the synthetic graph of 2^scale nodes in
    ``--data-dir`` (generated there, seed 0, if missing)."""
    if args.scale is None:
        return Path(args.graph)
    path = Path(args.data_dir) / f"synth{args.scale}.npz"
    if not path.is_file():
        from benchmarks.synthetic import make_synthetic

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}-tmp.npz")
        np.savez(tmp, **make_synthetic(args.scale, 0))  # type: ignore[arg-type]
        tmp.replace(path)
    return path


def npz_shape(path: Path, key: str) -> tuple[int, ...]:
    """The shape of array ``key`` of an npz, read from its header (the array is not loaded: 512 MiB
    of features at 2^20)."""
    with zipfile.ZipFile(path) as archive, archive.open(f"{key}.npy") as fh:
        major, _ = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, _ = read(fh)
    return tuple(int(d) for d in shape)


def _summed_metrics(ports: list[int]) -> dict[str, float]:
    """Every serve process's counters, summed (each has its own HTTP port)."""
    total: dict[str, float] = {}
    for port in ports:
        for key, value in _metrics(port).items():
            total[key] = total.get(key, 0.0) + value
    return total


def _metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            stage = sample.labels.get("stage") or sample.labels.get("outcome") or ""
            if sample.name.endswith(("_sum", "_count")) or sample.name.endswith("_total"):
                out[f"{sample.name}{'/' + stage if stage else ''}"] = sample.value
            elif sample.name.endswith("_bucket") and stage:  # the tail of each serve-side stage
                out[f"{stage}_le/{float(sample.labels['le']):g}"] = sample.value
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc``; 0 where it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


async def _offer_client(
    url: str, rate: float, seconds: float, connections: int, nodes: np.ndarray
) -> Offered:
    """``--generator client``: each request through ``AsyncInferenceClient`` (a task each)."""
    clients = [AsyncInferenceClient(url, timeout=5.0) for _ in range(connections)]
    for c in clients:  # connect before the clock starts
        await c.metadata()
    total = int(rate * seconds)
    offered = Offered(np.full(total, np.nan), np.full(total, np.nan))
    max_inflight = 4096
    inflight: set[asyncio.Task[None]] = set()

    async def one(k: int, scheduled: float) -> None:
        offered.late[k] = time.perf_counter() - scheduled
        try:
            await clients[k % connections].infer([int(nodes[k])])
            offered.latencies[k] = time.perf_counter() - scheduled
        except AsyncGraphError as exc:
            offered.errors[exc.code] = offered.errors.get(exc.code, 0) + 1

    t0 = time.perf_counter() + 0.05
    offered.start = t0
    for k in range(total):
        scheduled = t0 + k / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(inflight) >= max_inflight:
            offered.dropped += 1
            continue
        task = asyncio.ensure_future(one(k, scheduled))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.wait(list(inflight), timeout=30)
    offered.elapsed = time.perf_counter() - t0
    for c in clients:
        await c.close()
    return offered


async def _offer(
    url: str, rate: float, seconds: float, connections: int, num_nodes: int, seed: int, generator: str
) -> dict[str, Any]:
    """One rate's requests (single random nodes, seeded) through ``generator``, summarised."""
    total = int(rate * seconds)
    nodes = np.random.default_rng(seed).integers(0, num_nodes, size=total)
    probe = StealProbe().start()
    try:
        if generator == "client":
            offered = await _offer_client(url, rate, seconds, connections, nodes)
        else:
            host, _, port = url.removeprefix("tcp://").rpartition(":")
            offered = await offer_frames(host, int(port), rate, seconds, connections, nodes, OUT_DIM)
    finally:
        probe.stop()
    windows = timeline(offered.latencies, rate, WINDOW_S, late=offered.late)
    steal = steal_per_window(probe, offered.start, WINDOW_S, len(windows))
    for row, stolen in zip(windows, steal, strict=True):
        row |= stolen
    hist = LatencyHistogram()
    answered = offered.latencies[~np.isnan(offered.latencies)]
    for seconds_taken in answered.tolist():
        hist.record(seconds_taken)
    return {
        "offered_rps": rate,
        "achieved_rps": answered.size / offered.elapsed,
        "ok": int(answered.size),
        "errors": offered.errors,
        "dropped": offered.dropped,
        "p50_ms": hist.percentile(50) * 1e3,
        "p90_ms": hist.percentile(90) * 1e3,
        "p99_ms": hist.percentile(99) * 1e3,
        "max_ms": hist.max_s * 1e3,
        **_lateness(offered.late),
        **_quiet_p99(offered.latencies, rate, windows),
        "timeline": windows,
    }


def _quiet_p99(latencies: np.ndarray, rate: float, windows: list[dict[str, Any]]) -> dict[str, Any]:
    """p99 (ms) of the requests scheduled in quiet windows: no vCPU lost over ``QUIET_STEAL_MS``
    to the hypervisor in the window or the one before it (a stall's queue drains into the
    next). The whole run's p99 stays the figure; this one says what the service does on the
    two cores it was given, beside how many windows were quiet."""
    if not windows or "steal_max_cpu_ms" not in windows[0]:
        return {}
    stolen = np.array([w["steal_max_cpu_ms"] > QUIET_STEAL_MS for w in windows])
    quiet = ~(stolen | np.concatenate([[False], stolen[:-1]]))
    per = max(1, round(rate * WINDOW_S))
    keep = np.repeat(quiet, per)[: latencies.size]
    ms = latencies[: keep.size][keep] * 1e3
    ms = ms[~np.isnan(ms)]
    result: dict[str, Any] = {"quiet_windows": int(quiet.sum()), "windows": len(windows)}
    if ms.size:
        result["p99_quiet_ms"] = float(np.percentile(ms, 99))
    return result


def _lateness(late: np.ndarray) -> dict[str, float]:
    """How late the generator itself sent requests (p50/p99/max ms after their scheduled time):
    the part of the measured latency that is the load generator's, not the service's."""
    ms = late[~np.isnan(late)] * 1e3
    if not ms.size:
        return {}
    p50, p99 = np.percentile(ms, [50, 99])
    worst = float(ms.max())
    return {"send_late_p50_ms": float(p50), "send_late_p99_ms": float(p99), "send_late_max_ms": worst}


def timeline(
    latencies: np.ndarray, rate: float, window_s: float = 0.5, late: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """Per ``window_s`` of scheduled time: answered requests, p50/p99/max (ms) and how many took
    over 20 ms (``latencies[k]``: request ``k``'s, scheduled at ``k / rate``; NaN if it failed),
    and with ``late`` (seconds each request was sent after its time) the generator's worst
    lateness: a window where the generator was late too was a stall of the machine, not only
    of the service."""
    per = max(1, round(rate * window_s))
    out = []
    for start in range(0, latencies.size, per):
        ms = latencies[start : start + per] * 1e3
        ms = ms[~np.isnan(ms)]
        row = {"t_s": round(start / rate, 2), "answered": int(ms.size)}
        if ms.size:
            p50, p99 = np.percentile(ms, [50, 99])
            row |= {"p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2)}
            row |= {"max_ms": round(float(ms.max()), 2), "over_20ms": int((ms > 20).sum())}
        if late is not None:
            sent = late[start : start + per]
            sent = sent[~np.isnan(sent)]
            if sent.size:
                row["send_late_max_ms"] = round(float(sent.max()) * 1e3, 2)
        out.append(row)
    return out


def _plot(points: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = [p["offered_rps"] for p in points]
    ax.plot(x, [p["p50_ms"] for p in points], "o-", label="p50")
    ax.plot(x, [p["p99_ms"] for p in points], "s-", label="p99")
    ax.axhline(20, color="grey", linestyle="--", label="target p99 20 ms")
    ax.set_xlabel("offered load (single-node requests/s)")
    ax.set_ylabel("latency (ms, from the scheduled time)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", type=Path, default=ROOT / "examples" / "data" / "pubmed.npz")
    ap.add_argument(
        "--scale", type=int, help="serve the synthetic graph of 2**scale nodes instead (20: DGL's)"
    )
    ap.add_argument(
        "--data-dir", type=Path, default=DATA, help="where --scale's graph and partitions are kept"
    )
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--partition-method", default="metis", help="metis (default), random, ...")
    ap.add_argument("--rates", default="100,200,400,800,1200")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--fanouts", default="10,10")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--max-delay-ms", type=float, default=2.0)
    ap.add_argument("--name", default="serve_bench")
    ap.add_argument(
        "--generator", choices=("frames", "client"), default="frames",
        help="frames: pre-encoded requests written to sockets (benchmarks/serve_load.py); "
        "client: AsyncInferenceClient, a task per request (~0.25 core more at 1,000/s)",
    )  # fmt: skip
    ap.add_argument("--serve-args", default="", help="more options for the serve process, space-separated")
    ap.add_argument(
        "--ingest-eps", type=float, default=0.0,
        help="a writer process adds this many random edges/s (batches of 100) during every rate",
    )  # fmt: skip
    ap.add_argument(
        "--serve-procs", type=int, default=1,
        help="serve processes sharing one msgpack port (--reuse-port); metrics summed over them",
    )  # fmt: skip
    args = ap.parse_args(argv)
    graph = graph_of(args)
    part_config = partitioned(graph, 2, args.partition_method, cache=args.data_dir)
    num_nodes, feat_dim = npz_shape(graph, "feat")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        group = start_servers(part_config, work / "servers", num_parts=2)
        serves: list[subprocess.Popen[bytes]] = []
        writer: subprocess.Popen[bytes] | None = None
        ingest: dict[str, Any] | None = None
        try:
            fanouts = [int(f) for f in args.fanouts.split(",")]
            kwargs = {"in_feats": feat_dim, "hidden": args.hidden, "n_classes": OUT_DIM,
                      "n_layers": len(fanouts)}  # fmt: skip
            torch.manual_seed(0)
            model_dir = save_model(
                work / "model", GraphSAGE(**kwargs), name="sage", kwargs=kwargs, fanouts=fanouts
            )
            shared: list[str] = []
            if args.serve_procs > 1:  # one msgpack port for all (SO_REUSEPORT), an HTTP port each
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    shared = ["--msgpack-port", str(probe.getsockname()[1]), "--reuse-port"]
            readies = [work / f"serve-ready-{i}.json" for i in range(args.serve_procs)]
            for ready in readies:
                serves.append(subprocess.Popen(
                    [sys.executable, "-m", "asyncgraph.serve", "--part-config", str(part_config),
                     "--servers", str(group.ip_config()), "--model", str(model_dir), "--port", "0",
                     *(shared or ["--msgpack-port", "0"]), "--ready-file", str(ready),
                     "--max-batch", str(args.max_batch), "--max-delay-ms", str(args.max_delay_ms),
                     *args.serve_args.split()],
                    env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent(signal.SIGTERM),  # a killed bench leaves none behind
                ))  # fmt: skip
            end = time.monotonic() + 180
            while not all(ready.exists() for ready in readies):
                if any(p.poll() is not None for p in serves) or time.monotonic() > end:
                    raise SystemExit("a serve process did not start")
                time.sleep(0.1)
            wheres = [json.loads(ready.read_text()) for ready in readies]
            url = f"tcp://127.0.0.1:{wheres[0]['msgpack_port']}"
            http_ports = [w["port"] for w in wheres]
            uvloop.run(_offer(url, 50, 1.0, args.connections, num_nodes, 99, args.generator))  # warm-up
            if args.ingest_eps > 0:  # the live graph (issue 35) ingesting while requests are served
                from benchmarks.live_bench import _helper, _wait_file

                marks = {k: work / f"ingest-{k}" for k in ("ready", "stop", "out")}
                writer = _helper(
                    "pacer", [list(a) for a in group.addresses], marks["out"], num_nodes=num_nodes,
                    batch=100, rate=args.ingest_eps, stop=str(marks["stop"]), ready=str(marks["ready"]),
                )  # fmt: skip
                _wait_file(marks["ready"], writer)
            points = []
            for i, rate in enumerate(float(r) for r in args.rates.split(",")):
                before = _summed_metrics(http_ports)
                pids = {
                    "serve": [p.pid for p in serves],
                    "servers": [p.pid for p in group.procs],
                    "generator": [os.getpid()],
                    "writer": [writer.pid] if writer is not None else [],
                }
                cpu0 = {k: sum(map(_cpu_seconds, v)) for k, v in pids.items()}
                steal0 = float(read_steal().sum())
                wall0 = time.perf_counter()
                offer = _offer(url, rate, args.seconds, args.connections, num_nodes, i, args.generator)
                point = uvloop.run(offer)
                wall = time.perf_counter() - wall0
                # cores each kind of process used over the rate (of the 2 this machine has)
                point["cores"] = {
                    k: round((sum(map(_cpu_seconds, v)) - cpu0[k]) / wall, 3) for k, v in pids.items()
                }
                point["steal_s"] = round(float(read_steal().sum()) - steal0, 3)  # the hypervisor's, all CPUs
                after = _summed_metrics(http_ports)
                batches = _delta(after, before, "asyncgraph_serve_batch_nodes_count")
                point["mean_batch_nodes"] = _delta(after, before, "asyncgraph_serve_batch_nodes_sum") / max(
                    batches, 1
                )
                point["mean_batch_requests"] = _delta(
                    after, before, "asyncgraph_serve_batch_requests_sum"
                ) / max(batches, 1)
                for stage in ("queue", "sample", "pull", "forward", "total"):
                    n = _delta(after, before, f"asyncgraph_serve_latency_seconds_count/{stage}")
                    s = _delta(after, before, f"asyncgraph_serve_latency_seconds_sum/{stage}")
                    point[f"mean_{stage}_ms"] = 1e3 * s / max(n, 1)
                for stage in ("queue", "sample", "pull", "forward", "total"):  # where the tail is
                    n = _delta(after, before, f"asyncgraph_serve_latency_seconds_count/{stage}")
                    for le in (0.01, 0.02):
                        within = _delta(after, before, f"{stage}_le/{le:g}")
                        point[f"serve_{stage}_over_{le * 1e3:g}ms"] = 1.0 - within / max(n, 1)
                points.append(point)
                shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in point.items()}
                print(json.dumps({k: v for k, v in shown.items() if k != "timeline"}), flush=True)
                p99s = " ".join(str(w.get("p99_ms", "-")) for w in point["timeline"])
                print(f"  p99 (ms) per 0.5 s: {p99s}", flush=True)
                lates = " ".join(str(w.get("send_late_max_ms", "-")) for w in point["timeline"])
                print(f"  generator's worst lateness (ms) per 0.5 s: {lates}", flush=True)
                stolen = " ".join(str(w.get("steal_max_cpu_ms", "-")) for w in point["timeline"])
                print(f"  steal of the most stolen vCPU (ms) per 0.5 s: {stolen}", flush=True)
            if writer is not None:
                marks["stop"].touch()
                writer.wait(timeout=60)
                ingest = json.loads(marks["out"].read_text())
                print(f"ingested while serving: {ingest}", flush=True)
        finally:
            if writer is not None and writer.poll() is None:
                writer.kill()
            for serve in serves:
                if serve.poll() is None:
                    serve.send_signal(signal.SIGTERM)
            for serve in serves:
                serve.wait(timeout=60)
            group.stop()
    result = {"graph": graph.name, "partition_method": args.partition_method, "fanouts": args.fanouts,
              "hidden": args.hidden,
              "max_batch": args.max_batch, "max_delay_ms": args.max_delay_ms, "connections": args.connections,
              "seconds": args.seconds, "serve_procs": args.serve_procs, "generator": args.generator,
              "ingest": ingest,
              "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "points": points}  # fmt: skip
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    title = f"{graph.stem}: 2 servers + {args.serve_procs} serve, fanouts {args.fanouts}"
    _plot(points, results / f"{args.name}.png", title)
    print(f"wrote {results / (args.name + '.json')} and .png")


if __name__ == "__main__":
    main()
