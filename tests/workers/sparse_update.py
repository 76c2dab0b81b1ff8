"""A trainer process that sends sparse Adagrad updates to its own rows; used by test_embedding."""

from __future__ import annotations

import sys

import numpy as np

from asyncgraph.client import Client, IpConfig

SPEC = {"kind": "adagrad", "lr": 0.1, "eps": 1e-10}


def rounds(n: int, parity: int, seed: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (ids, grads) this worker sends: rows of its parity near both ends (both partitions)."""
    rng = np.random.default_rng(seed)
    candidates = np.concatenate([np.arange(0, 64), np.arange(n - 64, n)])
    mine = candidates[candidates % 2 == parity]
    out = []
    for _ in range(count):
        ids = rng.choice(mine, 40)  # duplicates included
        out.append((ids, rng.standard_normal((40, 2)).astype(np.float32)))
    return out


def main() -> None:
    ip_config, count, seed, parity, shm = sys.argv[1:6]
    client = Client.connect(IpConfig.load(ip_config).addresses(), use_shared_memory=shm == "1")
    n = client.book.num_nodes
    for ids, grads in rounds(n, int(parity), int(seed), int(count)):
        client.sparse_update("node:conc", ids, grads, SPEC)
    client.close()


if __name__ == "__main__":
    main()
