"""A trainer for launcher tests that needs no GPU: it writes the environment the launcher gave it
and proves it reaches every partition (one feature row pulled from each, and its share of the
training nodes), to ``OUT/rank<RANK>.json``. It never touches CUDA, so a launch with
``--num-gpus-per-host N`` can be checked on a CPU-only machine.

    python -m asyncgraph.launch ... -- python tests/workers/launch_probe.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import asyncgraph

KEYS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "ASYNCGRAPH_DEVICE", "ASYNCGRAPH_DDP_BACKEND", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
)  # fmt: skip


def main(out: Path) -> None:
    env = {k: os.environ.get(k) for k in KEYS}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    config = asyncgraph.PartitionConfig.load(os.environ["ASYNCGRAPH_PART_CONFIG"])
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph(config.graph_name)
        book = g.get_partition_book()
        firsts = [int(book.node_range(p)[0]) for p in range(book.num_partitions())]
        rows = [g.ndata["feat"][first : first + 1][0].tolist() for first in firsts]
        n = g.num_nodes()
        share = asyncgraph.node_split(g.ndata["train_mask"][0:n], book, rank=rank, world_size=world)
    finally:
        asyncgraph.finalize()
    record = {"env": env, "first_ids": firsts, "rows": rows, "train_share": share.tolist()}
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
