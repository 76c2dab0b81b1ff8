"""Out-of-core partitioning of a chunked graph under a memory limit: ``partition_chunked``.

Stages (each records its results in the work folder and then an atomic ``done-<stage>``
marker, so ``resume=True`` restarts after the last finished one):

1. ``assign``: the partition of every node (streamed random, METIS on the structure alone, or
   DGL's ``<ntype>.txt`` assignment files), then the relabelling: ``orig_nids`` and its inverse
   ``new_id.npy`` (nodes ordered by part, type, ID exactly as :func:`partition_graph` does);
2. ``shuffle``: every edge chunk, piece by piece, relabelled and spilled by destination part;
3. ``sort``: each part's edges sorted into CSC (external, by destination range, when they
   exceed the memory a worker has), writing ``indptr``/``indices``/``eids``;
4. ``node data`` and ``edge data``: feature rows streamed from the input chunks into the parts'
   files;
5. ``commit``: ``orig_eids``, the JSON config, every part checked, the measured peak memory
   checked against the limit (over it: ``MemoryBudgetError``, nothing in place), and the rename
   of the finished tree into place.

The work folder is ``.<out>.work`` beside ``out``; the output appears only by that final
rename, so nothing half-written is ever taken for output. Tasks run inline, on a process pool
(``workers``) or on a Dask cluster (``dask_scheduler``): see :mod:`asyncgraph.partition.runner`;
``part_dirs`` and ``part_workers`` place each partition's files: see
:mod:`asyncgraph.partition.placement`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import ETYPE, NTYPE, TYPE_EID
from asyncgraph.partition.assign_stream import assign_chunked, check_assignment_meta
from asyncgraph.partition.chunked import ChunkedGraph, read_metadata
from asyncgraph.partition.csc_sort import load_counts, part_sizes, plan_sort, sort_range
from asyncgraph.partition.interrupt import Interrupted, held, signal_name
from asyncgraph.partition.memory import DaskPeaks, PeakSampler, default_memory_limit, parse_size
from asyncgraph.partition.output import check_out_path, commit
from asyncgraph.partition.placement import (
    build_dir,
    check_part_dirs,
    dask_client,
    on_part,
    preallocate_feats,
    prepare_part,
    remove_tree,
    resolve_part_workers,
    split_by_pin,
    write_ntype_part,
)
from asyncgraph.partition.runner import Runner
from asyncgraph.partition.stream_meta import (
    check_and_stamp,
    check_config,
    etype_counts,
    finalize,
    tensor_specs,
    type_edges_before,
)
from asyncgraph.partition.stream_plan import MAIN_BASE, MIN_ROWS, WORK_FORMAT, Plan, plan_run
from asyncgraph.partition.tasks import (
    Ctx,
    copy_edge_rows,
    copy_node_rows,
    map_edges,
    preallocate,
    shuffle_edges,
    write_type_tensors,
)
from asyncgraph.partition.workdir import WorkFolder, fingerprint

__all__ = ["Plan", "RunReport", "partition_chunked", "plan_run"]

METHODS = ("random", "metis", "kaminpar", "fennel")


@dataclass
class RunReport:
    """What a run did: stage times, measured peak memory, bytes moved."""

    seconds: dict[str, float]
    peak: int
    limit: int
    bytes_read: int
    bytes_written: int
    skipped: list[str]
    main_peak: int = 0  # this process and its children (the pool's workers)
    dask_peaks: dict[str, int] = field(default_factory=dict)  # Dask worker address -> its peak


def _input_files(g: ChunkedGraph) -> list[Path]:
    files = [g.meta_path] + [c.path for cs in g.edges.values() for c in cs]
    files += [c.path for d in g.node_data.values() for cs in d.values() for c in cs]
    files += [c.path for d in g.edge_data.values() for cs in d.values() for c in cs]
    return files


def _stop_hook(stage: str) -> None:
    """Testing hook: ``ASYNCGRAPH_PARTITION_KILL_AFTER=<stage>`` SIGKILLs the run after it."""
    if os.environ.get("ASYNCGRAPH_PARTITION_KILL_AFTER") == stage:
        os.kill(os.getpid(), signal.SIGKILL)


def partition_chunked(
    metadata: str | os.PathLike[str],
    num_parts: int,
    out_path: str | os.PathLike[str],
    *,
    graph_name: str | None = None,
    part_method: str = "random",
    assignment: str | os.PathLike[str] | None = None,
    balance_train: bool = False,
    balance_edges: bool = False,
    seed: int = 0,
    memory_limit: int | str | None = None,
    workers: int | None = None,
    dask_scheduler: Any = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = False,
    part_dirs: Mapping[int, str | os.PathLike[str]] | None = None,
    part_workers: Mapping[int, str] | None = None,
) -> RunReport:
    """Partition the chunked graph of ``metadata`` (DGL's format) under ``memory_limit``.

    The output is the partition format of :func:`partition_graph` and, for the same method and
    seed, the same bytes as ``partition_graph(load_chunked(metadata), ...)``. ``assignment``
    is a folder of DGL partition-assignment files (``<ntype>.txt``, a part ID a line); its
    balance is kept as given. Bad input raises :class:`InvalidRequestError` and leaves
    ``out_path`` as it was. Returns stage times and the peak memory measured over all processes.
    ``part_dirs`` (``--part-dir P=DIR``): partition ``P``'s files are written straight into
    ``DIR/<graph_name>-part<P>`` (e.g. on the storage of the host that will serve it; the
    workers writing it must see ``DIR``), built in a hidden sibling and renamed into place by a
    task at the end; the JSON config lists that absolute path. ``part_workers``
    (``--part-worker P=ADDRESS``, with ``dask_scheduler``): every task writing partition ``P``'s
    files (its folders, preallocation, sort, feature rows, type tensors, the final rename) runs
    on that Dask worker only (an address or a ``dask worker --name``), so ``P``'s ``part_dirs``
    folder may exist on that worker's host alone; feature copies then run once per pinned part
    (each reads the input piece from shared storage). Checked against the cluster's workers
    before anything is written.
    """
    if dask_scheduler is not None:  # Dask workers run in other folders (and on other hosts)
        metadata, out_path = Path(metadata).absolute(), Path(out_path).absolute()
    g = read_metadata(Path(metadata))
    name = graph_name or g.graph_name
    if not name or "/" in name or name.startswith("."):
        raise InvalidRequestError(f"graph_name {name!r} is not valid: it must be a non-empty file name")
    n = int(g.node_offsets()[-1])
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or not 1 <= num_parts <= max(n, 1):
        raise InvalidRequestError(f"num_parts must be an int in [1, num_nodes={n}], got {num_parts!r}")
    if part_method not in METHODS:
        raise InvalidRequestError(f"unknown part_method {part_method!r}; expected one of {list(METHODS)}")
    if part_method == "kaminpar" and assignment is None:
        try:
            import kaminpar  # noqa: F401
        except ImportError:
            raise InvalidRequestError(
                "part_method 'kaminpar' needs the kaminpar package: pip install 'asyncgraph[kaminpar]'"
            ) from None
    limit = parse_size(memory_limit) if memory_limit is not None else default_memory_limit()
    nworkers = os.cpu_count() or 1 if workers is None else int(workers)
    if nworkers < 1:
        raise InvalidRequestError(f"workers must be at least 1, got {workers}")
    if dask_scheduler is not None:
        nworkers = max(1, nworkers)
    if part_workers and dask_scheduler is None:
        raise InvalidRequestError("--part-worker needs --dask-scheduler: it pins parts to Dask workers")
    nw = 1 if dask_scheduler is not None else nworkers
    plan = plan_run(g, part_method, limit, nw, assignment is not None, num_parts)
    if assignment is not None:
        check_assignment_meta(Path(assignment), num_parts)
    out = Path(out_path)
    check_out_path(out, overwrite)
    with dask_client(dask_scheduler) as client:
        pins = resolve_part_workers(client, part_workers, num_parts) if part_workers else {}
        placed = check_part_dirs(part_dirs or {}, num_parts, name, overwrite, client, pins)
        return _partition(g, name, num_parts, out, placed, pins, client, limit, plan, part_method, assignment,
                          balance_train, balance_edges, seed, resume, progress)  # fmt: skip


def _partition(g: ChunkedGraph, name: str, num_parts: int, out: Path, placed: dict[int, Path],
               pins: dict[int, str], client: Any, limit: int, plan: Plan, part_method: str, assignment: Any,
               balance_train: bool, balance_edges: bool, seed: int, resume: bool,
               progress: bool) -> RunReport:  # fmt: skip
    """The run, once its options are checked: work folder, stages, cleanup after a failure."""
    opts = {"parts": num_parts, "method": part_method, "assignment": str(assignment), "seed": seed,
            "train": balance_train, "edges": balance_edges, "name": name,
            "part_dirs": {str(p): str(d) for p, d in sorted(placed.items())},
            "work_format": WORK_FORMAT}  # fmt: skip
    fp = fingerprint(_input_files(g), opts)
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = WorkFolder(out)
    folder.open(fp, resume)
    work = folder.path
    if resume and not folder.resumed:  # a requeued job passes --resume on its first run too
        print(f"--resume: nothing to resume ({work} holds no earlier run); starting from the first stage",
              file=sys.stderr, flush=True)  # fmt: skip
    report = RunReport({}, 0, limit, 0, 0, [])
    try:
        with PeakSampler() as sampler, DaskPeaks(client) as dask_peaks:
            _run(g, name, num_parts, out, folder, plan, report, opts, assignment, client, progress, pins,
                 lambda: sampler.check(limit, MAIN_BASE))  # fmt: skip
        report.main_peak, report.dask_peaks = sampler.peak, dask_peaks.peaks
        report.peak = sampler.peak + sum(dask_peaks.peaks.values())
    except (Interrupted, KeyboardInterrupt) as exc:  # not a failure: the finished stages are kept
        sig = signal_name(exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
        kept = ", ".join(folder.state["done"]) or "none"
        print(f"interrupted by {sig}: {work} keeps the finished stages ({kept}); run the same command "
              "with --resume to go on from there", file=sys.stderr, flush=True)  # fmt: skip
        raise
    except BaseException:
        if not resume:
            shutil.rmtree(work, ignore_errors=True)
            for p in placed:
                with contextlib.suppress(Exception):  # best effort: the run's own error is what matters
                    on_part(client, pins, p, remove_tree, str(build_dir(placed[p], name, p)))
        raise
    shutil.rmtree(work, ignore_errors=True)
    return report


def _run(g: ChunkedGraph, name: str, num_parts: int, out: Path, folder: WorkFolder, plan: Plan,
         report: RunReport, opts: dict[str, Any], assignment: Any, client: Any,
         progress: bool, pins: dict[int, str], check_memory: Callable[[], None]) -> None:  # fmt: skip
    work, state = folder.path, folder.state
    done: list[str] = state["done"]

    def finish(stage: str, t0: float, **extra: Any) -> None:
        with held():  # a signal now takes effect once the stage is recorded
            state.update(extra)
            done.append(stage)
            report.seconds[stage] = time.perf_counter() - t0
            folder.save()
            _stop_hook(stage)

    def skip(stage: str) -> bool:
        if stage in done:
            report.skipped.append(stage)
            if progress:
                print(f"{stage}: done by an earlier run, skipped", flush=True, file=__import__("sys").stderr)
        return stage in done

    hetero = not g.is_homogeneous
    if not skip("assign"):
        t0 = time.perf_counter()
        for d in ("out", "spill", "sorted"):
            shutil.rmtree(work / d, ignore_errors=True)
        (work / "out").mkdir()
        bounds, tcounts = assign_chunked(g, num_parts, work, opts, assignment, plan, progress)
        finish("assign", t0, node_bounds=bounds, type_counts=tcounts)
    dirs = {int(p): Path(d) for p, d in opts["part_dirs"].items()}
    build = tuple(str(build_dir(dirs[p], name, p)) if p in dirs else "" for p in range(num_parts))
    tcounts_all = tuple(tuple(int(x) for x in c) for c in (state.get("type_counts") or ()))
    ctx = Ctx(g, work, num_parts, tuple(state["node_bounds"]), part_build=build, type_counts=tcounts_all)
    parts = list(range(num_parts))
    with Runner(plan.workers, client, progress, pins) as run:
        if not skip("shuffle"):
            t0 = time.perf_counter()
            shutil.rmtree(work / "spill", ignore_errors=True)
            for p in range(num_parts):
                ctx.spill_dir(p).mkdir(parents=True)
            tasks: list[tuple[Any, ...]] = []
            spread = max(MIN_ROWS, -(-int(g.edge_offsets()[-1]) // (4 * plan.workers)))  # keep all busy
            for r, c in enumerate(g.canonical_etypes):
                for ci, ch in enumerate(g.edges[c]):
                    step = ch.rows if ch.fmt == "csv" else min(plan.edge_rows, spread)
                    for lo in range(0, ch.rows, max(1, step)):
                        tasks.append((ctx, r, ci, lo, min(ch.rows, lo + step), plan.edge_rows, len(tasks)))
            _count(report, run.map(shuffle_edges, tasks, "shuffle", [(a[4] - a[3]) * 16 for a in tasks]))
            sizes = part_sizes(load_counts(ctx, len(tasks)), num_parts)
            finish("shuffle", t0, edge_bounds=[0, *np.cumsum(sizes).tolist()], shuffle_tasks=len(tasks))
        ctx = replace(ctx, edge_bounds=tuple(state["edge_bounds"]))
        if not skip("sort"):
            t0 = time.perf_counter()
            shutil.rmtree(work / "sorted", ignore_errors=True)
            (work / "sorted").mkdir()
            run.at_parts(prepare_part, [(ctx, p, p in dirs) for p in parts], parts, "prepare")
            preallocate(ctx.oeids_file, np.int64, (ctx.edge_bounds[-1],))
            e_all = int(g.edge_offsets()[-1])
            target = max(MIN_ROWS, min(plan.sort_edges, -(-e_all // (4 * plan.workers))))  # all busy
            stasks = plan_sort(ctx, load_counts(ctx, int(state["shuffle_tasks"])), target)
            _count(report, run.map(sort_range, [(*a, plan.sort_edges) for a in stasks], "sort",
                                   [sum(x[2] for x in a[5]) * ctx.rec_bytes for a in stasks],
                                   [a[1] for a in stasks]))  # fmt: skip
            with held():  # the shuffle's recorded spill goes only together with recording the sort
                shutil.rmtree(work / "spill", ignore_errors=True)
                shutil.rmtree(work / "buckets", ignore_errors=True)
                finish("sort", t0)
        nspecs, especs = tensor_specs(g)
        if not skip("node data"):
            t0 = time.perf_counter()
            ntasks: list[tuple[Any, ...]] = []
            ntyped = [dict(zip(g.ntypes, c, strict=True)) for c in tcounts_all] if hetero else []
            pre = [(ctx, p, "node", nspecs, (NTYPE,), ntyped[p] if hetero else None) for p in parts]
            run.at_parts(preallocate_feats, pre, parts, "node files")
            for t, feats in g.node_data.items():
                for fname, chunks in feats.items():
                    for ci, ch in enumerate(chunks):
                        step = max(1, plan.data_bytes // max(1, ch.row_bytes))
                        ntasks += [
                            (ctx, t, fname, ci, lo, min(ch.rows, lo + step)) for lo in range(0, ch.rows, step)
                        ]
            ntasks, nparts = split_by_pin(ntasks, num_parts, pins)
            nbytes = [(a[5] - a[4]) * g.node_data[a[1]][a[2]][a[3]].row_bytes for a in ntasks]
            _count(report, run.map(copy_node_rows, ntasks, "node data", nbytes, nparts))
            if hetero:
                args = [(ctx, p, state["type_counts"][p], plan.edge_rows) for p in parts]
                run.at_parts(write_ntype_part, args, parts, "node types")
            finish("node data", t0)
        if not skip("edge data"):
            t0 = time.perf_counter()
            if g.edge_data:
                e = int(g.edge_offsets()[-1])
                preallocate(work / "new_eid.npy", np.int64, (e,))
                if hetero:  # each edge's row in its part's per-type tensors (map_edges)
                    preallocate(work / "type_row.npy", np.int64, (e,))
                _count(
                    report,
                    run.map(map_edges, [(ctx, p, plan.edge_rows) for p in range(num_parts)], "edge map"),
                )
                etasks: list[tuple[Any, ...]] = []
                ecounts = etype_counts(ctx, plan.edge_rows) if hetero else []
                ekeys = [":".join(c) for c in g.canonical_etypes]
                epre = [(ctx, p, "edge", especs, (ETYPE, TYPE_EID), dict(zip(ekeys, ecounts[p], strict=True))
                         if hetero else None) for p in parts]  # fmt: skip
                run.at_parts(preallocate_feats, epre, parts, "edge files")
                for c, feats in g.edge_data.items():
                    r = g.canonical_etypes.index(c)
                    for fname, chunks in feats.items():
                        for ci, ch in enumerate(chunks):
                            step = max(1, plan.data_bytes // max(1, ch.row_bytes))
                            etasks += [
                                (ctx, r, fname, ci, lo, min(ch.rows, lo + step))
                                for lo in range(0, ch.rows, step)
                            ]
                etasks, eparts = split_by_pin(etasks, num_parts, pins)
                ebytes = [(a[5] - a[4]) * g.edge_data[g.canonical_etypes[a[1]]][a[2]][a[3]].row_bytes
                          for a in etasks]  # fmt: skip
                _count(report, run.map(copy_edge_rows, etasks, "edge data", ebytes, eparts))
            if hetero:
                before = type_edges_before(ctx, plan.edge_rows)
                targs = [(ctx, p, plan.edge_rows, before[p]) for p in parts]
                _count(report, run.map(write_type_tensors, targs, "edge types", parts=parts))
            finish("edge data", t0)
        t0 = time.perf_counter()
        finals = [str(dirs[p] / f"{name}-part{p}") if p in dirs else "" for p in range(num_parts)]
        finalize(ctx, name, opts, nspecs, especs, state, plan.edge_rows, finals)
        check = check_config(ctx, name)  # every part loads as a server loads it, before any rename
        check_and_stamp(ctx, name, check, parts, run.at_parts)  # + fingerprints, where the parts are
        (work / "check.json").unlink()
        check_memory()  # a run that went over --memory-limit fails here: nothing is put in place
        placed = sorted(dirs)
        run.map(commit_part, [(ctx.part_build[p], finals[p]) for p in placed], "place parts", parts=placed)
        with held():
            commit(work / "out", out)
        report.seconds["commit"] = time.perf_counter() - t0


def commit_part(build: str, final: str) -> tuple[int, int]:
    """Task: move a finished partition folder from its build folder into place."""
    commit(Path(build), Path(final))
    return 0, 0


def _count(report: RunReport, results: list[tuple[int, int]]) -> None:
    report.bytes_read += sum(r for r, _ in results)
    report.bytes_written += sum(w for _, w in results)
