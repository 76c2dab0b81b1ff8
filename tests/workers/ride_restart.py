"""Trainer for the launcher's --restart-servers test: rank 0 kills server 0 mid-loop (SIGKILL);
every rank keeps pulling and push-adding; rank 0 checks that no add was lost or doubled."""

from __future__ import annotations

import json
import os
import signal

import numpy as np

from asyncgraph.distributed import barrier, finalize, get_client, initialize

STEPS = 30
initialize()
client = get_client()
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
n = client.book.num_nodes
client.create_tensor("w", "node", [n, 4], "float32")
barrier("created")
rng = np.random.default_rng(rank)
for step in range(STEPS):
    ids = rng.integers(0, n, 256)
    client.pull("w", ids)
    client.push("w", ids, np.ones((256, 4), np.float32), op="add")
    if rank == 0 and step == 10:
        os.kill(int(client.info(0)["pid"]), signal.SIGKILL)
client.pull("w", np.arange(n))  # reconnected to both servers before meeting at the barrier
barrier("done")
if rank == 0:
    total = float(client.pull("w", np.arange(n)).sum())
    print("RESULT " + json.dumps({"total": total, "expected": world * STEPS * 256 * 4}), flush=True)
barrier("checked")
finalize()
