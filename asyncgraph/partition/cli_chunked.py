"""The chunked-input half of ``python -m asyncgraph.partition`` (options, run, summary)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from asyncgraph.cli import CliError, Parser
from asyncgraph.partition.layout import config_file
from asyncgraph.partition.memory import DEFAULT_FRACTION, format_size
from asyncgraph.partition.reader import format_summary, summarize_part, summarize_partitions

__all__ = ["add_chunked_options", "check_npz_options", "parse_part_dirs", "parse_part_workers", "run_chunked"]

CHUNKED_ONLY = (
    "memory_limit", "workers", "assignment", "resume", "dask_scheduler", "part_dir", "part_worker",
)  # fmt: skip


def add_chunked_options(ap: Parser) -> None:
    """The options of chunked input (``--input metadata.json``)."""
    ap.add_argument(
        "--memory-limit",
        help="chunked input: peak memory of the whole run, workers included (e.g. 2GiB; default "
        f"{DEFAULT_FRACTION:.0%}% of available memory)",  # '%%': argparse formats help with %
    )
    ap.add_argument("--workers", type=int, help="chunked input: worker processes (default: cores)")
    ap.add_argument(
        "--assignment", type=Path, help="chunked input: folder of DGL assignment files <ntype>.txt"
    )
    ap.add_argument(
        "--resume", action="store_true", help="chunked input: restart after the last finished stage"
    )
    ap.add_argument("--dask-scheduler", help="chunked input: run the tasks on this Dask scheduler")
    ap.add_argument(
        "--part-dir",
        action="append",
        metavar="P=DIR",
        help="chunked input: write partition P into DIR/<graph>-part<P> (e.g. storage of the host "
        "that serves it; the workers must see DIR, or only P's worker with --part-worker); repeat per part",
    )
    ap.add_argument(
        "--part-worker",
        action="append",
        metavar="P=ADDRESS",
        help="with --dask-scheduler: run every task writing partition P on this Dask worker only "
        "(an address such as tcp://10.0.0.2:40000, or a 'dask worker --name'), so its --part-dir "
        "may be a local disk of that host; repeat per part",
    )


def parse_part_dirs(items: list[str] | None, num_parts: int) -> dict[int, Path]:
    """``["0=/a", "1=/b"]`` -> ``{0: Path("/a"), 1: Path("/b")}``, or a CLI error naming the item."""
    out: dict[int, Path] = {}
    for item in items or []:
        p, sep, d = item.partition("=")
        if not sep or not p.strip().isdigit() or not d:
            raise CliError(f"--part-dir {item!r}: expected P=DIR, e.g. 0=/srv/graph")
        if not 0 <= int(p) < num_parts:
            raise CliError(f"--part-dir {item!r}: part {p} is not in [0, {num_parts})")
        if int(p) in out:
            raise CliError(f"--part-dir {item!r}: part {p} is given twice")
        out[int(p)] = Path(d)
    return out


def parse_part_workers(items: list[str] | None, num_parts: int, scheduler: str | None) -> dict[int, str]:
    """``["0=tcp://a:1", "1=hostb"]`` -> ``{0: "tcp://a:1", 1: "hostb"}``, or a CLI error naming
    the item (whether each worker is in the cluster is checked once connected)."""
    if items and scheduler is None:
        raise CliError("--part-worker needs --dask-scheduler: it pins parts to workers of that cluster")
    out: dict[int, str] = {}
    for item in items or []:
        p, sep, w = item.partition("=")
        if not sep or not p.strip().isdigit() or not w.strip():
            raise CliError(f"--part-worker {item!r}: expected P=ADDRESS, e.g. 0=tcp://10.0.0.2:40000")
        if not 0 <= int(p) < num_parts:
            raise CliError(f"--part-worker {item!r}: part {p} is not in [0, {num_parts})")
        if int(p) in out:
            raise CliError(f"--part-worker {item!r}: part {p} is given twice")
        out[int(p)] = w.strip()
    return out


def check_npz_options(args: Any) -> None:
    """Reject chunked-only options with npz input, and a missing --graph-name."""
    for opt in CHUNKED_ONLY:
        if getattr(args, opt) not in (None, False):
            raise CliError(f"--{opt.replace('_', '-')} applies to chunked input (--input metadata.json) only")
    if not args.graph_name:
        raise CliError("--graph-name is required with .npz input")
    if args.method in ("fennel", "kaminpar"):
        raise CliError(f"--method {args.method} applies to chunked input (--input metadata.json) only")


def run_chunked(args: Any) -> int:
    """Partition a chunked graph; prints the stage times, the peak memory and the summary."""
    from asyncgraph.partition.chunked import read_metadata
    from asyncgraph.partition.interrupt import install
    from asyncgraph.partition.stream import partition_chunked

    install()  # SIGTERM / SIGINT keep the finished stages for --resume

    if args.num_trainers_per_machine != 1:
        raise CliError("--num-trainers-per-machine > 1 is not supported with chunked input yet")
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers must be at least 1, got {args.workers}")
    if args.assignment is not None and not args.assignment.is_dir():
        raise CliError(f"--assignment {args.assignment} is not a folder")
    pins = parse_part_workers(args.part_worker, args.num_parts, args.dask_scheduler)
    dirs = parse_part_dirs(args.part_dir, args.num_parts)
    name = args.graph_name or read_metadata(args.input).graph_name
    t0 = time.perf_counter()
    report = partition_chunked(
        args.input,
        args.num_parts,
        args.out,
        graph_name=name,
        part_method=args.method,
        assignment=args.assignment,
        balance_train=args.balance_train,
        balance_edges=args.balance_edges,
        seed=args.seed,
        memory_limit=args.memory_limit,
        workers=args.workers,
        dask_scheduler=args.dask_scheduler,
        overwrite=args.overwrite,
        resume=args.resume,
        progress=True,
        part_dirs=dirs,
        part_workers=pins,
    )
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in report.seconds.items())
    dask = ""
    if report.dask_peaks:  # the workers are the cluster's, not this process' children
        dask = (f" (this process {format_size(report.main_peak)} + {len(report.dask_peaks)} Dask workers "
                f"{format_size(sum(report.dask_peaks.values()))})")  # fmt: skip
    print(
        f"done in {time.perf_counter() - t0:.2f} s ({stages}); peak memory {format_size(report.peak)}{dask} "
        f"of the {format_size(report.limit)} limit; read {format_size(report.bytes_read)}, wrote "
        f"{format_size(report.bytes_written)}"
        + (f"; resumed after {', '.join(report.skipped)}" if report.skipped else ""),
        file=sys.stderr,
    )

    cfg = config_file(args.out, name).absolute()
    if pins:  # a pinned part's files may be on its worker's host only: summarised there
        from asyncgraph.partition.placement import dask_client, on_part, resolve_part_workers

        with dask_client(args.dask_scheduler) as client:
            where = resolve_part_workers(client, pins, args.num_parts)
            rows = [on_part(client, where, p, summarize_part, str(cfg), p) for p in range(args.num_parts)]
    else:
        rows = summarize_partitions(cfg)
    print(format_summary(rows))
    return 0
