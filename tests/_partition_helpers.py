"""Shared helpers for the partition tests: load test graphs and check a partitioning on disk."""

from __future__ import annotations

from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.partition import PartitionConfig, load_partition
from asyncgraph.partition.graph import Graph

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data"


@cache
def raw_graph(name: str) -> dict[str, np.ndarray[Any, Any]]:
    """Arrays of a test graph: a bundled data set or ``synth`` (seeded power-law, 4096 nodes).

    Every graph gets an edge tensor ``w`` (float32 [E, 2]: original src and dst) so tests can
    check that edge rows follow their edges.
    """
    if name == "synth":
        from benchmarks.synthetic import make_synthetic

        arrays = dict(make_synthetic(scale=12, seed=1))
        arrays["feat"] = arrays["feat"][:, :16].copy()
    else:
        with np.load(DATA / f"{name}.npz") as f:
            arrays = {k: f[k] for k in f.files}
    arrays["w"] = np.stack([arrays["src"], arrays["dst"]], axis=1).astype(np.float32)
    return arrays


def make_graph(name: str) -> Graph:
    """A :class:`Graph` of ``raw_graph(name)`` with ``w`` as an edge tensor."""
    a = raw_graph(name)
    ndata = {k: v for k, v in a.items() if k not in ("src", "dst", "w")}
    return Graph(a["label"].shape[0], a["src"], a["dst"], ndata, {"w": a["w"]})


def categories(a: dict[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """0 train, 1 val, 2 test, 3 other."""
    cat = np.full(a["label"].shape[0], 3, dtype=np.int64)
    cat[a["test_mask"]] = 2
    cat[a["val_mask"]] = 1
    cat[a["train_mask"]] = 0
    return cat


def check_partitioning(
    config_path: Path,
    a: dict[str, np.ndarray[Any, Any]],
    orig_nids: np.ndarray[Any, Any],
    orig_eids: np.ndarray[Any, Any],
) -> list[Any]:
    """Assert every structural invariant of a partitioning; returns the loaded partitions."""
    cfg = PartitionConfig.load(config_path)
    n, e = a["label"].shape[0], a["src"].size
    assert (cfg.num_nodes, cfg.num_edges) == (n, e)
    # mappings are permutations
    assert orig_nids.dtype == np.int64 and orig_eids.dtype == np.int64
    assert np.array_equal(np.sort(orig_nids), np.arange(n))
    assert np.array_equal(np.sort(orig_eids), np.arange(e))
    new_of = np.empty(n, dtype=np.int64)
    new_of[orig_nids] = np.arange(n)
    parts = [load_partition(config_path, p) for p in range(cfg.num_parts)]
    # ranges contiguous and covering
    assert parts[0].node_range[0] == 0 and parts[0].edge_range[0] == 0
    for p0, p1 in pairwise(parts):
        assert p0.node_range[1] == p1.node_range[0] and p0.edge_range[1] == p1.edge_range[0]
    assert parts[-1].node_range[1] == n and parts[-1].edge_range[1] == e
    all_src, all_dst, all_eid = [], [], []
    for part in parts:
        n0, n1 = part.node_range
        e0, e1 = part.edge_range
        indptr = np.asarray(part.indptr)
        assert np.array_equal(np.asarray(part.eids), np.arange(e0, e1))
        dst_new = n0 + np.repeat(np.arange(n1 - n0), np.diff(indptr))
        src_new = np.asarray(part.indices)
        # CSC order inside the part: sorted by (dst, src)
        key = dst_new * n + src_new
        assert np.all(np.diff(key) >= 0)
        all_src.append(src_new)
        all_dst.append(dst_new)
        all_eid.append(np.asarray(part.eids))
        # node and edge tensors follow their rows
        for k, v in part.node_feats.items():
            assert np.array_equal(np.asarray(v), a[k][orig_nids[n0:n1]]), k
        assert np.array_equal(np.asarray(part.edge_feats["w"]), a["w"][orig_eids[e0:e1]])
    src_new = np.concatenate(all_src)
    dst_new = np.concatenate(all_dst)
    eid_new = np.concatenate(all_eid)
    # every original edge exactly once, with the right endpoints
    assert np.array_equal(np.sort(orig_eids[eid_new]), np.arange(e))
    assert np.array_equal(orig_nids[src_new], a["src"][orig_eids[eid_new]])
    assert np.array_equal(orig_nids[dst_new], a["dst"][orig_eids[eid_new]])
    return parts
