"""End to end at 2^N nodes: chunked input -> out-of-core partition -> servers + training -> inference.

``python -m benchmarks.e2e_scale --scale N`` (issue 34), each stage a fresh process tree:

1. ``gen``: a seeded R-MAT graph (``benchmarks.chunked_bench.write_rmat_chunked``: 2^N nodes,
   10 * 2^N edges, IDs permuted; 128-d float32 ``feat``, ``label`` (50 classes), ``train_mask``
   only) written in DGL's chunked format with numpy chunks, one chunk in memory at a time;
2. ``partition``: ``python -m asyncgraph.partition --input .../metadata.json --num-parts 4
   --method random --memory-limit L`` (out of core);
3. ``train``: ``python -m asyncgraph.launch --part-config ... --num-trainers 1 -- python
   examples/train_dist.py --epochs 1 --max-batches K --eval-every 0`` (4 servers, 4 trainers);
4. ``infer``: the same launch with ``benchmarks.e2e_infer``: layer-wise inference (2-layer
   GraphSAGE) of a slice of ``--infer-nodes`` nodes spread over every partition.

Per stage: wall time; peak memory of the stage's whole process tree (RSS, PSS: shared pages
counted once, and RssAnon + RssShmem), sampled every ``--interval`` s; the machine's memory
"used" (MemTotal - MemAvailable), shared memory (Shmem) and page cache (Cached) before and at
peak (``benchmarks.e2e_memory``). For ``train`` and ``infer`` also each server's start-up
(process start -> its "serving graph" log line, and the server's own "loaded in") and when the
trainers were ready. Page cache is not dropped between stages (a shared machine): later stages
read warm files, as a job right after partitioning does.

Inputs and outputs live in ``--workdir`` (default ``benchmarks/data/e2e_scale<N>``); a stage
whose output is there already is reused (``--redo gen partition`` redoes them); ``--stages``
picks stages; ``--keep`` keeps what this run generated, else it is removed at the end. Each
stage has a ``--timeout``. Writes ``benchmarks/results/e2e_scale_<N>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import DATA, RESULTS, ROOT, subprocess_env
from benchmarks.e2e_memory import StageRun, meminfo, run_stage

STAGES = ("gen", "partition", "train", "infer")
SERVING = re.compile(
    r"\[server (\d+)\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*serving graph .* partition (\d+) .*"
    r"\(loaded in ([0-9.]+) s"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.e2e_scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, required=True, help="2**scale nodes")
    ap.add_argument(
        "--workdir", type=Path, help="inputs and partitions (default benchmarks/data/e2e_scale<N>)"
    )
    ap.add_argument("--keep", action="store_true", help="keep what this run generated in --workdir")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument("--redo", nargs="*", choices=("gen", "partition"), default=[], help="even if cached")
    ap.add_argument("--memory-limit", default="4GiB", help="the partitioner's --memory-limit")
    ap.add_argument("--workers", type=int, default=0, help="the partitioner's --workers (0: its default)")
    ap.add_argument("--num-parts", type=int, default=4)
    ap.add_argument("--max-batches", type=int, default=30, help="training batches (one epoch's first K)")
    ap.add_argument("--infer-nodes", type=int, default=1 << 16, help="inference slice (0: every node)")
    ap.add_argument("--hidden", type=int, default=64, help="inference model's hidden width")
    ap.add_argument("--train-arg", action="append", default=[], help="extra train_dist.py argument")
    ap.add_argument("--server-arg", action="append", default=[], help="extra server argument (launcher)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per stage")
    ap.add_argument("--ready-timeout", type=float, default=600, help="the launcher's --ready-timeout")
    ap.add_argument("--interval", type=float, default=0.25, help="memory sampling interval (s)")
    ap.add_argument("--no-pss", action="store_true", help="skip PSS (smaps_rollup) sampling")
    ap.add_argument("--out", type=Path, help="results JSON (default benchmarks/results/e2e_scale_<N>.json)")
    return ap.parse_args(argv)


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def stage(name: str, cmd: list[str], args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], StageRun]:
    """Run one stage; its row (wall, rc, memory, load average) and the raw run."""
    load = os.getloadavg()[0]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    run = run_stage(
        cmd,
        timeout=args.timeout,
        log=work / f"{name}.log",
        env=subprocess_env(),
        cwd=ROOT,
        interval=args.interval,
        pss=not args.no_pss,
    )
    row: dict[str, Any] = {
        "cmd": cmd,
        "rc": run.rc,
        "timed_out": run.timed_out,
        "wall_s": round(run.wall_s, 3),
        "load_avg_1min_before": load,
        **run.memory,
        "log": str(work / f"{name}.log"),
    }
    m = {k: v / (1 << 30) for k, v in run.memory.items() if k.endswith("_bytes")}
    print(
        f"   {name}: rc {run.rc}{' (timed out)' if run.timed_out else ''}, {run.wall_s:.1f} s; tree peak "
        f"PSS {m['peak_tree_pss_bytes']:.2f} GiB, RSS {m['peak_tree_rss_bytes']:.2f} GiB; machine used "
        f"{m['machine_used_before_bytes']:.2f} -> peak {m['machine_used_peak_bytes']:.2f} GiB, shmem "
        f"{m['shmem_before_bytes']:.2f} -> {m['shmem_peak_bytes']:.2f} GiB",
        flush=True,
    )
    if run.rc != 0:
        tail = "\n".join(line for _, line in run.lines[-15:])
        print(f"   {name} failed; last lines:\n{tail}", flush=True)
    return row, run


def server_startup(run: StageRun) -> list[dict[str, Any]]:
    """Each server's start-up: its process start -> its "serving graph" log line (the log's own
    time stamp, local time), the server's "loaded in", and that line's time since the launch."""
    starts: dict[int, float] = {}
    for info in run.procs.values():
        cmd = info["cmdline"]
        if "asyncgraph.server" in cmd and "--part-id" in cmd:
            part = int(cmd[cmd.index("--part-id") + 1])
            starts[part] = min(starts.get(part, info["start"]), info["start"])
    out = []
    for _, line in run.lines:
        m = SERVING.search(line)
        if m is None:
            continue
        part = int(m[3])
        ready = dt.datetime.strptime(m[2], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        row = {"part": part, "loaded_in_s": float(m[4]), "ready_since_launch_s": round(ready - run.t0, 3)}
        if part in starts:
            row["start_to_ready_s"] = round(ready - starts[part], 3)
        out.append(row)
    return sorted(out, key=lambda r: r["part"])


def first_line_after(run: StageRun, needle: str) -> float | None:
    """Seconds from the stage's start to the first output line containing ``needle``."""
    return next((round(t - run.t0, 3) for t, line in run.lines if needle in line), None)


