"""Seeded standalone runs (one process, one partition) of DGL's RGCN script on ACM, on our stack
or on DGL 2.1's own (``DGL_DIST_MODE=standalone``), to tell the script's instability from ours.

``python benchmarks/rgcn/standalone_sweep.py {ours,dgl} SEEDS LABEL [extra script args]`` from the
repository root: partitions ACM (1 part) with that stack, runs seeds 0..SEEDS-1 through
``seeded.py`` and merges trainer 0's per-epoch test accuracies into
``benchmarks/results/rgcn_acm_stability.json`` under LABEL. DGL's venv: ``$DGL_PYTHON`` (default
``~/.cache/dglbench/venv/bin/python``). Not a timed benchmark: the figures are accuracies, shown
next to the majority-class accuracy (what a constant prediction gets)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from stability import MAJORITY, record  # noqa: E402

BASE = ["-d", "acm", "-e", "8", "--fanout", "4,4", "--batch-size", "32", "--eval-batch-size", "1000"]
BASE += ["--n-bases", "2", "--sparse-embedding", "--standalone"]


def main() -> None:
    stack, seeds, label, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    tmp = Path(tempfile.mkdtemp())
    (tmp / "ip_config.txt").write_text("127.0.0.1\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ASYNCGRAPH_SERVERS", None)
    env.pop("ASYNCGRAPH_IP_CONFIG", None)
    if stack == "dgl":
        py = os.environ.get("DGL_PYTHON", str(Path.home() / ".cache/dglbench/venv/bin/python"))
        subprocess.run([py, str(HERE / "dgl_partition_acm.py"), str(ROOT / "examples/data/acm.npz"),
                        str(tmp / "parts"), "1"], check=True, capture_output=True)  # fmt: skip
        script = tmp / "dgl_rgcn.py"  # DGL's own imports back in place
        text = (ROOT / "tests/dgl_scripts/rgcn_node_classification.py").read_text()
        script.write_text(re.sub(r"^(import|from) asyncgraph", r"\1 dgl", text, flags=re.M))
        env |= {"DGL_DIST_MODE": "standalone", "RGCN_DGL21": "1"}
    else:
        py = sys.executable
        sys.path.insert(0, str(ROOT / "tests"))
        import test_dgl_examples as t

        orig = t.partition_graph
        t.partition_graph = lambda g, name, n, out, **kw: orig(g, name, 1, out, **kw)
        t._partition_acm(tmp)
        script = ROOT / "tests/dgl_scripts/rgcn_node_classification.py"
        env["RGCN_OURS_STANDALONE"] = "1"
    args = ["--ip-config", "ip_config.txt", "--graph-name", "acm", "--conf-path", str(tmp / "parts/acm.json")]
    runs = []
    for seed in range(seeds):
        cmd = [py, str(HERE / "seeded.py"), str(script), *args, *BASE, *extra]
        seeded = {**env, "RGCN_SEED": str(seed)}
        res = subprocess.run(cmd, cwd=tmp, env=seeded, capture_output=True, text=True, check=False)
        out = res.stdout + res.stderr
        accs = [float(a) for a in re.findall(r"Test Acc ([0-9.]+),", out)]
        err = "" if res.returncode == 0 else out.strip().splitlines()[-1]
        runs.append({"seed": seed, "test_acc": accs, "error": err})
        print(label, f"seed={seed}", accs, err, f"(majority class {MAJORITY})", flush=True)
    record(label, {"stack": stack, "mode": "standalone", "args": BASE + extra, "runs": runs})


if __name__ == "__main__":
    main()
