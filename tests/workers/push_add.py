"""A trainer process that pushes ``add`` rounds; used by the concurrency test."""

from __future__ import annotations

import sys

import numpy as np

from asyncgraph.client import Client, IpConfig


def main() -> None:
    ip_config, secret, rounds, seed, shm = sys.argv[1:6]
    client = Client.connect(
        IpConfig.load(ip_config).addresses(), secret=secret.encode() or None, use_shared_memory=shm == "1"
    )
    n = client.book.num_nodes
    rng = np.random.default_rng(int(seed))
    for _ in range(int(rounds)):
        ids = rng.integers(0, 64, 50)
        ids[::2] += n - 64
        client.push("node:counter", ids, np.ones((50, 2)), op="add")
    client.close()


if __name__ == "__main__":
    main()
