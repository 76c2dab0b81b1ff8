"""Ceilings measured in the same run: loopback socket, numpy gather, in-process sampling kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import loopback_ceiling, median_time


def gather_ceiling(part_config: Path, rows: int) -> dict[str, float]:
    """numpy gather of ``rows`` random rows of partition 0's features, in this process."""
    from asyncgraph.partition import load_partition

    part = load_partition(part_config, 0, mmap=False)
    feat = part.node_feats.get("feat", next(iter(part.node_feats.values())))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, feat.shape[0], rows)
    seconds = median_time(lambda: feat[ids])
    row_bytes = int(feat[0].nbytes)
    return {"rows_per_s": rows / seconds, "MB_per_s": rows * row_bytes / seconds / 1e6, "seconds": seconds}


def sample_ceiling(part_config: Path, rows: int, fanout: int) -> dict[str, float]:
    """``sample_csc`` on partition 0 with ``rows`` random seeds, in this process."""
    from asyncgraph.kernels.sampling import sample_csc
    from asyncgraph.partition import load_partition

    part = load_partition(part_config, 0, mmap=False)
    rng = np.random.default_rng(0)
    seeds = rng.integers(0, part.num_owned_nodes, rows)
    out: list[int] = [0]

    def run() -> None:
        src, _, _ = sample_csc(part.indptr, part.indices, part.eids, seeds, fanout, False, rng)
        out[0] = int(src.size)

    seconds = median_time(run)
    return {"seeds_per_s": rows / seconds, "edges_per_s": out[0] / seconds, "seconds": seconds}


def measure_ceilings(part_config: Path | None, rows: int, fanout: int) -> dict[str, Any]:
    """All ceilings for one row count (loopback always; the others need the partition files)."""
    loopback = loopback_ceiling()
    result: dict[str, Any] = {
        "loopback_MB_per_s": loopback["MB_per_s"],
        "loopback_round_trip_us": loopback["round_trip_us"],
    }
    if part_config is not None:
        result["gather"] = gather_ceiling(part_config, rows)
        result["sample_kernel"] = sample_ceiling(part_config, rows, fanout)
    return result
