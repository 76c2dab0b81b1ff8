"""One command for the data path that feeds an accelerator (issue 31), on any machine.

``python -m benchmarks.gpu_suite [--scale 20] [--batches 100] [--quick]`` generates (seeded) and
partitions its graph (METIS 2-way, train nodes and in-edges balanced; ``train_bench``'s set-up:
fanouts 10,25, batch 1000, hidden 256), starts 2 servers per case and measures:

* **loader alone** (no model; this process is the trainer, both partitions co-located): batches/s
  with 0 (the client's loop thread), 1, 2 (and 4 where there are cores) worker processes and 1, 2
  worker threads, every case over the same 2 servers in ``--rounds`` (3) interleaved rounds (the median, each
  round's figure, and the CPU a batch took in this process and in each worker); the ceiling
  beside each is ``workers x`` the one-worker rate. Host bytes written per batch over
  its feature bytes: workers (rows gathered into the shared slot), the loop thread alone, and
  the loop thread staging for a device (``device="cpu"`` runs the same pack-and-copy path as a
  GPU: the 2.0x this issue started from). Beside it, what two processes at once give over one
  on this machine (``machine_ceiling.py``: a Python loop, a random-row gather): the ceiling of
  "2 workers over 1" where two vCPUs are not two independent cores.
* **a 10 ms step that holds the GIL** (a Python spin, as a GPU training loop's kernel launches
  do), and the same step as a sleep: epoch of one trainer with 0 / 1 / 2 workers against
  ``max(step, data path / workers)``, the data path being the loader-alone time of one batch
  on one worker.
* **prefetch depth** (overlap never loses): the GIL-holding step with one worker at prefetch
  0 / 2 / 4, interleaved in each round; the median epoch of each and its ratio to prefetch 0.
* **CPU trainers** 1 / 2 / 4 / 8 (those the cores allow), one torch thread each: batches/s.
* **on CUDA** (skipped, and said so, without it): the CUDA tests (``-m cuda`` of
  ``tests/test_device.py``, ``test_sage_device.py``, ``test_loader_workers_cuda.py``), the
  GPU epoch with prefetch 0 / 2 / 4 and ``--sync-copy`` on the loop thread and with 2 workers, the
  GPU's busy time from CUDA events (its utilisation = busy / epoch) and the host bytes per batch.

Writes ``benchmarks/results/gpu_suite.json`` and ``gpu_suite.png``. Needs only the project's
dependencies (a GPU image lacking some of them: docs/benchmarks/index.md, "Measuring on a GPU host").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncgraph.client import Client
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import DistGraph
from asyncgraph.testing import start_servers
from benchmarks.common import (
    RESULTS,
    ROOT,
    add_graph_options,
    graph_npz,
    partitioned,
    subprocess_env,
    wait_for_sampler,
)
from benchmarks.machine_ceiling import two_process_scaling
from benchmarks.train_bench import breakdown, run_training

TARGETS = {
    "two_workers_over_one": 1.7,
    "gil_step_epoch_over_limit": 1.1,
    "host_copy_over_feature_bytes": 1.0,
    "gpu_epoch_over_compute": 1.1,
    "eight_cpu_trainers_over_one": 7.0,
}
FANOUTS = [10, 25]  # train_dist's "--fanouts 10,25": the input layer samples 10


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed_epoch(
    g: DistGraph, nids: np.ndarray, workers: int, mode: str, device: str | None
) -> dict[str, Any]:
    """One loader: a warm-up epoch (workers started, kernels loaded, slots made), then one timed
    epoch with the CPU seconds of this process and of each worker over it."""
    loader = DistNodeDataLoader(
        g, nids, NeighborSampler(FANOUTS), 1000, prefetch=max(2, workers), seed=0,
        num_workers=workers, device=device, worker_mode=mode,
    )  # fmt: skip
    try:
        for _ in loader:
            pass
        pids = loader._pool.pids if loader._pool is not None and mode == "process" else []
        before = [_cpu_seconds(p) for p in [os.getpid(), *pids]]
        t0 = time.perf_counter()
        n = sum(1 for _ in loader)
        wall = time.perf_counter() - t0
        after = [_cpu_seconds(p) for p in [os.getpid(), *pids]]
        s = loader.stats
    finally:
        loader.close()
    cpu = [round(1000 * (b - a) / n, 2) for a, b in zip(before, after, strict=True)]
    return {
        "wall": wall, "batches": n, "loader_cpu_ms": cpu[0], "worker_cpu_ms": cpu[1:],
        "feature_bytes": s.feature_bytes, "host_copy_bytes": s.host_copy_bytes,
        "structure_bytes": s.structure_bytes, "batches_done": s.batches,
    }  # fmt: skip


LOADER_CASES = {  # name: (workers, mode, device)
    "workers0": (0, "process", None),
    "workers1": (1, "process", None),
    "workers2": (2, "process", None),
    "threads1": (1, "thread", None),
    "threads2": (2, "thread", None),
    "workers0_staged_for_device": (0, "process", "cpu"),
}


def loader_cases(
    part_config: Path, batches: int, cores: int, rounds: int = 3, only: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Every loader-alone case (or those named in ``only``) over one pair of servers, ``rounds``
    times interleaved (the VM's speed drifts within minutes): the median epoch of each, with
    its CPU per batch."""
    cases = {k: v for k, v in LOADER_CASES.items() if not only or k in only}
    if cores >= 4 and not only:
        cases["workers4"] = (4, "process", None)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="gpu-suite-") as tmp:
        group = start_servers(part_config, Path(tmp), num_parts=2, num_clients=1)
        try:
            wait_for_sampler(group.addresses)
            client = Client.connect(group.addresses)
            try:
                g = DistGraph(client.graph_name, client=client)
                mask = g.ndata["train_mask"][np.arange(g.num_nodes())].numpy().astype(bool)
                nids = np.flatnonzero(mask)[: batches * 1000]
                for r in range(rounds):
                    for name, (workers, mode, device) in cases.items():
                        samples[name].append(_timed_epoch(g, nids, workers, mode, device))
                    rates = [f"{n} {samples[n][-1]['batches'] / samples[n][-1]['wall']:.1f}/s" for n in cases]
                    print(f"loader alone, round {r + 1}: " + ", ".join(rates), flush=True)
            finally:
                client.close()
        finally:
            group.stop()
    out: dict[str, Any] = {}
    for name, (workers, mode, device) in cases.items():
        runs = samples[name]
        rates = [x["batches"] / x["wall"] for x in runs]
        med = float(np.median(rates))
        last = runs[-1]
        out[name] = {
            "workers": workers, "mode": mode, "device": device, "batches": last["batches"],
            "batches_per_s": round(med, 2), "batches_per_s_runs": [round(x, 2) for x in rates],
            "ms_per_batch": round(1000 / med, 2),
            "loader_cpu_ms_per_batch": float(np.median([x["loader_cpu_ms"] for x in runs])),
            "worker_cpu_ms_per_batch": [x["worker_cpu_ms"] for x in runs],
            "feature_bytes_per_batch": last["feature_bytes"] // max(last["batches_done"], 1),
            "host_copy_bytes_per_batch": last["host_copy_bytes"] // max(last["batches_done"], 1),
            "host_copy_over_feature_bytes": round(last["host_copy_bytes"] / max(last["feature_bytes"], 1), 3),
            "structure_bytes_per_batch": last["structure_bytes"] // max(last["batches_done"], 1),
        }  # fmt: skip
    one = out["workers1"]["batches_per_s"] if "workers1" in out else 0.0
    for name, r in out.items() if one else ():
        if name.startswith("workers") and r["workers"] >= 2 and "staged" not in name:
            r["ceiling_batches_per_s"] = round(r["workers"] * one, 2)
            r["over_one_worker"] = round(r["batches_per_s"] / one, 3)
            r["over_one_worker_runs"] = [
                round(a / b, 3)
                for a, b in zip(r["batches_per_s_runs"], out["workers1"]["batches_per_s_runs"], strict=True)
            ]
        elif name.startswith("threads"):
            r["over_one_process_worker"] = round(r["batches_per_s"] / one, 3)
    for name, r in out.items():
        print(f"loader alone, {name}: median {r['batches_per_s']:.1f} batches/s {r['batches_per_s_runs']}, "
              f"host bytes {r['host_copy_over_feature_bytes']}x feature bytes", flush=True)  # fmt: skip
    return out


