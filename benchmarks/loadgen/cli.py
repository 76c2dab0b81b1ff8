"""``python -m benchmarks.loadgen``: throughput, latency percentiles, overload and sweeps.

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
(from HDR histograms, ``hdrhistogram``, 0.1% resolution, merged across processes), errors by
kind, requests dropped by the open-loop generator, and the servers' idle/peak RSS and CPU; next
to ceilings measured in the same run (loopback socket bandwidth, a numpy gather of the same rows,
the in-process sampling kernel). Writes JSON and PNGs to ``--out`` (default ``benchmarks/results/``).

``--part-config X`` serves every partition of X, one server each (``--partitions`` is then
taken from X).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from asyncgraph.cli import CliError, Parser, configure_logging, run_main
from benchmarks.common import RESULTS, add_graph_options
from benchmarks.loadgen.ceilings import measure_ceilings
from benchmarks.loadgen.cluster import cluster_for, config_partitions
from benchmarks.loadgen.load import LoadConfig, parse_mix, run_load
from benchmarks.loadgen.report import format_report, plot_cdf, plot_sweep, saturation, save, strip_hists


def single(args: argparse.Namespace, cfg: LoadConfig) -> dict[str, Any]:
    with cluster_for(args, args.partitions) as cluster:
        ceilings = measure_ceilings(cluster.part_config, cfg.rows, cfg.fanout)
        result = run_load(cfg, cluster)
    result["ceilings"] = ceilings
    print(format_report(result, ceilings))
    tag = args.tag or ("open" if cfg.rate else "closed")
    path = save(result, f"loadgen-{tag}", args.out)
    plot_cdf(result, args.out / f"loadgen-{tag}-cdf.png", f"latency CDF: {tag}, {cfg.clients} clients")
    print(f"wrote {path} and loadgen-{tag}-cdf.png")
    return result


def sweep(args: argparse.Namespace, cfg: LoadConfig) -> dict[str, Any]:
    clients = [int(c) for c in args.sweep_clients.split(",")]
    partitions = [int(p) for p in args.sweep_partitions.split(",")]
    if args.part_config:  # its partitions are fixed
        partitions = [args.partitions]
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
                points.append({"partitions": parts, "clients": c, "result": strip_hists(result)})
    sat = saturation(points)
    tag = args.tag or "sweep"
    data = {"points": points, "saturation": sat, "ceilings": ceilings, "config": asdict(cfg)}
    path = save(data, f"loadgen-{tag}", args.out)
    mix = ",".join(f"{k}={v:g}" for k, v in cfg.mix.items())
    plot_sweep(points, args.out / f"loadgen-{tag}.png", f"closed loop, mix {mix}, rows {cfg.rows}")
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
        "saturation_probe": strip_hists(probe),
        "saturation_requests_per_s": sat,
        "offered_requests_per_s": rate,
        "result": result,
        "rss_idle": idle,
        "rss_peak": peak,
        "errors": errors,
    }
    path = save(data, f"loadgen-{tag}", args.out)
    plot_cdf(
        result,
        args.out / f"loadgen-{tag}-cdf.png",
        f"overload: {rate:,.0f} req/s offered ({args.overload_factor}x saturation)",
    )
    print(f"wrote {path} and loadgen-{tag}-cdf.png")
    return data


PROG = "python -m benchmarks.loadgen"


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG, description=__doc__, raw_description=True)
    src = ap.add_argument_group("servers")
    add_graph_options(src, default_scale=17)
    src.add_argument(
        "--part-config", type=Path, help="serve every partition of this config instead of --graph"
    )
    src.add_argument(
        "--partitions",
        type=int,
        help="cut --graph into this many parts (default 1; with --part-config: its count)",
    )
    src.add_argument("--ip-config", type=Path, help="drive running servers instead of starting our own")
    src.add_argument("--secret-file", type=Path, help="their shared secret (with --ip-config)")
    src.add_argument("--server-max-inflight", type=int, default=64, help="--max-inflight of our servers")
    src.add_argument(
        "--servers-per-partition",
        type=int,
        default=1,
        help="processes serving each partition of our own servers: a primary and N-1 replicas",
    )
    load = ap.add_argument_group("load")
    load.add_argument("--mix", default="pull=0.7,push=0.2,sample=0.1", help="op=weight,... of the requests")
    load.add_argument("--rows", type=int, default=1000, help="IDs per request (seeds for sample)")
    load.add_argument("--fanout", type=int, default=10, help="neighbours per seed of sample requests")
    load.add_argument("--clients", type=int, default=8, help="concurrent clients in all")
    load.add_argument("--processes", type=int, default=2, help="worker processes the clients run in")
    load.add_argument("--duration", type=float, default=10.0, help="measured seconds (after --warmup)")
    load.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds first")
    load.add_argument("--rate", type=float, help="open loop: offered requests/s (default closed loop)")
    load.add_argument("--max-requests", type=int, help="stop after this many requests")
    load.add_argument("--client-inflight", type=int, default=4, help="open loop: in flight per client")
    load.add_argument("--timeout", type=float, default=5.0, help="per-request timeout (s)")
    load.add_argument("--shared-memory", action="store_true", help="let co-located clients bypass TCP")
    load.add_argument("--seed", type=int, default=0, help="random seed of the request IDs")
    load.add_argument("--no-progress", action="store_true", help="no progress line while running")
    modes = ap.add_argument_group("modes")
    modes.add_argument("--sweep", action="store_true", help="sweep clients x partitions (closed loop)")
    modes.add_argument("--sweep-clients", default="1,2,4,8,16,32,64", help="client counts of --sweep")
    modes.add_argument(
        "--sweep-partitions", default="1,2,4", help="partition counts of --sweep (not with --part-config)"
    )
    modes.add_argument("--overload", action="store_true", help="saturate, then offer --overload-factor x")
    modes.add_argument("--overload-factor", type=float, default=2.0, help="offered rate / saturation rate")
    modes.add_argument("--probe-duration", type=float, default=5.0, help="seconds of the saturation probe")
    ap.add_argument("--tag", help="result file name suffix")
    ap.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="folder for the JSON and PNG results (default benchmarks/results)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; bad input: one line on stderr and status 2."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, "loadgen")
    return run_main(PROG, lambda: _run(args))


def _check(args: argparse.Namespace) -> None:
    if args.secret_file and not args.ip_config:
        raise CliError("--secret-file goes with --ip-config")
    for name in ("graph", "ip_config", "secret_file"):
        path = getattr(args, name)
        if path is not None and not path.is_file():
            raise CliError(f"--{name.replace('_', '-')} {path} does not exist")
    if args.part_config is not None:
        parts = config_partitions(args.part_config)
        if args.partitions is not None and args.partitions != parts:
            raise CliError(f"--partitions {args.partitions} but {args.part_config} has {parts} partitions")
        args.partitions = parts
    elif args.partitions is None:
        args.partitions = 1
    if args.partitions < 1:
        raise CliError(f"--partitions must be at least 1, got {args.partitions}")
    if args.out.exists() and not args.out.is_dir():
        raise CliError(f"--out {args.out} is not a folder")


def _run(args: argparse.Namespace) -> int:
    _check(args)
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
    return 0
