"""Where each partition's files are written: ``--part-dir`` folders and ``--part-worker`` pins.

``--part-dir P=DIR`` builds partition ``P`` in ``DIR`` (a hidden ``.NAME-partP.work`` folder,
renamed into place at the end). ``--part-worker P=ADDRESS`` (with ``--dask-scheduler``) pins every
task that writes ``P``'s files to one Dask worker, so ``DIR`` may be a disk only that worker's
host sees. The per-part steps the main process used to do itself (folders, preallocated
``.npy`` files, the ``_TYPE`` node tensor, the checks of ``DIR``) are the tasks here, run by
:meth:`asyncgraph.partition.runner.Runner.at_parts` on the pinned worker or in this process.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import NTYPE
from asyncgraph.partition.tasks import Ctx, NpyWriter, preallocate

__all__ = [
    "build_dir",
    "check_part_dir",
    "check_part_dirs",
    "dask_client",
    "on_part",
    "preallocate_feats",
    "prepare_part",
    "remove_tree",
    "resolve_part_workers",
    "split_by_pin",
    "write_ntype_part",
]

Specs = dict[str, tuple[str, tuple[int, ...]]]
T = TypeVar("T")


def build_dir(folder: Path, name: str, p: int) -> Path:
    """The hidden folder partition ``p`` is built in under its ``--part-dir`` folder."""
    return folder / f".{name}-part{p}.work"


def check_part_dir(p: int, folder: Path, name: str, overwrite: bool) -> None:
    """Task: ``folder`` can take partition ``p`` (run where the part is written: its host's view)."""
    if folder.exists() and not folder.is_dir():
        raise InvalidRequestError(f"--part-dir {p}={folder}: {folder} exists and is not a folder")
    build = build_dir(folder, name, p)
    if build.is_symlink() or (build.exists() and not build.is_dir()):  # issue 32: never followed
        raise InvalidRequestError(f"--part-dir {p}={folder}: {build} exists and is not a folder (a link?)")
    final = folder / f"{name}-part{p}"
    if final.exists() and not overwrite:
        raise InvalidRequestError(f"--part-dir {p}={folder}: {final} exists; pass overwrite to replace it")


def remove_tree(path: str) -> None:
    """Task: remove a half-built partition folder (cleanup after a failed run)."""
    shutil.rmtree(path, ignore_errors=True)


def _check_part_id(flag: str, p: object, num_parts: int) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < num_parts:
        raise InvalidRequestError(f"{flag}: part {p!r} is not a part ID in [0, {num_parts})")


def _workers(client: Any) -> dict[str, Any]:
    try:
        info = client.scheduler_info(n_workers=-1)  # every worker (newer releases list 5 by default)
    except TypeError:  # releases before n_workers
        info = client.scheduler_info()
    workers: dict[str, Any] = info.get("workers", {})
    return workers


def resolve_part_workers(client: Any, pins: Mapping[int, str], num_parts: int) -> dict[int, str]:
    """``{part: worker address}`` from addresses or worker names (``dask worker --name``), checked
    against the cluster's workers, or an :class:`InvalidRequestError` naming the bad entry."""
    workers = _workers(client)
    by_name = {str(w.get("name")): addr for addr, w in workers.items()}
    out: dict[int, str] = {}
    for p, where in pins.items():
        _check_part_id("--part-worker", p, num_parts)
        addr = str(where) if str(where) in workers else by_name.get(str(where))
        if addr is None:
            known = ", ".join(sorted(f"{a} ({w.get('name')})" for a, w in workers.items())) or "none"
            raise InvalidRequestError(
                f"--part-worker {p}={where}: not a worker of the Dask cluster (its workers: {known})"
            )
        out[p] = addr
    return out


def prepare_part(ctx: Ctx, p: int, fresh: bool) -> None:
    """Task: partition ``p``'s folders and its sparse ``indptr``/``indices``/``eids`` for the sort
    tasks to fill; ``fresh`` first removes an earlier run's build folder (``--part-dir``)."""
    d = ctx.pdir(p)
    if fresh:
        shutil.rmtree(d, ignore_errors=True)
    (d / "node_feat").mkdir(parents=True, exist_ok=True)
    (d / "edge_feat").mkdir(exist_ok=True)
    nodes = ctx.node_bounds[p + 1] - ctx.node_bounds[p]
    edges = ctx.edge_bounds[p + 1] - ctx.edge_bounds[p]
    preallocate(d / "indptr.npy", np.int64, (nodes + 1,))
    for path in (d / "indices.npy", d / "eids.npy"):
        preallocate(path, np.int64, (edges,))


def preallocate_feats(
    ctx: Ctx, p: int, kind: str, specs: Specs, skip: tuple[str, ...], typed_rows: dict[str, int] | None = None
) -> None:
    """Task: partition ``p``'s sparse ``<kind>_feat/<name>.npy`` files (``kind``: node or edge),
    but those in ``skip`` (the type tensors, written whole later); a per-type tensor
    (``"<type>/<name>"``) gets ``typed_rows[<type>]`` rows, the part's nodes/edges of its type."""
    bounds = ctx.node_bounds if kind == "node" else ctx.edge_bounds
    rows = bounds[p + 1] - bounds[p]
    for fname, (dtype, shape) in specs.items():
        if fname not in skip:
            type_key, sep, _ = fname.partition("/")
            n = (typed_rows or {})[type_key] if sep else rows
            path = ctx.pdir(p) / f"{kind}_feat" / f"{fname}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            preallocate(path, dtype, (n, *shape))


def write_ntype_part(ctx: Ctx, p: int, counts: list[int], rows: int) -> None:
    """Task: partition ``p``'s node tensor ``_TYPE`` (nodes are type-major inside a part)."""
    w = NpyWriter(ctx.pdir(p) / "node_feat" / f"{NTYPE}.npy", np.int64, (sum(counts),))
    for t, k in enumerate(counts):
        for a in range(0, k, rows):
            w.write(np.full(min(rows, k - a), t, dtype=np.int64))
    w.close()


def split_by_pin(pieces: list[tuple[Any, ...]], num_parts: int, pins: Mapping[int, str]
                  ) -> tuple[list[tuple[Any, ...]], list[int | None] | None]:  # fmt: skip
    """Feature-copy tasks with pinned parts: per piece, one task for the unpinned parts (runs
    anywhere) and one per pinned part (on its worker; it reads the piece again). Unpinned runs
    keep one task per piece writing every part."""
    if not pins:
        return pieces, None
    free = tuple(p for p in range(num_parts) if p not in pins)
    tasks: list[tuple[Any, ...]] = []
    labels: list[int | None] = []
    for a in pieces:
        if free:
            tasks.append((*a, free))
            labels.append(None)
        for p in sorted(pins):
            tasks.append((*a, (p,)))
            labels.append(p)
    return tasks, labels


@contextmanager
def dask_client(dask: Any) -> Iterator[Any]:
    """A ``distributed.Client`` for ``dask`` (an address, or a client kept open), else None."""
    if dask is None:
        yield None
        return
    from distributed import Client

    if isinstance(dask, Client):
        yield dask
        return
    client = Client(dask)  # type: ignore[no-untyped-call]
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]


def on_part(client: Any, pins: Mapping[int, str], p: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` where part ``p``'s files live: its pinned worker, else this process."""
    if p in pins:
        out: T = client.submit(fn, *args, pure=False, workers=[pins[p]], allow_other_workers=False).result()
        return out
    return fn(*args)


def check_part_dirs(dirs: Mapping[int, Any], num_parts: int, name: str, overwrite: bool, client: Any,
                     pins: Mapping[int, str]) -> dict[int, Path]:  # fmt: skip
    """``part_dirs`` checked (part IDs in range, folders absolute, no finished part in the way;
    a pinned part's folder as its worker sees it)."""
    out: dict[int, Path] = {}
    for p, d in dirs.items():
        _check_part_id("--part-dir", p, num_parts)
        out[p] = Path(d).absolute()
        on_part(client, pins, p, check_part_dir, p, out[p], name, overwrite)
    return out
