"""Write a graph in DGL's chunked format (``metadata.json`` + chunk files): tests, benchmarks, users.

``write_chunked(graph, folder, num_chunks)`` splits every edge type and every tensor into
``num_chunks`` near-equal chunks, as DGL's ``tools/chunk_graph.py`` does; edges as csv (DGL's
default, ``"src dst"`` a line) or numpy (``(E, 2)`` int64), tensors as numpy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.graph import Graph
from asyncgraph.partition.hetero_graph import HeteroGraph

__all__ = ["write_chunked"]

HOMO_NTYPE = "_N"
HOMO_ETYPE = ("_N", "_E", "_N")


def _splits(total: int, k: int) -> list[int]:
    return [total // k + (i < total % k) for i in range(k)]


def _write_tensor(folder: Path, stem: str, arr: np.ndarray[Any, Any], k: int) -> dict[str, Any]:
    files, start = [], 0
    for i, rows in enumerate(_splits(arr.shape[0], k)):
        rel = f"{stem}-{i}.npy"
        np.save(folder / rel, arr[start : start + rows])
        files.append(rel)
        start += rows
    return {"format": {"name": "numpy"}, "data": files}


def write_chunked(graph: Graph | HeteroGraph, folder: str | Path, num_chunks: int = 2,
                  edge_format: str = "csv", graph_name: str = "graph") -> Path:  # fmt: skip
    """Write ``graph`` into ``folder`` in the chunked format; returns the ``metadata.json`` path."""
    if edge_format not in ("csv", "numpy"):
        raise InvalidRequestError(f"edge_format must be 'csv' or 'numpy', got {edge_format!r}")
    out = Path(folder)
    for sub in ("edges", "node_data", "edge_data"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    if isinstance(graph, HeteroGraph):
        ntypes = graph.ntypes
        canon = graph.canonical_etypes
        counts = {t: graph.num_nodes(t) for t in ntypes}
        pairs = {c: graph.edges(etype=c) for c in canon}
        ndata = {t: dict(graph.nodes[t].data) for t in ntypes}
        edata = {c: dict(graph.edges[c].data) for c in canon}
    else:
        ntypes, canon = [HOMO_NTYPE], [HOMO_ETYPE]
        counts = {HOMO_NTYPE: graph.num_nodes}
        pairs = {HOMO_ETYPE: (graph.src, graph.dst)}
        ndata = {HOMO_NTYPE: dict(graph.ndata)}
        edata = {HOMO_ETYPE: dict(graph.edata)}
    meta: dict[str, Any] = {
        "graph_name": graph_name,
        "node_type": ntypes,
        "num_nodes_per_chunk": [_splits(counts[t], num_chunks) for t in ntypes],
        "edge_type": [":".join(c) for c in canon],
        "num_edges_per_chunk": [_splits(int(pairs[c][0].size), num_chunks) for c in canon],
        "edges": {},
        "node_data": {},
        "edge_data": {},
    }
    for c in canon:
        name = ":".join(c)
        src, dst = pairs[c]
        files, start = [], 0
        for i, rows in enumerate(_splits(int(src.size), num_chunks)):
            both = np.stack([src[start : start + rows], dst[start : start + rows]], axis=1).astype(np.int64)
            if edge_format == "csv":
                rel = f"edges/{name.replace(':', '-')}-{i}.csv"
                np.savetxt(out / rel, both, fmt="%d", delimiter=" ")
            else:
                rel = f"edges/{name.replace(':', '-')}-{i}.npy"
                np.save(out / rel, both)
            files.append(rel)
            start += rows
        fmt: dict[str, str] = {"name": edge_format}
        if edge_format == "csv":
            fmt["delimiter"] = " "
        meta["edges"][name] = {"format": fmt, "data": files}
    for t, d in ndata.items():
        if d:
            meta["node_data"][t] = {
                k: _write_tensor(out, f"node_data/{t}-{k}", v, num_chunks) for k, v in d.items()
            }
    for c, d in edata.items():
        if d:
            name = ":".join(c)
            meta["edge_data"][name] = {
                k: _write_tensor(out, f"edge_data/{name.replace(':', '-')}-{k}", v, num_chunks)
                for k, v in d.items()
            }
    path = out / "metadata.json"
    path.write_text(json.dumps(meta, indent=2))
    return path
