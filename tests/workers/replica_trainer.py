"""A launched trainer that checks its partitions are served by a primary and a replica each."""

from __future__ import annotations

import os

import numpy as np

from asyncgraph.client import Client, IpConfig
from asyncgraph.client.replicated import ReplicatedPartition
from asyncgraph.env import ENV_HOLDER, ENV_HOLDER_KEY_FILE, ENV_IP_CONFIG, read_holder_key


def main() -> None:
    # the launcher gives a trainer its holder's key, not the secret (issue 32); replicas check it too
    client = Client.connect(
        IpConfig.load(os.environ[ENV_IP_CONFIG]).addresses(),
        holder=os.environ[ENV_HOLDER],
        holder_key=read_holder_key(os.environ[ENV_HOLDER_KEY_FILE]),
        use_shared_memory=False,
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