def step_cases(part_config: Path, batches: int, data_ms: float, epochs: int, cores: int) -> dict[str, Any]:
    """One trainer, 10 ms step (GIL-holding spin, then sleep), 0/1/2 workers (processes, and for
    the spin threads too), vs its limit; ``limit_cores_s`` also counts the cores left to the
    workers beside a spinning training loop."""
    out: dict[str, Any] = {}
    cases = [(True, w, "process") for w in (0, 1, 2)] + [(True, w, "thread") for w in (1, 2)]
    cases += [(False, w, "process") for w in (0, 1, 2)]
    for holds_gil, w, mode in cases:
        extra = ["--sim-ms", "10", "--num-workers", str(w), "--worker-mode", mode]
        extra += ["--sim-holds-gil"] if holds_gil else []
        summaries = run_training(
            part_config, trainers=1, prefetch=2, threads=1, epochs=epochs, max_batches=batches,
            timeout=900, extra=tuple(extra),
        )  # fmt: skip
        r = breakdown(summaries)
        n = r["batches_per_trainer"]
        limit = n * max(10.0, data_ms / max(w, 1)) / 1000
        free_cores = max(1, cores - 1) if holds_gil else cores
        limit_cores = n * max(10.0, data_ms / max(min(w, free_cores), 1)) / 1000
        name = f"{'spin' if holds_gil else 'sleep'}10_{'threads' if mode == 'thread' else 'workers'}{w}"
        out[name] = {
            "workers": w,
            "mode": mode,
            "limit_cores_s": round(limit_cores, 3),
            "epoch_over_limit_cores": round(r["epoch_s"] / limit_cores, 3),
            "step": "spin (holds the GIL)" if holds_gil else "sleep",
            "batches": n,
            "epoch_s": r["epoch_s"],
            "limit_s": round(limit, 3),
            "epoch_over_limit": round(r["epoch_s"] / limit, 3),
            "per_batch_ms": r["per_batch_ms"],
        }
        print(f"{name:20s} epoch {r['epoch_s']:.3f} s, limit {limit:.3f} s -> "
              f"{out[name]['epoch_over_limit']}x", flush=True)  # fmt: skip
    out.update(interleaved_step_rounds(part_config, batches, epochs, cores))
    return out


