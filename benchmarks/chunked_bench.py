"""Out-of-core partitioning of chunked R-MAT graphs: time, peak memory, bytes, cut, balance.

``python -m benchmarks.chunked_bench --scales 20 22 --methods random metis [--limit-random 2GiB]
[--limit-metis 6GiB] [--workers 2] [--in-memory]`` writes each graph once into
``benchmarks/data/chunked<scale>/`` in DGL's chunked format (seeded R-MAT edges, ~10 a node,
IDs permuted, numpy edge chunks of 4M rows; 128-d float32 ``feat``, ``label``, ``train_mask``
in 1M-row chunks; generated chunk by chunk, so any scale fits), then for each method runs
``python -m asyncgraph.partition --input .../metadata.json --num-parts 4 ...`` in a fresh process
and samples ``RssAnon + RssShmem`` over that process and all its workers every 20 ms. Beside
each run it measures the ceiling in the same run: a sequential copy (16 MiB reads and writes, no
fsync, as the partitioner) of the input bytes read plus a write of the output bytes, on the same
disk. ``--in-memory`` also times today's in-memory path (``partition_graph`` of the loaded graph)
where it fits. Wall times on a shared machine vary with other users' load (recorded), so CPU
seconds (user + system, the process and its workers) are reported beside them.
Writes ``benchmarks/results/chunked_bench.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import DATA, RESULTS, ROOT
from benchmarks.synthetic import rmat_edges

EDGES_PER_NODE = 10
EDGE_CHUNK = 1 << 22
NODE_CHUNK = 1 << 20
FEAT_DIM = 128


def _write_chunked(folder: Path, name: str, edge_pieces: Iterator[np.ndarray],
                   node_pieces: Iterator[dict[str, np.ndarray]]) -> Path:  # fmt: skip
    """Write one homogeneous graph in the chunked format, a piece at a time, into ``folder``
    (built in a ``.tmp`` sibling and renamed, so a killed run leaves no half graph); kept if
    already there. ``edge_pieces``: ``(k, 2)`` ID arrays; ``node_pieces``: ``{name: rows}``."""
    meta_path = folder / "metadata.json"
    if meta_path.is_file():
        return meta_path
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "edges").mkdir(parents=True)
    (tmp / "node_data").mkdir()
    edge_files, edge_counts = [], []
    for i, edges in enumerate(edge_pieces):
        np.save(tmp / "edges" / f"e{i}.npy", edges)
        edge_files.append(f"edges/e{i}.npy")
        edge_counts.append(len(edges))
    data: dict[str, list[str]] = {}
    node_counts = []
    for i, piece in enumerate(node_pieces):
        for key, rows in piece.items():
            np.save(tmp / "node_data" / f"{key}{i}.npy", rows)
            data.setdefault(key, []).append(f"node_data/{key}{i}.npy")
        node_counts.append(len(next(iter(piece.values()))))
    meta = {
        "graph_name": name,
        "node_type": ["_N"],
        "num_nodes_per_chunk": [node_counts],
        "edge_type": ["_N:_E:_N"],
        "num_edges_per_chunk": [edge_counts],
        "edges": {"_N:_E:_N": {"format": {"name": "numpy"}, "data": edge_files}},
        "node_data": {"_N": {k: {"format": {"name": "numpy"}, "data": v} for k, v in data.items()}},
        "edge_data": {},
    }
    (tmp / "metadata.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    return meta_path


def write_rmat_chunked(scale: int, folder: Path, seed: int = 0) -> Path:
    """Write a seeded R-MAT graph in the chunked format, one chunk in memory at a time."""
    if (folder / "metadata.json").is_file():
        return folder / "metadata.json"
    rng = np.random.default_rng(seed)
    n, m = 1 << scale, EDGES_PER_NODE << scale
    perm = rng.permutation(n)

    def edges() -> Iterator[np.ndarray]:
        for a in range(0, m, EDGE_CHUNK):
            src, dst = rmat_edges(scale, min(EDGE_CHUNK, m - a), rng)
            yield np.stack([perm[src], perm[dst]], axis=1)

    def nodes() -> Iterator[dict[str, np.ndarray]]:  # drawn after every edge, as before
        for a in range(0, n, NODE_CHUNK):
            k = min(NODE_CHUNK, n - a)
            yield {
                "feat": rng.standard_normal((k, FEAT_DIM), dtype=np.float32),
                "label": rng.integers(0, 50, k, dtype=np.int64),
                "train_mask": rng.random(k) < 0.1,
            }

    return _write_chunked(folder, f"rmat{scale}", edges(), nodes())


def write_synth_chunked(scale: int, folder: Path, seed: int = 0) -> Path:
    """Write ``partition_bench``'s graph (:func:`benchmarks.synthetic.make_synthetic`: R-MAT plus
    uniform edges, symmetric, de-duplicated) in the chunked format: the graph of the issue's
    in-memory METIS reference figure, so both paths can be timed on the same edges. Built in
    memory (like ``partition_bench``), then written in the same chunk sizes as the R-MAT graph."""
    from benchmarks.synthetic import make_synthetic

    if (folder / "metadata.json").is_file():
        return folder / "metadata.json"
    g = make_synthetic(scale, seed)
    n, m = 1 << scale, int(g["src"].size)
    names = ("feat", "label", "train_mask", "val_mask", "test_mask")
    edges = (np.stack([g["src"][a : a + EDGE_CHUNK], g["dst"][a : a + EDGE_CHUNK]], axis=1)
             for a in range(0, m, EDGE_CHUNK))  # fmt: skip
    nodes = ({k: g[k][a : a + NODE_CHUNK] for k in names} for a in range(0, n, NODE_CHUNK))
    return _write_chunked(folder, f"synth{scale}", edges, nodes)


GRAPHS = {"rmat": ("chunked", write_rmat_chunked), "synth": ("synth_chunked", write_synth_chunked)}


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def copy_ceiling(inputs: Path, out_bytes: int, scratch: Path) -> tuple[float, float]:
    """(wall, CPU) seconds to read every input file once and write ``out_bytes`` once, sequentially."""
    buf = bytearray(16 << 20)
    t0 = time.perf_counter()
    c0 = time.process_time()
    for p in sorted(inputs.rglob("*")):
        if p.is_file():
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
    with open(scratch, "wb", buffering=0) as f:
        left = out_bytes
        while left > 0:
            f.write(memoryview(buf)[: min(left, len(buf))])
            left -= len(buf)
    dt_s, cpu = time.perf_counter() - t0, time.process_time() - c0
    scratch.unlink()
    return dt_s, cpu


def run_cli(meta: Path, method: str, limit: str, workers: int, out: Path) -> dict[str, Any]:
    from asyncgraph.partition.memory import PeakSampler

    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "asyncgraph.partition",
        "--input",
        str(meta),
        "--num-parts",
        "4",
        "--method",
        method,
        "--memory-limit",
        limit,
        "--workers",
        str(workers),
        "--out",
        str(out),
    ]
    t0 = time.perf_counter()
    cpu0 = _children_cpu()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    with PeakSampler(root=proc.pid, interval=0.02) as sampler:
        stdout, stderr = proc.communicate()
        cpu = _children_cpu() - cpu0  # the CLI and its workers (waited for), not the sampler
    wall = time.perf_counter() - t0
    if proc.returncode != 0:  # e.g. a limit too small for the method: reported, not fatal
        return {"wall_s": wall, "cpu_s": cpu, "peak_bytes": sampler.peak, "error": stderr.strip()[-500:]}
    done = [x for x in stderr.splitlines() if x.startswith("done in")][-1]
    notes = [x for x in stderr.splitlines() if x.startswith("kaminpar:")]
    return {"wall_s": wall, "cpu_s": cpu, "peak_bytes": sampler.peak, "stages": done, "summary": stdout,
            "notes": notes}  # fmt: skip


def _children_cpu() -> float:
    """User + system CPU seconds of this process' waited-for descendants."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def quality(out: Path, name: str) -> dict[str, float]:
    from asyncgraph.partition.reader import summarize_partitions

    rows = summarize_partitions(out / f"{name}.json")
    nodes = np.array([r["owned_nodes"] for r in rows], dtype=float)
    edges = np.array([r["in_edges"] for r in rows], dtype=float)
    cut = sum(r["remote_src_edges"] for r in rows) / max(1.0, edges.sum())
    return {
        "edge_cut": cut,
        "node_balance": nodes.max() / nodes.mean(),
        "edge_balance": edges.max() / edges.mean(),
    }


