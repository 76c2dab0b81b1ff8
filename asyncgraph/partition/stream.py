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
5. ``commit``: ``orig_eids``, the JSON config, and the rename of the finished tree into place.

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
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import ETYPE, NTYPE, TYPE_EID
from asyncgraph.partition.assign_stream import assign_chunked
from asyncgraph.partition.chunked import ChunkedGraph, read_metadata
from asyncgraph.partition.csc_sort import load_counts, part_sizes, plan_sort, sort_range
from asyncgraph.partition.memory import PeakSampler, default_memory_limit, format_size, parse_size
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
    finalize,
    tensor_specs,
    type_edges_before,
)
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
MAIN_BASE = 96 << 20  # the main process: interpreter, numpy, the metadata, the sampler
WORKER_BASE = 64 << 20  # a spawned worker before it holds any chunk
SHUFFLE_BYTES = 112  # per edge row in a shuffle piece (ids, relabelled record, sort by part)
SORT_BYTES = 80  # per edge in a sort bucket (records, packed keys, outputs)
MIN_ROWS = 4096
WORK_FORMAT = 2  # the work folder's layout (2: range-grouped spill + counts); in the resume fingerprint
METIS_EDGE_BYTES = 280  # pymetis 2025.2, measured (see plan_run)
# kaminpar 3.7 (64-bit IDs), jet, 2 threads: its peak in-process, fitted on two graphs (R-MAT 2^20:
# 1.05M nodes, 20.0M adjacency entries, 320 MiB plain / 213 MiB compressed; partition_bench's 2^22
# graph: 4.19M nodes, 42.8M entries, 864 / 632 MiB) is ~12 B an entry + ~96 B a node plain and
# ~6.2 B an entry + ~95 B a node compressed (2.4x slower). An input edge gives at most two entries.
# The phases follow one another, so the stage needs the largest of them: the lean CSR build
# (16 B of keys an input edge + xadj, in-degrees, the degree order and its inverse), KaMinPar
# (plus the categories, in-degrees and order it leaves alive), then the relabelling and METIS'
# repairs (~72 B a node, + 16 B of categories and in-degrees in the file's numbering).
KAMINPAR_EDGE_BYTES = 24
KAMINPAR_COMPRESSED_EDGE_BYTES = 13
KAMINPAR_GRAPH_NODE_BYTES = 96 + 24
KAMINPAR_CSR_EDGE_BYTES = 16
KAMINPAR_CSR_NODE_BYTES = 40
KAMINPAR_NODE_BYTES = 88
KAMINPAR_FIXED = 160 << 20  # the CSR build's block temporaries (2M rows) and KaMinPar's own


@dataclass(frozen=True)
class Plan:
    """Chunk sizes derived from the memory limit (edge rows per piece, edges per sort bucket)."""

    limit: int
    workers: int
    assign_need: int
    worker_budget: int
    edge_rows: int
    sort_edges: int
    data_bytes: int
    compress: bool = False  # kaminpar: load the structure compressed (less memory, slower)
    kaminpar_room: int = 0  # kaminpar: bytes its graph may take (the choice made on the real size)


@dataclass
class RunReport:
    """What a run did: stage times, measured peak memory, bytes moved."""

    seconds: dict[str, float]
    peak: int
    limit: int
    bytes_read: int
    bytes_written: int
    skipped: list[str]


