"""The load generator's latency histogram (hdrhistogram): percentiles, merging, transport."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.loadgen.worker import LatencyHistogram


def test_percentiles_within_a_tenth_of_a_percent_and_merge_through_json() -> None:
    lat = np.random.default_rng(0).lognormal(np.log(1e-3), 1.0, 20_000)
    halves = [LatencyHistogram(), LatencyHistogram()]
    for i, v in enumerate(lat.tolist()):
        halves[i % 2].record(v)
    merged = LatencyHistogram.from_dict(json.loads(json.dumps(halves[0].to_dict())))
    merged.merge(LatencyHistogram.from_dict(json.loads(json.dumps(halves[1].to_dict()))))
    assert merged.total == lat.size
    for q in (50, 95, 99, 99.9):
        exact = np.percentile(lat, q, method="higher")
        assert abs(merged.percentile(q) / exact - 1) < 2e-3, q
    assert abs(merged.max_s / lat.max() - 1) < 2e-3
    x, y = merged.cdf()
    assert np.all(np.diff(x) > 0) and np.all(np.diff(y) >= 0) and y[-1] == 1.0


def test_empty_and_out_of_range() -> None:
    h = LatencyHistogram()
    assert h.total == 0 and np.isnan(h.percentile(50)) and h.max_s == 0.0
    h.record(0.0)  # below 1 µs: counted as 1 µs
    h.record(1e9)  # beyond an hour: counted at the top
    assert h.total == 2 and h.percentile(0) == 1e-6 and h.max_s >= 3599