def results_of(run: StageRun) -> list[dict[str, Any]]:
    """Every ``RESULT {json}`` line of the stage's output."""
    return [json.loads(line.split("RESULT ", 1)[1]) for _, line in run.lines if "RESULT {" in line]


def launch_cmd(part_config: Path, args: argparse.Namespace, trainer: list[str]) -> list[str]:
    extra = [f"--server-arg={a}" for a in args.server_arg]
    return [
        sys.executable,
        "-m",
        "asyncgraph.launch",
        "--part-config",
        str(part_config),
        "--num-trainers",
        "1",
        "--ready-timeout",
        str(args.ready_timeout),
        *extra,
        "--",
        sys.executable,
        *trainer,
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work: Path = args.workdir or DATA / f"e2e_scale{args.scale}"
    created = not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    chunked, parts = work / "chunked", work / "parts"
    meta, config = chunked / "metadata.json", parts / f"rmat{args.scale}.json"
    made: list[Path] = []
    rows: dict[str, Any] = {}
    series: dict[str, list[list[float]]] = {}
    failed = False
    for name in args.stages:
        if failed:
            break
        if name == "gen":
            if meta.is_file() and "gen" not in args.redo:
                rows["gen"] = {"cached": True}
                continue
            shutil.rmtree(chunked, ignore_errors=True)
            code = (
                "from pathlib import Path; from benchmarks.chunked_bench import write_rmat_chunked; "
                f"write_rmat_chunked({args.scale}, Path({str(chunked)!r}))"
            )
            row, run = stage("gen", [sys.executable, "-c", code], args, work)
            made.append(chunked)
            row["input_bytes"] = tree_bytes(chunked)
        elif name == "partition":
            if config.is_file() and "partition" not in args.redo:
                rows["partition"] = {"cached": True, "output_bytes": tree_bytes(parts)}
                continue
            shutil.rmtree(parts, ignore_errors=True)
            cmd = [
                sys.executable,
                "-m",
                "asyncgraph.partition",
                "--input",
                str(meta),
                "--num-parts",
                str(args.num_parts),
                "--method",
                "random",
                "--memory-limit",
                args.memory_limit,
                "--out",
                str(parts),
                *(["--workers", str(args.workers)] if args.workers else []),
            ]
            row, run = stage("partition", cmd, args, work)
            made.append(parts)
            row["output_bytes"] = tree_bytes(parts)
            row["stages_line"] = next((line for _, line in run.lines if line.startswith("done in")), None)
        elif not config.is_file():
            raise SystemExit(f"no partitioning at {config}: run the gen and partition stages first (--keep)")
        elif name == "train":
            trainer = [
                str(ROOT / "examples" / "train_dist.py"),
                "--epochs",
                "1",
                "--max-batches",
                str(args.max_batches),
                "--eval-every",
                "0",
                "--no-progress",
                *args.train_arg,
            ]
            row, run = stage("train", launch_cmd(config, args, trainer), args, work)
            row["servers"] = server_startup(run)
            row["trainer0_ready_s"] = first_line_after(run, "[trainer 0] DistGraph(")
            res = results_of(run)
            row["result"] = res[-1] if res else None
        else:
            trainer = [
                "-m",
                "benchmarks.e2e_infer",
                "--nodes",
                str(args.infer_nodes),
                "--hidden",
                str(args.hidden),
            ]
            row, run = stage("infer", launch_cmd(config, args, trainer), args, work)
            row["servers"] = server_startup(run)
            per = results_of(run)
            row["per_trainer"] = per
            if per:
                slowest = max(r["seconds"] for r in per)
                total = per[0]["nodes"] if per[0].get("all_nodes") else sum(r["nodes"] for r in per)
                row |= {"nodes": total, "seconds": slowest, "nodes_per_s": total / max(slowest, 1e-9)}
        rows[name], series[name] = row, run.series
        failed = run.rc != 0
    write_results(args, work, rows, series, meta)
    if not args.keep:  # what this run made goes (the logs too, with a folder it made)
        for path in [work] if created else made:
            shutil.rmtree(path, ignore_errors=True)
    return 1 if failed else 0


def write_results(
    args: argparse.Namespace,
    work: Path,
    rows: dict[str, Any],
    series: dict[str, list[list[float]]],
    meta: Path,
) -> None:
    """The results JSON (stages, machine, the memory series) and its plot; stages not run now (or
    reused from the cache) keep their rows from the JSON already there, each row with its date."""
    out: Path = args.out or RESULTS / f"e2e_scale_{args.scale}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for row in rows.values():
        row.setdefault("date", now)
    old: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    if old:  # a rerun of some stages keeps the earlier run's rows of the others
        for name, row in old.get("stages", {}).items():
            if (name not in rows or rows[name].get("cached")) and not row.get("cached"):
                rows[name], series[name] = row, old.get("series", {}).get(name, [])
        rows = {name: rows[name] for name in STAGES if name in rows}
    graph: dict[str, Any] = {"scale": args.scale, "nodes": 1 << args.scale, "feat_dim": 128}
    if meta.is_file():
        m = json.loads(meta.read_text())
        graph["edges"] = sum(sum(c) for c in m["num_edges_per_chunk"])
        graph["input_bytes"] = tree_bytes(meta.parent)
    graph = {**old.get("graph", {}), **graph}  # the input may be gone by now
    doc = {
        "benchmark": "e2e_scale",
        "date": now,
        "machine": {
            "host": platform.node(),
            "cores": os.cpu_count(),
            "mem_total_bytes": meminfo()["MemTotal"],
        },
        "graph": graph,
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "workdir": str(work),
        "page_cache": "not dropped between stages",
        "stages": rows,
        "series_columns": ["t_s", "tree_pss", "tree_rss", "machine_used", "shmem"],
        "series": {k: v[:: max(1, len(v) // 2000)] for k, v in series.items()},
    }
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}", flush=True)
    from benchmarks.e2e_plot import plot

    plot(doc, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.png')}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
