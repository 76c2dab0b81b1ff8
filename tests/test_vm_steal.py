"""``benchmarks/vm_steal.py`` and ``serve_bench``'s quiet p99: steal spread over timeline windows,
and the p99 of the windows the hypervisor left alone (pure parts, made-up counters)."""

from __future__ import annotations

import numpy as np

from benchmarks.serve_bench import _quiet_p99
from benchmarks.vm_steal import StealProbe, read_steal, steal_per_window


def _probe(times: list[float], per_cpu: list[list[float]]) -> StealProbe:
    probe = StealProbe()
    probe.times = times
    probe.samples = [np.array(row) for row in per_cpu]
    return probe


def test_steal_is_spread_over_the_windows_it_fell_in() -> None:
    # cpu1 loses 40 ms between t=10.6 and t=10.7; cpu0 loses 10 ms over the first second
    probe = _probe(
        [10.0, 10.6, 10.7, 11.0, 12.0], [[0, 0], [0.006, 0], [0.007, 0.04], [0.01, 0.04], [0.01, 0.04]]
    )
    rows = steal_per_window(probe, start=10.0, window_s=0.5, windows=4)
    assert [r["steal_max_cpu_ms"] for r in rows] == [5.0, 40.0, 0.0, 0.0]
    assert [r["steal_ms"] for r in rows] == [5.0, 45.0, 0.0, 0.0]


def test_no_counters_give_empty_windows() -> None:
    assert steal_per_window(_probe([1.0], [[0.0]]), 1.0, 0.5, 3) == [{}, {}, {}]


def test_quiet_p99_leaves_out_stolen_windows_and_the_ones_after() -> None:
    rate, per = 100.0, 50  # 50 requests a 0.5 s window
    latencies = np.full(6 * per, 0.005)
    latencies[2 * per : 4 * per] = 0.080  # a stall and its queue
    windows = [{"steal_max_cpu_ms": s} for s in (0, 0, 60, 0, 0, 0)]
    out = _quiet_p99(latencies, rate, windows)
    assert out["windows"] == 6 and out["quiet_windows"] == 4
    assert abs(out["p99_quiet_ms"] - 5.0) < 1e-9
    assert _quiet_p99(latencies, rate, [{} for _ in range(6)]) == {}


def test_the_probe_reads_this_machines_counters() -> None:
    probe = StealProbe(every_s=0.01).start()
    probe.stop()
    assert len(probe.times) >= 2
    assert read_steal().size in (0, len(probe.samples[0]))
