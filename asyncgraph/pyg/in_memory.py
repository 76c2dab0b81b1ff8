"""PyG's in-memory ``NeighborLoader`` / ``LinkNeighborLoader``: PyG data served in-process.

PyG's own loaders over an in-memory graph need pyg-lib or torch-sparse (neither has a wheel for
every torch). :class:`NeighborLoader` and :class:`LinkNeighborLoader` take the same arguments;
given PyG data, each partitions it once into a single partition in a temporary folder (removed
with the last loader over it, or at exit) and samples it with a standalone client of its own
(not the process's: each in-memory graph has one, so several coexist, and a launched trainer's
client is left alone), so batches are what PyG's loaders give: the same attributes, ``n_id``
and ``e_id`` in the data's own IDs (one partition keeps every node's ID; ``e_id`` is mapped back
through the partitioner's ``orig_eids``). Given a ``DistGraph`` or a ``(feature store, graph
store)`` pair they are :class:`DistNeighborLoader` / :class:`DistLinkNeighborLoader`.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncgraph.errors import AsyncGraphError
from asyncgraph.partition import load_orig_ids, partition_graph
from asyncgraph.partition.from_pyg import is_pyg_data

from .link_loader import DistLinkNeighborLoader
from .loader import DistNeighborLoader

__all__ = ["LinkNeighborLoader", "NeighborLoader", "serve_in_memory"]

GRAPH_NAME = "pyg-in-memory"


@dataclass
class InMemoryGraph:
    """An in-memory PyG graph served here: its ``DistGraph`` and the partitioner's edge mapping."""

    graph: Any
    orig_eids: dict[Any, torch.Tensor]  # edge type (None: homogeneous) -> input edge ID of each served ID
    folder: Path


#: id(data) -> (the data, its served graph), both weakly: the loaders hold the served graph.
_SERVED: dict[int, tuple[weakref.ref[Any], weakref.ref[InMemoryGraph]]] = {}


def _release(client: Any, folder: Path) -> None:
    """Close a served graph's client and remove its folder (when its last loader goes, or at exit)."""
    try:
        if client is not None:
            client.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serve_in_memory(data: Any) -> InMemoryGraph:
    """Partition ``data`` (PyG's ``Data``/``HeteroData``) into one partition and open it standalone
    (once per data object while a loader holds it)."""
    hit = _SERVED.get(id(data))
    if hit is not None and hit[0]() is data and (held := hit[1]()) is not None:
        return held
    from asyncgraph.client.sync_client import Client
    from asyncgraph.distributed import DistGraph

    folder = Path(tempfile.mkdtemp(prefix="asyncgraph-pyg-mem-"))
    client = None
    try:
        partition_graph(data, GRAPH_NAME, 1, folder, part_method="random")
        nids, eids = load_orig_ids(folder / f"{GRAPH_NAME}.json", per_type=True)
        if not all(np.array_equal(v, np.arange(v.size)) for v in nids.values()):  # pragma: no cover
            raise AsyncGraphError("one partition renumbered the nodes: n_id would not be the data's IDs")
        hetero = len(eids) > 1 or next(iter(eids)) != ("_N", "_E", "_N")
        orig = {(c if hetero else None): torch.from_numpy(v) for c, v in eids.items()}
        client = Client.standalone(folder / f"{GRAPH_NAME}.json")
        served = InMemoryGraph(DistGraph(GRAPH_NAME, client=client), orig, folder)
    except BaseException:
        _release(client, folder)
        raise
    weakref.finalize(served, _release, client, folder)
    _SERVED[id(data)] = (weakref.ref(data), weakref.ref(served))
    return served


def _map_back(mem: InMemoryGraph | None, payload: dict[str, Any]) -> dict[str, Any]:
    """A prepared batch's ``e_id`` in the in-memory data's own edge IDs (per type, as PyG's)."""
    if mem is None:
        return payload
    if "edges" in payload:
        for c, attrs in payload["edges"].items():
            attrs["e_id"] = mem.orig_eids[c][attrs["e_id"]]
    else:
        payload["e_id"] = mem.orig_eids[None][payload["e_id"]]
    return payload


class NeighborLoader(DistNeighborLoader):
    """``torch_geometric.loader.NeighborLoader``'s arguments; ``data`` may be in-memory PyG data
    (served in-process, see the module docstring) or what :class:`DistNeighborLoader` takes."""

    def __init__(self, data: Any, num_neighbors: Any, input_nodes: Any = None, **kwargs: Any) -> None:
        self._in_memory = serve_in_memory(data) if is_pyg_data(data) else None
        super().__init__(
            data if self._in_memory is None else self._in_memory.graph, num_neighbors, input_nodes, **kwargs
        )

    def _payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        return _map_back(self._in_memory, super()._payload(payload))


class LinkNeighborLoader(DistLinkNeighborLoader):
    """``torch_geometric.loader.LinkNeighborLoader``'s arguments; ``data`` may be in-memory PyG
    data (served in-process) or what :class:`DistLinkNeighborLoader` takes. Without
    ``edge_label_index`` every edge is a positive, in the served edge order."""

    def __init__(self, data: Any, num_neighbors: Any, edge_label_index: Any = None, **kwargs: Any) -> None:
        self._in_memory = serve_in_memory(data) if is_pyg_data(data) else None
        graph = data if self._in_memory is None else self._in_memory.graph
        super().__init__(graph, num_neighbors, edge_label_index, **kwargs)

    def _payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        return _map_back(self._in_memory, super()._payload(payload))
