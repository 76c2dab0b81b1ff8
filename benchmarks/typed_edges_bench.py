"""What per-type edge IDs cost: typed edge reads beside the same rows read by homogeneous ID.

ACM (examples/data/acm.npz, 16 words, 34,852 edges of 4 types) with an int64 edge tensor ``tag``
given per type, random 2-way partitions, 2 real servers on 127.0.0.1, one client. Measured in the
same run, each the median of ``--repeats`` over ``--batch`` random per-type IDs of
``("paper", "written-by", "author")``:

* typed: ``g.edges[etype].data["tag"][ids]`` (book range computation, one pull of
  ``_TYPE_ORDER`` from the owners, then the rows);
* map: ``book.map_to_homo_eid(ids, etype)`` alone;
* ceiling: ``g.edata["tag"][homo]`` with the homogeneous IDs of the same edges known beforehand
  (the same rows, one pull): the typed read cannot beat it, and costs about one more pull.

Each over shared memory (the client on the servers' host maps both partitions) and over the
socket. Prints rows/s and writes ``benchmarks/results/typed_edges_bench.json``.

Run: ``flock /tmp/asyncgraph-bench.lock .venv/bin/python -m benchmarks.typed_edges_bench``
(about 20 s).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import asyncgraph
from asyncgraph.client.sync_client import Client
from asyncgraph.distributed import DistGraph
from asyncgraph.testing import start_servers

from .common import median_time

ROOT = Path(__file__).resolve().parent.parent
WB = ("paper", "written-by", "author")


def measure(g: DistGraph, batch: int, repeats: int) -> dict[str, float]:
    """Typed reads, the ID map alone, and the ceiling, of ``batch`` random per-type IDs."""
    book = g.get_partition_book()
    ids = np.random.default_rng(0).integers(0, g.num_edges(WB), batch)
    homo = book.map_to_homo_eid(ids, WB)
    typed_t, stored = g.edges[WB].data["tag"], g.edata["tag"]
    assert np.array_equal(typed_t[ids].numpy(), stored[homo].numpy())  # the same rows
    t_typed = median_time(lambda: typed_t[ids], repeats)
    t_map = median_time(lambda: book.map_to_homo_eid(ids, WB), repeats)
    t_ceil = median_time(lambda: stored[homo], repeats)
    return {
        "typed_rows_per_s": batch / t_typed,
        "map_ids_per_s": batch / t_map,
        "ceiling_rows_per_s": batch / t_ceil,
        "typed_over_ceiling": t_ceil / t_typed,
        "typed_ms": 1e3 * t_typed,
        "map_ms": 1e3 * t_map,
        "ceiling_ms": 1e3 * t_ceil,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "typed_edges_bench.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "examples"))
    from hetero_node_classification import load_acm

    g0 = load_acm(words=16)
    for i, c in enumerate(g0.canonical_etypes):
        g0.edges[c].data["tag"] = (100000 * i + np.arange(g0.num_edges(c))).astype(np.int64)
    results: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": platform.platform(),
        "note": "shared 2-core VM: other engineers' tests may have run at the same time",
        "graph": "ACM, 34,852 edges, 4 edge types; 2 random partitions, 2 servers on 127.0.0.1",
        "batch": args.batch,
        "repeats": args.repeats,
    }
    with tempfile.TemporaryDirectory() as tmp:
        asyncgraph.partition_graph(g0, "acm", 2, tmp, part_method="random")
        cfg = Path(tmp) / "acm.json"
        group = start_servers(cfg, Path(tmp) / "srv", num_parts=2)
        try:
            for mode, shm in (("shared_memory", True), ("socket", False)):
                client = Client.connect(group.addresses, use_shared_memory=shm)
                row = measure(DistGraph("acm", client=client), args.batch, args.repeats)
                results[mode] = row
                print(
                    f"{mode}: typed {row['typed_rows_per_s']:,.0f} rows/s ({row['typed_ms']:.2f} ms) | "
                    f"map_to_homo_eid {row['map_ids_per_s']:,.0f} IDs/s ({row['map_ms']:.2f} ms) | "
                    f"ceiling (homogeneous IDs known) {row['ceiling_rows_per_s']:,.0f} rows/s "
                    f"({row['ceiling_ms']:.2f} ms) | typed / ceiling {row['typed_over_ceiling']:.2f}",
                    flush=True,
                )
                client.close()
        finally:
            group.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
