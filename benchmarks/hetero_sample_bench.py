"""Heterogeneous sampling throughput beside homogeneous sampling on the same graph, same run.

Graph (seeded, built inline): ~1M nodes of 3 types (user 600k, item 350k, tag 50k) and 4 edge
types: ``user-buys-item`` and its reverse ``item-bought-by-user`` (2M each), ``item-has-tag`` and
its reverse ``tag-tags-item`` (0.7M each), 5.4M edges in all. Endpoints are power-law: the
``item`` and ``tag`` end of every edge is drawn from a Zipf-like law (``p(i) ~ (i + 1)**-0.8``
over a random permutation of the type's IDs), the ``user`` end uniformly, so items and tags have
hubs and users do not. Partitioned once (random, 1 partition; cached in a temp folder) and
sampled in-process (standalone client: the same kernels a server runs, no sockets) so the
figures compare the kernels, not the network.

Measured, each the median of ``--repeats`` runs over the same seed batches:
* homo: ``sample_neighbors`` of 1,000 random homogeneous node IDs at fanout 10 (all edge
  types pooled; the Floyd kernel, cost independent of degree);
* homo_options: the same through ``sample_edges`` (the kernel behind ``prob=``/``exclude=``:
  a random key per candidate in-edge and a segmented top-k, cost linear in the seeds' degrees),
  which the typed kernel extends;
* hetero: ``sample_neighbors({ntype: ids}, {etype: 10 for every etype})`` of the same 1,000 nodes
  given per type (up to 10 in-edges of *each* type per seed, the server groups by edge type).
Reports seeds/s and sampled edges/s of each. Writes ``benchmarks/results/hetero_sample_bench.json``.

Run: ``.venv/bin/python -m benchmarks.hetero_sample_bench`` (about 40 s here, most of it building
and partitioning the graph).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import asyncgraph
from asyncgraph.client.sync_client import Client
from asyncgraph.distributed import DistGraph
from benchmarks.common import RESULTS, median_time

SIZES = {"user": 600_000, "item": 350_000, "tag": 50_000}


def zipf_ids(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` IDs in ``[0, n)`` with ``p(rank r) ~ (r + 1)**-0.8`` over a random permutation."""
    w = (np.arange(n, dtype=np.float64) + 1.0) ** -0.8
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(k)), n - 1)
    return rng.permutation(n)[ranks].astype(np.int64)


def build(seed: int = 0) -> asyncgraph.HeteroGraph:
    rng = np.random.default_rng(seed)
    users = rng.integers(0, SIZES["user"], 2_000_000)
    items = zipf_ids(SIZES["item"], 2_000_000, rng)
    t_items = zipf_ids(SIZES["item"], 700_000, rng)
    tags = zipf_ids(SIZES["tag"], 700_000, rng)
    return asyncgraph.heterograph(
        {
            ("user", "buys", "item"): (users, items),
            ("item", "bought-by", "user"): (items, users),
            ("item", "has", "tag"): (t_items, tags),
            ("tag", "tags", "item"): (tags, t_items),
        },
        num_nodes_dict=SIZES,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--fanout", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    g0 = build()
    with tempfile.TemporaryDirectory() as tmp:
        asyncgraph.partition_graph(g0, "het", 1, tmp, part_method="random")
        build_s = time.perf_counter() - t0
        client = Client.standalone(Path(tmp) / "het.json")
        g = DistGraph("het", client=client)
        book = g.get_partition_book()
        rng = np.random.default_rng(1)
        batches = [rng.choice(book.num_nodes, args.batch_size, replace=False) for _ in range(args.batches)]
        typed = []
        for b in batches:
            t, ids = book.map_to_per_ntype(b)
            typed.append({book.ntypes[i]: ids[t == i] for i in range(len(book.ntypes))})
        fan = {c: args.fanout for c in g.canonical_etypes}
        edges = {"homo": 0, "homo_options": 0, "hetero": 0}

        def homo() -> None:
            edges["homo"] = sum(client.sample_neighbors(b, args.fanout, seed=7)[0].size for b in batches)

        def homo_options() -> None:  # the generic kernel the typed one extends (random keys + top-k)
            edges["homo_options"] = sum(
                client.sample_edges(b, args.fanout, edge_dir="in", seed=7)[0].size for b in batches
            )

        def hetero() -> None:
            edges["hetero"] = sum(g.sample_etype_neighbors(s, fan, seed=7).num_edges() for s in typed)

        fns = {"homo": homo, "homo_options": homo_options, "hetero": hetero}
        times = {k: median_time(fn, args.repeats) for k, fn in fns.items()}
        client.close()
    seeds = args.batches * args.batch_size
    rows: dict[str, Any] = {
        k: {
            "seconds": times[k],
            "seeds_per_s": seeds / times[k],
            "edges_per_s": edges[k] / times[k],
            "edges": edges[k],
        }
        for k in times
    }
    out = {
        "graph": {"num_nodes": int(book.num_nodes), "num_edges": int(book.num_edges), "sizes": SIZES},
        "batch_size": args.batch_size,
        "batches": args.batches,
        "fanout": args.fanout,
        "build_and_partition_s": build_s,
        "results": rows,
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }
    for k, r in rows.items():
        print(f"{k:13s} {r['seeds_per_s']:>10,.0f} seeds/s {r['edges_per_s']:>12,.0f} edges/s ({r['edges']})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hetero_sample_bench.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
