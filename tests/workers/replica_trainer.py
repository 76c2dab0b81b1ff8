"""A launched trainer that checks its partitions are served by a primary and a replica each."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from asyncgraph.client import Client, IpConfig
from asyncgraph.client.replicated import ReplicatedPartition
from asyncgraph.env import ENV_IP_CONFIG, ENV_SECRET_FILE


def main() -> None:
    secret = Path(os.environ[ENV_SECRET_FILE]).read_bytes().strip()
    client = Client.connect(
        IpConfig.load(os.environ[ENV_IP_CONFIG]).addresses(), secret=secret, use_shared_memory=False
    )
    try:
        kinds = [type(p).__name__ for p in client.aio.partitions]
        assert all(isinstance(p, ReplicatedPartition) for p in client.aio.partitions), kinds
        ids = np.arange(0, client.book.num_nodes, 7)
        first = client.pull("node:feat", ids)
        for _ in range(4):
            assert (client.pull("node:feat", ids) == first).all()
        print("replicated partitions:", len(kinds), flush=True)
    finally:
        client.close()


if __name__ == "__main__":
    main()
