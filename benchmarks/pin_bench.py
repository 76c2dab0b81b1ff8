"""What ``--part-worker`` costs: the same chunked R-MAT graph on a Dask LocalCluster, unpinned
vs every part pinned to a worker (``--part-dir`` for every part in both runs).

``python -m benchmarks.pin_bench --scale 18 --parts 4`` writes the graph of
:func:`benchmarks.chunked_bench.write_rmat_chunked` once (128-d float32 ``feat``, ``label``,
``train_mask``), starts a two-process ``LocalCluster`` and partitions it (random, 4 parts): once
unpinned, once with part ``p`` pinned to worker ``p % 2``. Pinned, each node-data piece is
copied by one task per pinned part, each mapping the piece from shared storage and gathering
its own rows: the figure is the node-data stage time of both runs, and the input pages each
part's rows touch (from the run's own assignment: 4 KiB pages of each feature chunk holding a
row of that part, summed over parts, over the chunk's pages) -- the input read amplification
on storage that does not cache across hosts. The ceiling, measured in the same run: one
sequential read of the node-data input (16 MiB reads). Both outputs are compared byte for byte.
Writes (a row per scale and part count) ``benchmarks/results/pin_bench.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.chunked_bench import write_rmat_chunked
from benchmarks.common import DATA, RESULTS

PAGE = 4096


def read_ceiling(folder: Path) -> tuple[float, int]:
    """(seconds, bytes) to read every file of ``folder`` once, sequentially, in 16 MiB reads."""
    buf = bytearray(16 << 20)
    total = 0
    t0 = time.perf_counter()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb", buffering=0) as f:
                while k := f.readinto(buf):
                    total += k
    return time.perf_counter() - t0, total


def page_amplification(meta: Path, out: Path, name: str, parts: int) -> float:
    """Pages of the ``feat`` chunks touched, summed over parts, over the chunks' pages: how many
    times a pinned run reads the feature input from storage (1.0 unpinned)."""
    cfg = json.loads((out / f"{name}.json").read_text())
    bounds = np.asarray([0, *[p["node_range"][1] for p in cfg["parts"]]], dtype=np.int64)
    orig = np.load(out / cfg["orig_nids"])  # orig[new] = input ID
    new_of = np.empty_like(orig)
    new_of[orig] = np.arange(orig.size, dtype=np.int64)
    m = json.loads(meta.read_text())
    touched = pages = 0
    start = 0
    for rel in m["node_data"]["_N"]["feat"]["data"]:
        arr = np.load(meta.parent / rel, mmap_mode="r")
        k, row = arr.shape[0], arr.dtype.itemsize * int(np.prod(arr.shape[1:]))
        off = arr.offset if hasattr(arr, "offset") else 0
        page = (off + np.arange(k, dtype=np.int64) * row) // PAGE
        part = np.searchsorted(bounds, new_of[start : start + k], side="right") - 1
        touched += sum(int(np.unique(page[part == p]).size) for p in range(parts))
        pages += int(np.unique(page).size)
        start += k
    return touched / max(1, pages)


def run(meta: Path, out: Path, dirs: Path, parts: int, client: Any,
        pins: dict[int, str] | None) -> dict[str, Any]:  # fmt: skip
    from asyncgraph.partition.stream import partition_chunked

    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(dirs, ignore_errors=True)
    t0 = time.perf_counter()
    where = {p: dirs / f"host{p}" for p in range(parts)}
    rep = partition_chunked(meta, parts, out, part_method="random", memory_limit="2GiB",
                            dask_scheduler=client, part_dirs=where, part_workers=pins)  # fmt: skip
    return {"wall_s": time.perf_counter() - t0, "seconds": rep.seconds, "bytes_read": rep.bytes_read,
            "bytes_written": rep.bytes_written, "peak_bytes": rep.peak}  # fmt: skip


def same_parts(a: Path, b: Path, name: str, parts: int) -> bool:
    """Every part folder of run ``a`` equals run ``b``'s, file for file, byte for byte."""
    for p in range(parts):
        da, db = a / f"host{p}", b / f"host{p}"
        fa = sorted(x.relative_to(da) for x in da.rglob("*") if x.is_file())
        fb = sorted(x.relative_to(db) for x in db.rglob("*") if x.is_file())
        if fa != fb or any((da / f).read_bytes() != (db / f).read_bytes() for f in fa):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pin_bench", description=__doc__)
    ap.add_argument("--scale", type=int, default=18)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--keep", action="store_true", help="keep the generated input")
    args = ap.parse_args()
    import distributed

    from asyncgraph.partition.memory import format_size

    folder = args.data / f"rmat{args.scale}"
    meta = write_rmat_chunked(args.scale, folder)
    name = json.loads(meta.read_text())["graph_name"]
    ceil_s, ceil_b = read_ceiling(folder / "node_data")
    rows: dict[str, Any] = {}
    load0 = os.getloadavg()[0]
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                 host="127.0.0.1") as cluster,
        distributed.Client(cluster) as client,
    ):  # fmt: skip
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        pins = {p: workers[p % 2] for p in range(args.parts)}
        for label, pin in (("unpinned", None), ("pinned", pins)):
            rows[label] = run(meta, args.data / f"pin.{label}.out", args.data / f"pin.{label}.dirs",
                              args.parts, client, pin)  # fmt: skip
    same = same_parts(args.data / "pin.unpinned.dirs", args.data / "pin.pinned.dirs", name, args.parts)
    amp = page_amplification(meta, args.data / "pin.pinned.out", name, args.parts)
    for label in rows:
        shutil.rmtree(args.data / f"pin.{label}.out", ignore_errors=True)
        shutil.rmtree(args.data / f"pin.{label}.dirs", ignore_errors=True)
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    u, p = rows["unpinned"], rows["pinned"]
    print(f"2^{args.scale} nodes, {args.parts} parts, LocalCluster of 2 workers; node-data input "
          f"{format_size(ceil_b)}, ceiling (one sequential read) {ceil_s:.2f} s")  # fmt: skip
    for label, r in rows.items():
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in r["seconds"].items())
        print(f"  {label:>8}: {r['wall_s']:.1f} s ({stages}); read {format_size(r['bytes_read'])}")
    print(f"  node data pinned/unpinned {p['seconds']['node data'] / u['seconds']['node data']:.2f}x; "
          f"feature pages read {amp:.2f}x (once per pinned part holding a row on the page); "
          f"outputs byte-identical: {same}; load average {load0:.1f}->{os.getloadavg()[0]:.1f}")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "pin_bench.json"
    old = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    old["rows"] = [r for r in old.get("rows", []) if (r["scale"], r["parts"]) != (args.scale, args.parts)]
    old["rows"].append({
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({os.cpu_count()} cores, shared)", "scale": args.scale,
        "parts": args.parts, "ceiling_read_s": ceil_s, "node_data_bytes": ceil_b, "runs": rows,
        "page_amplification": amp, "byte_identical": same, "load_avg_1min": [load0, os.getloadavg()[0]],
    })  # fmt: skip
    path.write_text(json.dumps(old, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