def prefetch_rounds(part_config: Path, batches: int, epochs: int, rounds: int = 3) -> dict[str, Any]:
    """Overlap never loses: the GIL-holding step with 1 worker at prefetch 0 / 2 / 4, the depths
    interleaved in each of ``rounds`` rounds (the VM drifts by more than the differences sought);
    each depth's median epoch, and over prefetch 0's (per round and the median of those)."""
    depths = (0, 2, 4)
    epochs_s: dict[int, list[float]] = {d: [] for d in depths}
    per_batch: dict[int, Any] = {}
    for r in range(rounds):
        for prefetch in depths:
            extra = ("--sim-ms", "10", "--sim-holds-gil", "--num-workers", "1")
            summaries = run_training(
                part_config, trainers=1, prefetch=prefetch, threads=1, epochs=epochs, max_batches=batches,
                timeout=900, extra=extra,
            )  # fmt: skip
            b = breakdown(summaries)
            epochs_s[prefetch].append(b["epoch_s"])
            per_batch[prefetch] = b["per_batch_ms"]
        print(f"spin10 1 worker, round {r + 1}, prefetch 0 / 2 / 4: "
              + " / ".join(f"{epochs_s[d][-1]:.3f}" for d in depths) + " s", flush=True)  # fmt: skip
    out: dict[str, Any] = {}
    for d in depths:
        ratios = [round(a / b, 3) for a, b in zip(epochs_s[d], epochs_s[0], strict=True)]
        out[f"spin10_workers1_prefetch{d}"] = {
            "workers": 1, "prefetch": d, "rounds": rounds, "epoch_s_runs": epochs_s[d],
            "epoch_s": float(np.median(epochs_s[d])), "over_prefetch0_runs": ratios,
            "over_prefetch0": float(np.median(ratios)), "per_batch_ms": per_batch[d],
        }  # fmt: skip
        median = out[f"spin10_workers1_prefetch{d}"]["epoch_s"]
        print(f"spin10 1 worker, prefetch {d}: median epoch {median:.3f} s, "
              f"over prefetch 0 {ratios} -> {float(np.median(ratios))}", flush=True)  # fmt: skip
    return out


