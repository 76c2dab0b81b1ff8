"""Turn one run of DGL's peer harness (``../shared/peers/dgl/run_all.sh``) into a reference JSON.

Our benchmarks print ratios to another system only from a same-day run given as
``--dgl-results R.json`` (see ``benchmarks.common.load_reference``). This reads the harness's
``results.jsonl`` (one JSON line per measured point, tagged by step) and writes the figures our
benchmarks compare with, with their provenance (system, date of the run, machine):

``python -m benchmarks.dgl_reference $DGLBENCH_ROOT/results/large-<time>``
(writes ``benchmarks/results/dgl_reference.json``; ``--out`` to choose)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "results.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (give the folder run_all.sh printed as 'results ->')")
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _pick(lines: list[dict[str, Any]], tag: str, bench: str, **match: Any) -> list[dict[str, Any]]:
    return [
        d
        for d in lines
        if d.get("_tag") == tag and d.get("bench") == bench and all(d.get(k) == v for k, v in match.items())
    ]


def _rows(lines: list[dict[str, Any]], tag: str, bench: str, mode: str) -> dict[str, dict[str, float]]:
    """Aggregate (all trainers) rows/s and p99 per batch size."""
    out: dict[str, dict[str, float]] = {}
    for d in _pick(lines, tag, bench, mode=mode):
        out[str(d["batch_rows"])] = {"rows_s": d["rows_per_s"], "p50_ms": d["p50_ms"], "p99_ms": d["p99_ms"]}
    return out


def _epoch(d: dict[str, Any]) -> dict[str, Any]:
    return {
        "epoch_s": d["epoch_s"],
        "batches_total": d["batches_total"],
        "sim_ms": d.get("sim_compute_ms", 0.0),
        "per_batch_ms": {
            "sample": 1000 * d["avg_sample_s_per_batch"],
            "pull": 1000 * d["avg_fetch_s_per_batch"],
            "compute": 1000 * d["avg_compute_s_per_batch"],
        },
    }


def reference(run_dir: Path) -> dict[str, Any]:
    """The reference JSON of one harness run (figures present in the run only)."""
    lines = _lines(run_dir)
    stamp = run_dir.name.split("-", 1)[-1]  # large-20261123-091500
    try:
        date = dt.datetime.strptime(stamp, "%Y%m%d-%H%M%S").date().isoformat()
    except ValueError:
        date = dt.date.fromtimestamp((run_dir / "results.jsonl").stat().st_mtime).isoformat()
    ref: dict[str, Any] = {
        "system": "DGL 2.1",
        "date": date,
        "machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.machine()}",
        "set_up": "2 servers + 2 trainers on 127.0.0.1, METIS 2-way (../shared/peers/dgl/run_all.sh)",
        "run_dir": str(run_dir),
    }
    gen = _pick(lines, "gen", "time_v")
    stats = [d for d in lines if d.get("_tag") == "gen" and "num_nodes" in d and "bench" not in d]
    if stats:
        ref["graph"] = {
            k: stats[0][k] for k in ("num_nodes", "num_edges_directed", "feat_dim") if k in stats[0]
        }
    if gen:
        ref["generate_s"] = gen[0]["wall_s"]
    parts = {}
    for tag in ("part_metis2", "part_random2"):
        t = _pick(lines, tag, "time_v")
        if t:
            parts[tag.removeprefix("part_")] = {
                "wall_s": t[0]["wall_s"],
                "peak_rss_gib": t[0]["max_rss_MiB"] / 1024,
            }
    if parts:
        ref["partition"] = parts
    startup = _pick(lines, "dist_metis", "startup", mode="distributed")
    if startup:
        ref["startup_s"] = max(d["ready_since_launch_s"] for d in startup)
    for key, tag, bench, mode in (
        ("pull_mixed", "dist_metis", "feature_pull", "distributed"),
        ("push_mixed", "dist_metis", "feature_push", "distributed"),
        ("pull_standalone", "standalone", "feature_pull", "standalone"),
    ):
        rows = _rows(lines, tag, bench, mode)
        if rows:
            ref[key] = rows
    sampling: dict[str, Any] = {}
    for key, tag, mode in (
        ("distributed", "dist_metis", "distributed"),
        ("standalone", "standalone", "standalone"),
    ):
        s = _pick(lines, tag, "sample_neighbors", mode=mode)
        if s:
            sampling[key] = {"requests_per_s": s[0]["requests_per_s"], "edges_per_s": s[0]["edges_per_s"]}
    if sampling:
        ref["sample_neighbors"] = sampling
    e2e = _pick(lines, "e2e_metis", "e2e_graphsage")
    if e2e:
        ref["training"] = _epoch(e2e[0])
    sim = _pick(lines, "e2e_sim", "e2e_graphsage")
    if sim:
        ref["training_sim"] = _epoch(sim[0])
    return ref


def main(argv: list[str] | None = None) -> None:
    """Write the reference JSON and print it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a results/<size>-<time> folder of the DGL harness")
    ap.add_argument("--out", type=Path, default=RESULTS / "dgl_reference.json")
    args = ap.parse_args(argv)
    ref = reference(args.run_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(ref, indent=2) + "\n")
    json.dump(ref, sys.stdout, indent=2)
    print(f"\n-> {args.out}")


if __name__ == "__main__":
    main()
