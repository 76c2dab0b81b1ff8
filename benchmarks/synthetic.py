"""Seeded synthetic power-law graph for benchmarks and tests (R-MAT + uniform edges).

``make_synthetic(scale)`` has ``2**scale`` nodes and, after dropping self loops, symmetrising and
deduplicating, about ``10.1 * 2**scale`` directed edges (≈10.6M at scale 20, like the DGL
reference benchmark). 80% of generated edges are R-MAT (a=0.57, b=c=0.19, d=0.05), 20% uniform.
Labels (50 classes) come from the top bits of a node's R-MAT ID, which R-MAT edges tend to share,
and features are a class centroid plus noise, so the task is learnable. Node IDs are randomly
permuted so that IDs carry no locality.

CLI: ``python -m benchmarks.synthetic --scale 20 --out benchmarks/data/synth20.npz``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

NUM_CLASSES = 50
FEAT_DIM = 128
# Generated edges per node; tuned so the deduplicated symmetric graph has ~10.1 * N edges.
EDGES_PER_NODE = 5.17
RMAT_PROBS = (0.57, 0.19, 0.19, 0.05)


def rmat_edges(scale: int, num_edges: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``num_edges`` R-MAT edges on ``2**scale`` nodes; all edges' bits drawn at once per level."""
    a, b, c, _ = RMAT_PROBS
    cuts = np.array([a, a + b, a + b + c], dtype=np.float32)
    src = np.zeros(num_edges, dtype=np.int64)
    dst = np.zeros(num_edges, dtype=np.int64)
    quad = np.empty(num_edges, dtype=np.int64)
    for _level in range(scale):  # most significant bit first
        # Quadrant 0=a, 1=b (dst bit), 2=c (src bit), 3=d (both bits).
        np.copyto(quad, np.searchsorted(cuts, rng.random(num_edges, dtype=np.float32), side="right"))
        src <<= 1
        src |= quad >> 1
        dst <<= 1
        dst |= quad & 1
    return src, dst


def make_synthetic(scale: int = 20, seed: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    """Build the graph as the bundled npz layout: src/dst (sorted), feat, label, masks."""
    if not 1 <= scale <= 30:
        raise ValueError(f"scale must be in [1, 30], got {scale}")
    rng = np.random.default_rng(seed)
    n = 1 << scale
    m = int(EDGES_PER_NODE * n)
    m_rmat = int(0.8 * m)
    s1, d1 = rmat_edges(scale, m_rmat, rng)
    s2 = rng.integers(0, n, m - m_rmat, dtype=np.int64)
    d2 = rng.integers(0, n, m - m_rmat, dtype=np.int64)
    src = np.concatenate([s1, s2])
    dst = np.concatenate([d1, d2])
    del s1, d1, s2, d2

    # Labels from the R-MAT top bits (before permuting IDs), mapped onto 50 classes.
    top = min(scale, 12)
    rmat_id = np.arange(n, dtype=np.int64)
    label = ((rmat_id >> (scale - top)) * NUM_CLASSES) >> top
    perm = rng.permutation(n)  # perm[old] = new
    label_new = np.empty(n, dtype=np.int64)
    label_new[perm] = label
    del rmat_id, label

    keep = src != dst
    src = perm[src[keep]]
    dst = perm[dst[keep]]
    del keep
    keys = np.concatenate([(src << scale) | dst, (dst << scale) | src])
    del src, dst
    keys.sort()  # sort + mask: much faster than np.unique's hash path on 20M keys
    keep = np.empty(keys.size, dtype=bool)
    keep[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    keys = keys[keep]  # sorted by (src, dst), duplicates dropped
    del keep
    src = keys >> scale
    dst = keys & np.int64(n - 1)
    del keys

    centroids = rng.standard_normal((NUM_CLASSES, FEAT_DIM), dtype=np.float32)
    feat = rng.standard_normal((n, FEAT_DIM), dtype=np.float32)
    feat *= np.float32(1.5)
    step = 1 << 16
    for start in range(0, n, step):  # chunked so the centroid gather stays small
        feat[start : start + step] += centroids[label_new[start : start + step]]

    order = rng.permutation(n)
    n_train, n_val, n_test = int(0.10 * n), int(0.05 * n), int(0.05 * n)
    masks = {}
    for name, lo, hi in (
        ("train_mask", 0, n_train),
        ("val_mask", n_train, n_train + n_val),
        ("test_mask", n_train + n_val, n_train + n_val + n_test),
    ):
        mask = np.zeros(n, dtype=bool)
        mask[order[lo:hi]] = True
        masks[name] = mask
    return {"src": src, "dst": dst, "feat": feat, "label": label_new, **masks}


def main() -> None:
    """CLI: generate and save with ``np.savez`` (uncompressed)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.synthetic", description=__doc__)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/data/synth<scale>.npz")
    args = ap.parse_args()
    out = args.out or Path(__file__).parent / "data" / f"synth{args.scale}.npz"
    t0 = time.perf_counter()
    data = make_synthetic(args.scale, args.seed)
    t1 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **data)  # type: ignore[arg-type]
    n, e = data["feat"].shape[0], data["src"].size
    print(
        f"synthetic scale {args.scale}: {n:,} nodes, {e:,} edges; generated in {t1 - t0:.1f} s, "
        f"saved {out} in {time.perf_counter() - t1:.1f} s"
    )


if __name__ == "__main__":
    main()