def interleaved_step_rounds(
    part_config: Path, batches: int, epochs: int, cores: int, rounds: int = 3
) -> dict[str, Any]:
    """The GIL-holding step with 1 and 2 worker processes, each run right after the loader
    alone measures the data path it is held to, ``rounds`` times: the ratio of each round (its
    limit measured minutes, not a quarter of an hour, apart on a VM whose speed drifts) and
    their median."""
    out: dict[str, Any] = {}
    for w in (1, 2):
        ratios, ratios_cores, epochs_s, data = [], [], [], []
        for _ in range(rounds):
            data_ms = loader_cases(part_config, batches, cores, rounds=1, only=("workers1",))["workers1"][
                "ms_per_batch"
            ]
            extra = ("--sim-ms", "10", "--sim-holds-gil", "--num-workers", str(w))
            summaries = run_training(
                part_config, trainers=1, prefetch=2, threads=1, epochs=epochs, max_batches=batches,
                timeout=900, extra=extra,
            )  # fmt: skip
            r = breakdown(summaries)
            n = r["batches_per_trainer"]
            limit = n * max(10.0, data_ms / w) / 1000
            limit_cores = n * max(10.0, data_ms / max(min(w, max(1, cores - 1)), 1)) / 1000
            data.append(data_ms)
            epochs_s.append(r["epoch_s"])
            ratios.append(round(r["epoch_s"] / limit, 3))
            ratios_cores.append(round(r["epoch_s"] / limit_cores, 3))
            print(f"spin10 {w} worker(s), interleaved: data {data_ms:.2f} ms, epoch {r['epoch_s']:.3f} s "
                  f"-> {ratios[-1]}x ({ratios_cores[-1]}x of the cores' limit)", flush=True)  # fmt: skip
        out[f"spin10_workers{w}_interleaved"] = {
            "workers": w, "rounds": rounds, "data_path_ms": data, "epoch_s": epochs_s,
            "epoch_over_limit_runs": ratios, "epoch_over_limit": float(np.median(ratios)),
            "epoch_over_limit_cores_runs": ratios_cores,
            "epoch_over_limit_cores": float(np.median(ratios_cores)),
        }  # fmt: skip
    return out