def in_memory(meta: Path, method: str, out: Path) -> dict[str, Any]:
    """Today's in-memory path in a fresh process: wall time and its peak (ru_maxrss)."""
    code = (
        "import sys,time,resource; from asyncgraph.partition.chunked import load_chunked; "
        "from asyncgraph.partition import partition_graph; t=time.perf_counter(); "
        f"partition_graph(load_chunked({str(meta)!r}), 'g', 4, {str(out)!r}, part_method={method!r}); "
        "print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024)"
    )
    shutil.rmtree(out, ignore_errors=True)
    cpu0 = _children_cpu()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    cpu = _children_cpu() - cpu0
    wall, peak = res.stdout.split()
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": float(wall), "cpu_s": cpu, "peak_bytes": int(peak)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chunked_bench", description=__doc__)
    ap.add_argument("--scales", type=int, nargs="+", default=[20])
    ap.add_argument("--methods", nargs="+", default=["random", "metis"])
    ap.add_argument("--limit-random", default="2GiB")
    ap.add_argument("--limit-metis", default="6GiB", help="limit of the METIS-class methods")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--in-memory", action="store_true", help="also time partition_graph in memory")
    ap.add_argument("--keep", action="store_true", help="keep the generated input")
    ap.add_argument("--data", type=Path, default=DATA, help="folder for the inputs, outputs and spill")
    ap.add_argument(
        "--graph",
        choices=sorted(GRAPHS),
        default="rmat",
        help="rmat (default: pure R-MAT, 10 edges a node) or synth (partition_bench's graph)",
    )
    args = ap.parse_args()
    prefix, writer = GRAPHS[args.graph]
    data_dir: Path = args.data
    data_dir.mkdir(parents=True, exist_ok=True)
    from asyncgraph.partition.memory import format_size, parse_size

    rows = []
    for scale in args.scales:
        folder = data_dir / f"{prefix}{scale}"
        t0 = time.perf_counter()
        meta = writer(scale, folder)
        name = json.loads(meta.read_text())["graph_name"]
        num_edges = sum(sum(c) for c in json.loads(meta.read_text())["num_edges_per_chunk"])
        print(
            f"scale {scale}: input {format_size(tree_bytes(folder))} "
            f"ready in {time.perf_counter() - t0:.1f} s"
        )
        for method in args.methods:
            limit = args.limit_random if method in ("random", "fennel") else args.limit_metis
            out = data_dir / f"{prefix}{scale}.{method}.out"
            load0 = os.getloadavg()[0]
            r = run_cli(meta, method, limit, args.workers, out)
            r["load_avg_1min"] = [load0, os.getloadavg()[0]]  # a shared machine: other users' load
            if "error" in r:
                print(f"  {method:>6} 4-way within {limit}: {r['error']}", flush=True)
                rows.append({"scale": scale, "graph": args.graph, "method": method,
                             "limit_bytes": parse_size(limit), **r})  # fmt: skip
                continue
            in_b, out_b = tree_bytes(folder), tree_bytes(out)
            qual = quality(out, name)
            shutil.rmtree(out, ignore_errors=True)  # disk: the ceiling writes as many bytes again
            ceil, ceil_cpu = copy_ceiling(folder, out_b, data_dir / "ceiling.bin")
            row = {
                "scale": scale,
                "graph": args.graph,
                "nodes": 1 << scale,
                "edges": num_edges,
                "method": method,
                "workers": args.workers,
                "limit_bytes": parse_size(limit),
                **r,
                **qual,
                "input_bytes": in_b,
                "ceiling_cpu_s": ceil_cpu,
                "output_bytes": out_b,
                "ceiling_s": ceil,
                "x_ceiling": r["wall_s"] / ceil,
            }
            shutil.rmtree(out, ignore_errors=True)
            if args.in_memory:
                row["in_memory"] = in_memory(meta, method, data_dir / "inmem.out")
            row.pop("summary")
            rows.append(row)
            print(
                f"  {method:>6} 4-way: {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s (ceiling: sequential copy "
                f"{ceil:.1f} s, CPU {ceil_cpu:.1f} s; "
                f"{row['x_ceiling']:.2f}x), peak {format_size(r['peak_bytes'])} of {limit}, "
                f"read {format_size(in_b)} wrote {format_size(out_b)}, cut {row['edge_cut']:.1%}, "
                f"balance nodes {row['node_balance']:.3f} edges {row['edge_balance']:.3f}, "
                f"load average {r['load_avg_1min'][0]:.1f}->{r['load_avg_1min'][1]:.1f}"
                + (
                    f"; in memory {row['in_memory']['wall_s']:.1f} s, "
                    f"CPU {row['in_memory']['cpu_s']:.1f} s, peak "
                    f"{format_size(row['in_memory']['peak_bytes'])}"
                    if "in_memory" in row
                    else ""
                ),
                flush=True,
            )
            print(f"    {r['stages']}" + "".join(f"; {x}" for x in r["notes"]), flush=True)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "chunked_bench.json"
    old = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    new = {(x["scale"], x["graph"], x["method"]) for x in rows}
    old["runs"] = [r for r in old["runs"] if (r["scale"], r.get("graph", "rmat"), r["method"]) not in new]
    old["runs"] += rows
    old["date"] = dt.date.today().isoformat()
    old["machine"] = f"{platform.node()} ({os.cpu_count()} cores)"
    path.write_text(json.dumps(old, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
