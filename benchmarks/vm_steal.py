"""Where in a run the hypervisor took the VM's CPUs (``/proc/stat``'s per-CPU steal), so a
latency figure can be read beside what the machine gave: ``StealProbe`` samples every CPU's
steal counter on a thread while a rate runs; ``steal_per_window`` spreads it over the run's
timeline windows. A stolen vCPU freezes whatever runs on it, the serving loop included, while
the other vCPU (and the load generator on it) runs on: the generator's lateness cannot show it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["StealProbe", "read_steal", "steal_per_window"]

_TICK = os.sysconf("SC_CLK_TCK")


def read_steal() -> np.ndarray:
    """Seconds of steal so far of each CPU (``/proc/stat``'s ``cpuN`` lines; empty where the
    kernel reports none)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return np.zeros(0)
    per_cpu = [line.split() for line in lines if line.startswith("cpu") and line[3:4].isdigit()]
    return np.array([int(f[8]) / _TICK if len(f) > 8 else 0.0 for f in per_cpu])


class StealProbe:
    """Samples ``read_steal()`` every ``every_s`` seconds on a daemon thread (``perf_counter``
    timestamps), from ``start()`` to ``stop()``; ~30 us of the process's CPU a sample."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s = every_s
        self.times: list[float] = []
        self.samples: list[np.ndarray] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steal-probe", daemon=True)

    def start(self) -> StealProbe:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        self.times.append(time.perf_counter())
        self.samples.append(read_steal())

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()


def steal_per_window(
    probe: StealProbe, start: float, window_s: float, windows: int
) -> list[dict[str, float]]:
    """Per window ``[start + i * window_s, start + (i + 1) * window_s)``: the steal of all CPUs
    together and of the most stolen one (ms), from the probe's counters interpolated at the
    window's edges (the counters tick every 10 ms, so each figure is good to ~10 ms)."""
    if len(probe.samples) < 2 or not probe.samples[0].size:
        return [{} for _ in range(windows)]
    times = np.asarray(probe.times)
    counts = np.stack(probe.samples)  # [samples, cpus]
    edges = start + window_s * np.arange(windows + 1)
    at_edges = np.stack([np.interp(edges, times, counts[:, c]) for c in range(counts.shape[1])], axis=1)
    per_window = np.diff(at_edges, axis=0) * 1e3  # [windows, cpus], ms
    return [
        {"steal_ms": round(float(row.sum()), 1), "steal_max_cpu_ms": round(float(row.max()), 1)}
        for row in per_window
    ]
