"""Hostile input to the partitioner and the stager (issue 32, C and D): each case must end in exit
status 2, one ``error:`` line naming the file, nothing written and nothing leaked.

A small chunked graph (csv edges, numpy features) is written to a temporary folder; each case
edits a copy of it, or of a partitioning of it, and runs the real CLI
(``python -m asyncgraph.partition`` or ``python -m asyncgraph.launch.stage``). A case passes when
the exit status is 2, stderr's last line is its only error line and matches the expected
pattern, no secret planted beside the input shows up in stderr or anywhere under the run's
folder, and the folder holds nothing new but what the case planted. Prints and writes
(``benchmarks/results/faults-inputs.json``) each case's outcome and seconds; exits 1 if any
case did not pass.

    python -m benchmarks.faults_inputs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.graph import Graph
from asyncgraph.testing import subprocess_env
from benchmarks.common import RESULTS

SECRET = "root:$6$SECRETHASH:19000:0:99999:7:::"
Edit = Callable[[Path], list[str]]  # edits the case folder; returns extra CLI arguments


def _graph() -> Graph:
    rng = np.random.default_rng(0)
    n, e = 200, 1000
    return Graph(n, rng.integers(0, n, e), rng.integers(0, n, e),
                 {"feat": rng.standard_normal((n, 4)).astype(np.float32)},
                 {"w": rng.random(e).astype(np.float32)})  # fmt: skip


def _meta(d: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    path = d / "in" / "metadata.json"
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _rename_feat(name: str) -> Edit:
    def edit(d: Path) -> list[str]:
        _meta(d, lambda m: m["node_data"]["_N"].__setitem__(name, m["node_data"]["_N"].pop("feat")))
        return []

    return edit


def _shadow_csv(d: Path) -> list[str]:
    (d / "shadow").write_text(SECRET + "\n")
    _meta(d, lambda m: m["edges"]["_N:_E:_N"]["data"].__setitem__(0, str(d / "shadow")))
    return []


def _long_line(d: Path) -> list[str]:
    chunk = d / "in" / "edges" / "_N-_E-_N-1.csv"
    with open(chunk, "ab") as f:
        for _ in range(64):
            f.write(b"1" * (1 << 20))
    return ["--memory-limit", "256MiB"]


def _big_row(d: Path) -> list[str]:
    with open(d / "in" / "node_data" / "big.npy", "wb") as f:
        header = {"descr": "<f4", "fortran_order": False, "shape": (200, 1 << 24)}
        np.lib.format.write_array_header_1_0(f, header)
        f.truncate(f.tell() + 200 * (64 << 20))  # sparse: 64 MiB rows, no disk
    _meta(d, lambda m: m["node_data"]["_N"].__setitem__(
        "big", {"format": {"name": "numpy"}, "data": ["node_data/big.npy"]}))  # fmt: skip
    return ["--memory-limit", "256MiB"]


def _dup_ntype(d: Path) -> list[str]:
    def dup(m: dict[str, Any]) -> None:
        m["node_type"] *= 2
        m["num_nodes_per_chunk"] *= 2

    _meta(d, dup)
    return []


def _work_link(d: Path) -> list[str]:
    (d / "victim").mkdir()
    (d / ".o.work").symlink_to(d / "victim")
    return []


def _resume_tampered(d: Path) -> list[str]:
    argv = _argv(d, [])
    env = {**subprocess_env(), "ASYNCGRAPH_PARTITION_KILL_AFTER": "shuffle"}
    subprocess.run(argv, capture_output=True, env=env, timeout=300, check=False)
    doc = json.loads((d / ".o.work" / "state.json").read_text())
    doc["state"]["node_bounds"] = [0, 1 << 40, 1 << 41]  # was: a 32 GiB allocation
    (d / ".o.work" / "state.json").write_text(json.dumps(doc))
    return ["--resume"]


PARTITIONER: dict[str, tuple[Edit, str]] = {
    "tensor name ../indices": (_rename_feat("../indices"), r"not a safe file name"),
    "tensor name escaping --out": (_rename_feat("../../../../escape/x"), r"not a safe file name"),
    "reserved tensor name": (_rename_feat("indptr"), r"reserved"),
    "duplicate node_type": (_dup_ntype, r"listed twice"),
    "csv chunk of /etc/shadow": (_shadow_csv, r"shadow: line 1: expected two IDs"),
    "64 MiB csv line": (_long_line, r"line 501 is longer than 4096 bytes"),
    "64 MiB feature row at 256 MiB": (_big_row, r"one row is 64\.00 MiB"),
    "link at .<out>.work": (_work_link, r"\.o\.work exists and is not a folder"),
    "tampered state.json on --resume": (_resume_tampered, r"state\.json does not match its checksum"),
}


def _argv(d: Path, extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "asyncgraph.partition", "--input", str(d / "in" / "metadata.json"),
            "--num-parts", "2", "--method", "random", "--out", str(d / "o"), "--workers", "1",
            "--memory-limit", "1GiB"]  # fmt: skip
    return argv + extra


def _stage_case(d: Path, part: Path, kind: str) -> list[str]:
    src = d / "a" / "b" / "src"
    shutil.copytree(part, src)
    (d / "id_ed25519").write_text(SECRET)
    if kind == "mapping":
        doc = json.loads((src / "g.json").read_text())
        doc["orig_nids"] = "../../../id_ed25519"
        (src / "g.json").write_text(json.dumps(doc))
    elif kind == "link":
        (src / "part1" / "node_feat" / "id_ed25519").symlink_to(d / "id_ed25519")
    (d / "ips.txt").write_text(SECRET + "\n" if kind == "ipconfig" else "127.0.0.1 30050\n127.0.0.1 30051\n")
    return [sys.executable, "-m", "asyncgraph.launch.stage", "--part-config", str(src / "g.json"),
            "--ip-config", str(d / "ips.txt"), "--dest", str(d / "d" / "x" / "y" / "z")]  # fmt: skip


STAGER = {
    "stage orig_nids ../../..": ("mapping", r"the ID mapping file '(\.\./)+id_ed25519' is not a plain"),
    "stage link to an ssh key": ("link", r"id_ed25519 is a symbolic link"),
    "stage --ip-config of /etc/shadow": ("ipconfig", r"ips\.txt line 1: the host \(field 1\) is neither"),
}


def _files(d: Path) -> set[Path]:
    return {p for p in d.rglob("*") if p.is_file() and not p.is_symlink()}


def _check(d: Path, res: subprocess.CompletedProcess[str], pattern: str,
           planted: tuple[set[str], set[Path]]) -> str | None:  # fmt: skip
    """None when the case held, else what went wrong."""
    lines = [x for x in res.stderr.strip().splitlines() if x.strip()]
    errors = [x for x in lines if "error" in x or x.startswith("stage: ")]
    if res.returncode != 2:
        return f"exit {res.returncode}"
    if len(errors) != 1 or errors[0] != lines[-1] or not re.search(pattern, errors[0]):
        return f"error lines {errors[-2:]}"
    if "SECRETHASH" in res.stderr:
        return "the secret was echoed"
    new = {p.name for p in d.iterdir()} - planted[0]
    if new:
        return f"written: {sorted(new)}"
    small = [p for p in _files(d) - planted[1] if p.stat().st_size < (1 << 20)]
    leaked = [p for p in small if b"SECRETHASH" in p.read_bytes()]
    return f"leaked into {leaked}" if leaked else None


def _outcome(problem: str | None, t0: float) -> dict[str, Any]:
    return {"held": problem is None, "problem": problem, "seconds": round(time.perf_counter() - t0, 2)}


def run() -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="asyncgraph-faults-inputs-") as tmp:
        base = Path(tmp) / "base"
        write_chunked(_graph(), base, 2, "csv", "g")
        part = Path(tmp) / "part"
        argv = [sys.executable, "-m", "asyncgraph.partition", "--input", str(base / "metadata.json"),
                "--num-parts", "2", "--method", "random", "--out", str(part), "--workers", "1"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"partitioning the base graph failed: {done.stderr[-500:]}")
        for name, (edit, pattern) in PARTITIONER.items():
            d = Path(tmp) / f"case{len(results)}"
            shutil.copytree(base, d / "in")
            t0 = time.perf_counter()
            extra = edit(d)
            planted = ({p.name for p in d.iterdir()}, _files(d))
            res = subprocess.run(_argv(d, extra), capture_output=True, text=True, env=subprocess_env(),
                                 timeout=300, check=False)  # fmt: skip
            problem = _check(d, res, pattern, planted)
            results[name] = _outcome(problem, t0)
        for name, (kind, pattern) in STAGER.items():
            d = Path(tmp) / f"case{len(results)}"
            d.mkdir()
            t0 = time.perf_counter()
            argv = _stage_case(d, part, kind)
            planted = ({p.name for p in d.iterdir()}, _files(d))
            res = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), timeout=300,
                                 check=False)  # fmt: skip
            problem = _check(d, res, pattern, planted)
            results[name] = _outcome(problem, t0)
    return {"cases": results, "held": sum(r["held"] for r in results.values()), "total": len(results),
            "date": time.strftime("%Y-%m-%d")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS / "faults-inputs.json")
    args = ap.parse_args()
    os.environ.pop("ASYNCGRAPH_PARTITION_KILL_AFTER", None)
    result = run()
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result["held"] != result["total"]:
        raise SystemExit("some hostile inputs were not refused cleanly")


if __name__ == "__main__":
    main()