def cpu_trainer_cases(part_config: Path, counts: list[int], batches: int, epochs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in counts:
        summaries = run_training(
            part_config, trainers=n, prefetch=2, threads=1, epochs=epochs, max_batches=batches, timeout=900
        )
        r = breakdown(summaries)
        rate = n * r["batches_per_trainer"] / r["epoch_s"]
        out[f"trainers{n}"] = {"trainers": n, "epoch_s": r["epoch_s"], "batches_per_s": round(rate, 2),
                               "per_batch_ms": r["per_batch_ms"]}  # fmt: skip
        print(f"{n} CPU trainers: {rate:.1f} batches/s", flush=True)
    one = out[f"trainers{counts[0]}"]["batches_per_s"] if counts and counts[0] == 1 else None
    if one:
        for v in out.values():
            v["over_one"] = round(v["batches_per_s"] / one, 3)
    return out


def gpu_cases(part_config: Path, batches: int, epochs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tests = ["tests/test_device.py", "tests/test_sage_device.py", "tests/test_loader_workers_cuda.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda or not cuda", *tests],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out["cuda_tests"] = {"exit": proc.returncode, "tail": proc.stdout[-1500:]}
    print(f"CUDA tests: exit {proc.returncode}\n{proc.stdout[-400:]}", flush=True)
    cases = (
        [(p, False, 0) for p in (0, 2, 4)]
        + [(2, True, 0)]
        + [(p, False, 2) for p in (0, 2, 4)]
        + [(2, True, 2)]
    )
    for prefetch, sync, workers in cases:
        summaries = run_training(
            part_config, trainers=1, prefetch=prefetch, threads=4, epochs=epochs, max_batches=batches,
            timeout=900, device="cuda", sync_copy=sync, extra=("--num-workers", str(workers)),
        )  # fmt: skip
        r = breakdown(summaries)
        last = summaries[0]["epoch_stats"][-1]
        busy = float(last.get("gpu_compute", 0.0))
        name = f"prefetch{prefetch}{'_sync' if sync else ''}_workers{workers}"
        out[name] = {
            "prefetch": prefetch, "sync_copy": sync, "workers": workers, "epoch_s": r["epoch_s"],
            "gpu_busy_s": round(busy, 4), "gpu_utilisation": round(busy / max(r["epoch_s"], 1e-9), 3),
            "epoch_over_gpu_compute": round(r["epoch_s"] / max(busy, 1e-9), 3),
            "per_batch_ms": r["per_batch_ms"],
            "host_copy_over_feature_bytes": round(
                last.get("host_copy_bytes", 0) / max(last.get("feature_bytes", 1), 1), 3
            ),
        }  # fmt: skip
        print(f"GPU {name:28s} epoch {r['epoch_s']:.3f} s, GPU busy {busy:.3f} s "
              f"({100 * out[name]['gpu_utilisation']:.0f}%)", flush=True)  # fmt: skip
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if results.get("gpu") else 2, figsize=(15, 4.5))
    loader = {k: v for k, v in results["loader_alone"].items() if "staged" not in k}
    ax = axes[0]
    names = list(loader)
    ax.bar(names, [loader[n]["batches_per_s"] for n in names], color="#4477aa", label="measured")
    ax.scatter(names, [loader[n].get("ceiling_batches_per_s", np.nan) for n in names], color="k", marker="_",
               s=600, label="ceiling: workers x one worker")  # fmt: skip
    ax.set_ylabel("batches/s")
    ax.set_title("loader alone (no model)")
    ax.legend()
    ax = axes[1]
    steps = {k: v for k, v in results["gil_step"].items() if "limit_s" in v}
    names = list(steps)
    ax.bar(names, [steps[n]["epoch_s"] for n in names], color="#ee6677", label="epoch")
    ax.scatter(names, [steps[n]["limit_s"] for n in names], color="k", marker="_", s=600, label="limit")
    ax.set_ylabel("s")
    ax.set_title("1 trainer, 10 ms step")
    ax.tick_params(axis="x", rotation=60)
    ax.legend()
    if results.get("gpu"):
        ax = axes[2]
        gpu = {k: v for k, v in results["gpu"].items() if k.startswith("prefetch")}
        names = list(gpu)
        ax.bar(names, [gpu[n]["epoch_s"] for n in names], color="#228833", label="epoch")
        ax.scatter(
            names, [gpu[n]["gpu_busy_s"] for n in names], color="k", marker="_", s=600, label="GPU busy"
        )
        ax.set_title("GPU epoch")
        ax.tick_params(axis="x", rotation=60)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_graph_options(p, 20)
    p.add_argument("--batches", type=int, default=100, help="batches per epoch in every case")
    p.add_argument("--epochs", type=int, default=2, help="epochs per training run; the last is reported")
    p.add_argument("--quick", action="store_true", help="a smoke run: 10 batches, 1 epoch")
    p.add_argument("--skip", default="", help="comma list of parts to skip: loader,step,prefetch,cpu,gpu")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (loader, prefetch)")
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_suite.json")
    p.add_argument("--png", type=Path, default=RESULTS / "gpu_suite.png")
    args = p.parse_args()
    if args.quick:
        args.batches, args.epochs = 10, 1
    skip = set(filter(None, args.skip.split(",")))
    cores = len(os.sched_getaffinity(0))
    npz = graph_npz(args)
    part_config = partitioned(npz, 2, balance=True)
    cuda = torch.cuda.is_available()
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {cores} cores, torch {torch.__version__}",
        "gpu": None,
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
        "setup": {
            "graph": str(npz),
            "partition": str(part_config),
            "servers": 2,
            "fanouts": FANOUTS,
            "batch_size": 1000,
            "hidden": 256,
            "batches": args.batches,
            "epochs": args.epochs,
        },
        "targets": TARGETS,
        "skipped": [],
    }
    if "loader" not in skip:
        # the ceiling of "2 workers over 1" on this machine: two processes at once over one
        machine = results["machine_two_process_scaling"] = two_process_scaling()
        shown = ", ".join(f"{k} {v['two_over_one']}x {v['two_over_one_runs']}" for k, v in machine.items())
        print(f"two processes over one on this machine: {shown}", flush=True)
        results["loader_alone"] = loader_cases(part_config, args.batches, cores, rounds=args.rounds)
    data_ms = results.get("loader_alone", {}).get("workers1", {}).get("ms_per_batch", 0.0)
    if "step" not in skip:
        results["gil_step"] = step_cases(part_config, args.batches, data_ms, args.epochs, cores)
    if "prefetch" not in skip:
        results["prefetch"] = prefetch_rounds(part_config, args.batches, args.epochs, rounds=args.rounds)
    if "cpu" not in skip:
        counts = [n for n in (1, 2, 4, 8) if n <= cores]
        results["cpu_trainers"] = cpu_trainer_cases(part_config, counts, args.batches, args.epochs)
        if cores < 8:
            results["skipped"].append(f"CPU trainers above {cores} (this machine has {cores} cores)")
    if cuda and "gpu" not in skip:
        results["gpu"] = gpu_cases(part_config, args.batches, args.epochs)
    elif not cuda:
        results["skipped"].append("every CUDA case (no CUDA device): CUDA tests, GPU epochs, GPU utilisation")
    for line in results["skipped"]:
        print(f"skipped: {line}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    if "loader_alone" in results and "gil_step" in results:
        plot(results, args.png)
    print(f"wrote {args.out}" + (f" and {args.png}" if args.png.is_file() else ""), flush=True)


if __name__ == "__main__":
    main()