def plan_run(
    g: ChunkedGraph, method: str, limit: int, workers: int, assignment: bool, num_parts: int = 4
) -> Plan:
    """Chunk sizes for ``limit`` bytes, or an error naming the method, what it needs and the limit."""
    n = int(g.node_offsets()[-1])
    e = int(g.edge_offsets()[-1])
    # assign: parts + orig_nids + new_id + the permutation or METIS' structure (src, dst, the
    # symmetric CSR, pymetis' copy and METIS' coarse graphs: the process tree peaked at 2.79 GiB
    # for 2^20 nodes / 10.5M edges, 0.64 GiB for 2^18 / 2.6M: ~265 B an input edge)
    key = "assignment" if assignment else method
    per_node = {"random": 34, "fennel": 34 + 20 * num_parts, "metis": 120, "assignment": 34}
    compress, room = False, 0
    if key == "kaminpar":
        csr = KAMINPAR_CSR_EDGE_BYTES * e + KAMINPAR_CSR_NODE_BYTES * n
        after = KAMINPAR_NODE_BYTES * n
        solve = KAMINPAR_EDGE_BYTES * e + KAMINPAR_GRAPH_NODE_BYTES * n
        assign_need = MAIN_BASE + KAMINPAR_FIXED + max(csr, solve, after)
        if assign_need > limit:  # the compressed graph, if that fits
            compress = True
            solve = KAMINPAR_COMPRESSED_EDGE_BYTES * e + KAMINPAR_GRAPH_NODE_BYTES * n
            assign_need = MAIN_BASE + KAMINPAR_FIXED + max(csr, solve, after)
        room = limit - MAIN_BASE - KAMINPAR_FIXED - KAMINPAR_GRAPH_NODE_BYTES * n
    else:
        per_edge = METIS_EDGE_BYTES if key == "metis" else 0
        assign_need = MAIN_BASE + per_node[key] * n + per_edge * e
    what = "--assignment files" if assignment else f"method {method!r}"
    if assign_need > limit:
        hint = {"metis": " or use --method kaminpar (less memory), fennel (streamed) or random",
                "kaminpar": " or use --method fennel (streamed) or random"}.get(key, "")  # fmt: skip
        raise InvalidRequestError(
            f"{what} needs about {format_size(assign_need)} for {n:,} nodes and {e:,} edges, but "
            f"the memory limit is {format_size(limit)}; raise --memory-limit{hint}"
        )
    budget = (limit - MAIN_BASE) // max(1, workers) - WORKER_BASE
    need = MIN_ROWS * SHUFFLE_BYTES + 8 * max(g.node_offsets()[-1] // max(1, 64), 1)
    if budget < need:
        raise InvalidRequestError(
            f"{what} with {workers} workers needs at least "
            f"{format_size(MAIN_BASE + workers * (WORKER_BASE + need))}, but the memory limit is "
            f"{format_size(limit)}; raise --memory-limit or lower --workers"
        )
    data_bytes = max(1 << 16, budget // 3)
    _check_rows(g, data_bytes, workers, limit)
    return Plan(limit, workers, assign_need, budget, max(MIN_ROWS, budget // SHUFFLE_BYTES),
                max(MIN_ROWS, budget // SORT_BYTES), data_bytes, compress, room)  # fmt: skip


def _check_rows(g: ChunkedGraph, data_bytes: int, workers: int, limit: int) -> None:
    """Refuse a tensor whose one row is more than a copy task may hold (it copies at least one
    row, up to three times): before, a 512 MiB row took a run to 1.1 GiB at a 256 MiB limit."""
    per_type: list[tuple[str, Any, dict[str, Any]]] = [("node", t, d) for t, d in g.node_data.items()]
    per_type += [("edge", ":".join(c), d) for c, d in g.edge_data.items()]
    for kind, key, feats in per_type:
        for fname, chunks in feats.items():
            row = chunks[0].row_bytes
            if row > data_bytes:
                need = MAIN_BASE + workers * (WORKER_BASE + 3 * row)
                raise InvalidRequestError(
                    f"{kind} data {key}/{fname}: one row is {format_size(row)} (row shape "
                    f"{chunks[0].row_shape}), more than the {format_size(data_bytes)} a task may read at "
                    f"once under the memory limit of {format_size(limit)} with {workers} workers; raise "
                    f"--memory-limit to at least {format_size(need)} or lower --workers"
                )


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
    report = RunReport({}, 0, limit, 0, 0, [])
    try:
        with PeakSampler() as sampler:
            _run(g, name, num_parts, out, folder, plan, report, opts, assignment, client, progress, pins)
        report.peak = sampler.peak
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
         progress: bool, pins: dict[int, str]) -> None:  # fmt: skip
    work, state = folder.path, folder.state
    done: list[str] = state["done"]

    def finish(stage: str, t0: float, **extra: Any) -> None:
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
    ctx = Ctx(g, work, num_parts, tuple(state["node_bounds"]), part_build=build)
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
            shutil.rmtree(work / "spill", ignore_errors=True)
            shutil.rmtree(work / "buckets", ignore_errors=True)
            finish("sort", t0)
        nspecs, especs = tensor_specs(g)
        if not skip("node data"):
            t0 = time.perf_counter()
            ntasks: list[tuple[Any, ...]] = []
            pre = [(ctx, p, "node", nspecs, (NTYPE,)) for p in parts]
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
                _count(
                    report,
                    run.map(map_edges, [(ctx, p, plan.edge_rows) for p in range(num_parts)], "edge map"),
                )
                etasks: list[tuple[Any, ...]] = []
                epre = [(ctx, p, "edge", especs, (ETYPE, TYPE_EID)) for p in parts]
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
        placed = sorted(dirs)
        run.map(commit_part, [(ctx.part_build[p], finals[p]) for p in placed], "place parts", parts=placed)
        commit(work / "out", out)
        report.seconds["commit"] = time.perf_counter() - t0


def commit_part(build: str, final: str) -> tuple[int, int]:
    """Task: move a finished partition folder from its build folder into place."""
    commit(Path(build), Path(final))
    return 0, 0


def _count(report: RunReport, results: list[tuple[int, int]]) -> None:
    report.bytes_read += sum(r for r, _ in results)
    report.bytes_written += sum(w for _, w in results)
