"""What running two processes at once gives on this machine: the ceiling of "2 workers over 1".

A loader worker's batch is Python between compiled kernels plus a gather of random feature rows
(memory latency and bandwidth). Two workers can be at most as much faster than one as two
processes doing such work at once are than one, which on a VM whose two vCPUs share a physical
core, or its memory channels, is well below 2x. Measured here, in the same run as the loader:

* ``python``: a pure-Python loop (the interpreter's share of a batch);
* ``gather``: ``np.take`` of random 512-byte rows (128 float32, the benchmark graph's features)
  from a 512 MiB table into a reused buffer (the feature gather's share).

Each is timed alone, then as two processes started together; the figure is the throughput of
the two over that of one (2.0 = two independent cores). ``python -m benchmarks.machine_ceiling``
prints it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_PYTHON = """
import time
t = time.perf_counter()
s = 0
for i in range(N):
    s += i
print(time.perf_counter() - t)
"""

_GATHER = """
import time
import numpy as np
table = np.random.default_rng(0).random((1 << 20, 128), dtype=np.float32)
rows = np.random.default_rng(1).integers(0, 1 << 20, (N, 30000))
out = np.empty((30000, 128), np.float32)
np.take(table, rows[0], axis=0, out=out)
t = time.perf_counter()
for r in rows:
    np.take(table, r, axis=0, out=out)
print(time.perf_counter() - t)
"""


def _run(code: str, n: int, copies: int) -> list[float]:
    procs = [
        subprocess.Popen([sys.executable, "-c", code.replace("N", str(n))], stdout=subprocess.PIPE, text=True)
        for _ in range(copies)
    ]
    return [float(p.communicate(timeout=300)[0]) for p in procs]


def two_process_scaling(rounds: int = 3) -> dict[str, Any]:
    """Per kind of work: seconds alone, seconds of each of two at once (per round) and the
    median throughput ratio of two over one."""
    out: dict[str, Any] = {}
    for name, code, n in (("python", _PYTHON, 20_000_000), ("gather", _GATHER, 40)):
        ratios, alone, together = [], [], []
        for _ in range(rounds):
            one = _run(code, n, 1)[0]
            two = _run(code, n, 2)
            alone.append(round(one, 3))
            together.append([round(x, 3) for x in two])
            ratios.append(round(2 * one / max(two), 3))
        ratios_sorted = sorted(ratios)
        out[name] = {
            "alone_s": alone,
            "two_at_once_s": together,
            "two_over_one_runs": ratios,
            "two_over_one": ratios_sorted[len(ratios_sorted) // 2],
        }
    return out


if __name__ == "__main__":
    print(json.dumps(two_process_scaling(), indent=2))
