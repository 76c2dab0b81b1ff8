"""``python -m asyncgraph.pyg.partition_dataset``: the files PyG's distributed examples read.

PyG's ``examples/distributed/pyg/partition_graph.py`` writes, under
``<root_dir>/partitions/<dataset>/<N>-parts/``: ``<dataset>-partitions/`` (the partitions),
``<dataset>-label/label.pt`` (every node's label; papers' on a heterogeneous graph) and
``<dataset>-{train,val,test}-partitions/partition<i>.pt`` (the split's node IDs cut into ``N``
equal runs, one per node rank; the remainder is dropped, as PyG's does). This writes the same
layout with asyncgraph's partitioner (``<dataset>-partitions/<dataset>.json`` and its files, which
``asyncgraph.pyg.LocalGraphStore.from_partition`` reads), for the bundled datasets
(``asyncgraph.pyg.datasets``: ``pubmed``, ``acm``; ``acm`` made undirected with PyG's
``ToUndirected(merge=True)``, as the original does to ogbn-mag). Node IDs in every file are
asyncgraph's (renumbered so each partition owns a range; ``orig_nids.npy`` maps them back).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch_geometric.transforms as T
from torch_geometric.data import HeteroData

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition import load_orig_ids, partition_graph

from .datasets import DATASETS

__all__ = ["main", "partition_dataset"]

#: Where the repository keeps the bundled graphs (``--data_dir``'s default).
BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "data"


def partition_dataset(
    dataset: str, root_dir: str | Path, num_parts: int, data_dir: str | Path = BUNDLED, method: str = "metis"
) -> Path:
    """Partition ``dataset`` into PyG's example layout under ``<root_dir>/partitions/<dataset>/<N>-parts``
    (returned)."""
    if dataset not in DATASETS:
        raise InvalidRequestError(f"unknown dataset {dataset!r}; bundled: {sorted(DATASETS)}")
    if num_parts < 1:
        raise InvalidRequestError(f"num_partitions must be at least 1, got {num_parts}")
    transform = T.ToUndirected(merge=True) if dataset == "acm" else None
    data = DATASETS[dataset](data_dir, transform=transform)[0]
    save_dir = Path(root_dir) / "partitions" / dataset / f"{num_parts}-parts"
    parts_dir = save_dir / f"{dataset}-partitions"
    partition_graph(data, dataset, num_parts, parts_dir, part_method=method, overwrite=True)
    if isinstance(data, HeteroData):
        orig = torch.from_numpy(load_orig_ids(parts_dir / f"{dataset}.json", per_type=True)[0]["paper"])
        split_data = data["paper"]
    else:
        orig = torch.from_numpy(load_orig_ids(parts_dir / f"{dataset}.json")[0])
        split_data = data
    label_dir = save_dir / f"{dataset}-label"
    label_dir.mkdir(parents=True, exist_ok=True)
    torch.save(split_data.y[orig].clone(), label_dir / "label.pt")  # in asyncgraph's node IDs
    for key in ("train", "val", "test"):
        idx = split_data[f"{key}_mask"][orig].nonzero().view(-1)
        chunks = idx.split(max(idx.size(0) // num_parts, 1))
        part_dir = save_dir / f"{dataset}-{key}-partitions"
        part_dir.mkdir(parents=True, exist_ok=True)
        for i in range(num_parts):
            chunk = chunks[i] if i < len(chunks) else idx[:0]
            torch.save(chunk.clone(), part_dir / f"partition{i}.pt")
    return save_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asyncgraph.pyg.partition_dataset", description=__doc__)
    ap.add_argument("--dataset", choices=sorted(DATASETS), default="pubmed")
    ap.add_argument("--root_dir", default="data", help="the layout goes under <root_dir>/partitions")
    ap.add_argument("--num_partitions", type=int, default=2)
    ap.add_argument("--data_dir", type=Path, default=BUNDLED, help="where pubmed.npz / acm.npz are")
    ap.add_argument("--method", choices=("metis", "random"), default="metis")
    args = ap.parse_args(argv)
    try:
        out = partition_dataset(args.dataset, args.root_dir, args.num_partitions, args.data_dir, args.method)
    except InvalidRequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
