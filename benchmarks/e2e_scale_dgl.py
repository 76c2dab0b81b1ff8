"""DGL 2.1 on ``benchmarks.e2e_scale``'s graph: in-memory partition, server start-up, trainer attach.

Run with DGL's venv (``../shared/peers/dgl/README.md``), after ``e2e_scale`` generated the graph
and kept it (``--keep``, or ``--stages gen --keep``)::

    PYTHONPATH=$PWD $DGLBENCH_ROOT/venv/bin/python -m benchmarks.e2e_scale_dgl --scale 22

Stages, each a fresh process tree measured as in ``e2e_scale`` (``benchmarks.e2e_memory``):

1. ``partition``: load the chunked graph (numpy chunks) into one in-memory ``dgl.graph`` with
   ``feat``/``label``/``train_mask`` and run ``dgl.distributed.partition_graph`` (random, 4 parts,
   1 hop), as DGL's users do when the graph fits;
2. ``startup``: DGL's servers and one trainer per partition on 4 emulated machines
   (``../shared/peers/dgl/launch_local.py``: a private /dev/shm each, loopback TCP); each trainer
   runs ``dgl.distributed.initialize`` + ``DistGraph``, pulls 1,000 random feature rows and exits.
   Per server: process start -> its "start graph service" line (DGL prints it once the
   partition is loaded into shared memory, right before serving; watched in its log every
   0.1 s); per trainer: launch -> ``DistGraph`` ready.

Writes ``benchmarks/results/e2e_scale_dgl_<N>.json`` (and its plot when matplotlib is there; else
``python -m benchmarks.e2e_plot benchmarks/results/e2e_scale_dgl_<N>.json`` with our venv).
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
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER = Path(os.environ.get("DGL_PEER_DIR", ROOT.parent / "shared" / "peers" / "dgl"))
SERVICE = re.compile(r"start graph service on server (\d+) for part (\d+)")


def partition_worker(meta_path: Path, out: Path, parts: int) -> None:
    """Load the chunked graph into memory and partition it with DGL (prints ``RESULT {json}``)."""
    import dgl
    import numpy as np
    import torch

    t0 = time.time()
    meta = json.loads(meta_path.read_text())
    base = meta_path.parent
    edges = np.concatenate([np.load(base / f) for f in meta["edges"]["_N:_E:_N"]["data"]])
    n = sum(meta["num_nodes_per_chunk"][0])
    src, dst = (torch.from_numpy(np.ascontiguousarray(edges[:, i])) for i in (0, 1))
    g = dgl.graph((src, dst), num_nodes=n)
    del src, dst
    del edges
    for key, spec in meta["node_data"]["_N"].items():
        g.ndata[key] = torch.from_numpy(np.concatenate([np.load(base / f) for f in spec["data"]]))
    load_s = time.time() - t0
    t1 = time.time()
    dgl.distributed.partition_graph(g, meta["graph_name"], parts, str(out), part_method="random", num_hops=1)
    row = {
        "load_s": round(load_s, 2),
        "partition_s": round(time.time() - t1, 2),
        "nodes": n,
        "edges": int(g.num_edges()),
    }
    print("RESULT " + json.dumps(row), flush=True)


def trainer(part_config: str, graph_name: str) -> None:
    """One DGL trainer: attach, pull 1,000 random rows, report (``RESULT {json}``), exit."""
    t_start = time.time()
    import dgl
    import torch

    sys.path.insert(0, str(PEER))
    from dglbench_common import patch_machine_id

    patch_machine_id()
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    torch.distributed.init_process_group(backend="gloo")
    g = dgl.distributed.DistGraph(graph_name, part_config=part_config)
    ready = time.time()
    launch_t0 = float(os.environ.get("DGLBENCH_LAUNCH_T0", t_start))
    ids = torch.randint(0, g.num_nodes(), (1000,))
    t0 = time.time()
    rows = g.ndata["feat"][ids]
    pull_s = time.time() - t0
    rank = torch.distributed.get_rank()
    row = {
        "rank": rank,
        "ready_since_launch_s": round(ready - launch_t0, 3),
        "process_to_ready_s": round(ready - t_start, 3),
        "pull_1000_s": round(pull_s, 4),
        "rows": list(rows.shape),
    }
    print("RESULT " + json.dumps(row), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


class LogWatch:
    """Polls DGL's server logs (``server_<id>.log``) and server processes every 0.1 s: when each
    server's process started and when its "start graph service" line first appeared."""

    def __init__(self, logdir: Path, root_pid: int) -> None:
        self.logdir, self.root = logdir, root_pid
        self.ready: dict[int, float] = {}
        self.started: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        from benchmarks.e2e_memory import process_start

        while not self._stop.wait(0.1):
            for p in self.logdir.glob("server_*.log"):
                sid = int(p.stem.split("_")[1])
                if sid not in self.ready and SERVICE.search(p.read_text(errors="replace")):
                    self.ready[sid] = time.time()
            try:
                kids = psutil.Process(self.root).children(recursive=True)
            except psutil.Error:
                continue
            for k in kids:
                try:
                    if any("dgl_server.py" in a for a in k.cmdline()):
                        sid = int(k.environ().get("DGL_SERVER_ID", "-1"))
                        if sid not in self.started:
                            self.started[sid] = process_start(k.pid) or k.create_time()
                except (psutil.Error, ValueError):
                    continue

    def __enter__(self) -> LogWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.e2e_scale_dgl", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--scale", type=int, default=22)
    ap.add_argument("--workdir", type=Path, help="e2e_scale's (default benchmarks/data/e2e_scale<N>)")
    ap.add_argument("--keep", action="store_true", help="keep DGL's partitions (in --workdir/dgl_parts)")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per stage")
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--partition-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trainer", nargs=2, metavar=("PART_CONFIG", "GRAPH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    work: Path = args.workdir or HERE / "data" / f"e2e_scale{args.scale}"
    meta = work / "chunked" / "metadata.json"
    parts = work / "dgl_parts"
    if args.trainer:
        trainer(*args.trainer)
        return 0
    if args.partition_worker:
        partition_worker(meta, parts, args.parts)
        return 0
    if not meta.is_file():
        raise SystemExit(
            f"no graph at {meta}: run python -m benchmarks.e2e_scale --scale {args.scale} "
            "--stages gen --keep first (our venv)"
        )
    from benchmarks.e2e_memory import meminfo, run_stage

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    name = json.loads(meta.read_text())["graph_name"]
    stages: dict[str, Any] = {}
    series: dict[str, Any] = {}
    shutil.rmtree(parts, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.e2e_scale_dgl",
        "--scale",
        str(args.scale),
        "--workdir",
        str(work),
        "--parts",
        str(args.parts),
        "--partition-worker",
    ]
    print(f"== partition (DGL, in memory): {' '.join(cmd)}", flush=True)
    run = run_stage(
        cmd, timeout=args.timeout, log=work / "dgl_partition.log", env=env, cwd=ROOT, interval=args.interval
    )
    res = [json.loads(x.split("RESULT ", 1)[1]) for _, x in run.lines if "RESULT {" in x]
    stages["partition"] = {
        "rc": run.rc,
        "wall_s": round(run.wall_s, 3),
        **run.memory,
        "result": res[-1] if res else None,
    }
    series["partition"] = run.series
    print(f"   {stages['partition']}", flush=True)
    if run.rc == 0:
        config = parts / f"{name}.json"
        logdir = work / "dgl_logs"
        shutil.rmtree(logdir, ignore_errors=True)
        cmd = [
            sys.executable,
            str(PEER / "launch_local.py"),
            "--machines",
            str(args.parts),
            "--part-config",
            str(config),
            "--trainers",
            "1",
            "--timeout",
            str(args.timeout),
            "--logdir",
            str(logdir),
            "--",
            str(Path(__file__).resolve()),
            "--trainer",
            str(config),
            name,
        ]
        print(f"== startup (DGL servers + trainers): {' '.join(cmd)}", flush=True)
        logdir.mkdir(parents=True)
        t_launch = time.time()
        watch = LogWatch(logdir, os.getpid())
        with watch:
            run = run_stage(
                cmd,
                timeout=args.timeout + 60,
                log=work / "dgl_startup.log",
                env=env,
                cwd=ROOT,
                interval=args.interval,
            )
        per = [json.loads(x.split("RESULT ", 1)[1]) for _, x in run.lines if "RESULT {" in x]
        imports = {  # dgl_server.py's own line: how much of the start-up is "import dgl"
            int(p.stem.split("_")[1]): float(m[1])
            for p in logdir.glob("server_*.log")
            if (m := re.search(r"import dgl ([0-9.]+)s", p.read_text(errors="replace")))
        }
        servers = [
            {
                "server": sid,
                "ready_since_launch_s": round(t - t_launch, 3),
                **({"start_to_ready_s": round(t - watch.started[sid], 3)} if sid in watch.started else {}),
                **({"import_dgl_s": imports[sid]} if sid in imports else {}),
            }
            for sid, t in sorted(watch.ready.items())
        ]
        stages["startup"] = {
            "rc": run.rc,
            "wall_s": round(run.wall_s, 3),
            **run.memory,
            "servers": servers,
            "trainers": per,
        }
        series["startup"] = run.series
        print(f"   servers {servers}\n   trainers {per}\n   memory {run.memory}", flush=True)
    out: Path = args.out or HERE / "results" / f"e2e_scale_dgl_{args.scale}.json"
    m = json.loads(meta.read_text())
    doc = {
        "benchmark": "e2e_scale_dgl (DGL 2.1)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "cores": os.cpu_count(),
            "mem_total_bytes": meminfo()["MemTotal"],
        },
        "graph": {
            "scale": args.scale,
            "nodes": 1 << args.scale,
            "feat_dim": 128,
            "edges": sum(sum(c) for c in m["num_edges_per_chunk"]),
            "input_bytes": sum(p.stat().st_size for p in meta.parent.rglob("*") if p.is_file()),
        },
        "partition_bytes": sum(p.stat().st_size for p in parts.rglob("*") if p.is_file()),
        "stages": stages,
        "series_columns": ["t_s", "tree_pss", "tree_rss", "machine_used", "shmem"],
        "series": {k: v[:: max(1, len(v) // 2000)] for k, v in series.items()},
    }
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}", flush=True)
    try:
        from benchmarks.e2e_plot import plot

        plot(doc, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.png')}", flush=True)
    except ImportError:
        print(f"no matplotlib here: plot with our venv: python -m benchmarks.e2e_plot {out}", flush=True)
    if not args.keep:
        shutil.rmtree(parts, ignore_errors=True)
    return 0 if all(s.get("rc") == 0 for s in stages.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
