"""Run the RGCN test's launch (ACM, 2 partitions x 1 trainer) N times and print trainer 0's
per-epoch test accuracies and each run's wall time: the evidence for the test's arguments.

``python benchmarks/rgcn/repeat_dist.py N LABEL [script args replacing the test's]``; run from the
repository root; merges the runs into ``benchmarks/results/rgcn_acm_stability.json`` under LABEL.
Not a timed benchmark: the figures are accuracies, next to the majority-class accuracy."""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import test_dgl_examples as t

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stability import MAJORITY, record

if __name__ == "__main__":
    n, label = int(sys.argv[1]), sys.argv[2]
    args = sys.argv[3:] or list(t.RGCN_ARGS)
    runs = []
    print("args:", " ".join(args), flush=True)
    passed = 0
    for i in range(n):
        tmp = Path(tempfile.mkdtemp())
        cfg = t._partition_acm(tmp)
        tic = time.perf_counter()
        base = ["--ip-config", "ip_config.txt", "--graph-name", "acm", "--conf-path", str(cfg)]
        out = t._launch(tmp, cfg, "rgcn_node_classification.py", *base, *args)
        accs = [float(a) for a in re.findall(r"\[trainer 0\] Val Acc \S+, Test Acc ([0-9.]+),", out)]
        ok = len(accs) >= 3 and max(accs[-3:]) > t.RGCN_MIN_ACC
        passed += ok
        runs.append({"test_acc": accs, "passed": ok, "wall_s": round(time.perf_counter() - tic, 1)})
        print(i, "pass" if ok else "FAIL", f"{time.perf_counter() - tic:.1f}s", accs, flush=True)
    rule = f"max of the last 3 epochs' test accuracy > {t.RGCN_MIN_ACC}; majority class {MAJORITY}"
    print(f"{passed}/{n} passed ({rule})")
    record(label, {"stack": "ours", "mode": "2 partitions x 1 trainer", "args": args, "runs": runs})
