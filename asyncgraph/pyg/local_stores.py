"""PyG's ``LocalFeatureStore`` / ``LocalGraphStore`` as PyG's distributed scripts use them.

``LocalGraphStore.from_partition(root_dir, node_rank)`` and ``LocalFeatureStore.from_partition``
name one partition of a graph partitioned by asyncgraph (``root_dir`` holds its config, e.g.
``<dataset>-partitions/<dataset>.json`` as ``python -m asyncgraph.pyg.partition_dataset``
writes it; the config file itself may be given too). Nothing is read but the config: ``meta``
describes the graph as PyG's ``META.json`` does (``num_parts``, ``node_types``, ``edge_types``,
``is_hetero``, ``is_sorted``). The pair becomes a :class:`DistFeatureStore` /
:class:`DistGraphStore` over the whole graph when a ``DistNeighborLoader`` (or
``DistLinkNeighborLoader``) is given it with ``current_ctx=``, ``master_addr=`` and
``master_port=``: that loader serves this node's partition and connects to the others'
(``dist_context.py``). ``feature.labels = tensor`` (every node's label, in the partitioned
graph's node IDs; the seed type's on a heterogeneous graph) makes batches' ``y`` those rows,
as PyG's distributed loaders do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from torch_geometric.data import FeatureStore, GraphStore

from asyncgraph.client.sync_client import Client
from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition import load_partition_book

from .dist_context import PartitionRef
from .feature_store import DistFeatureStore
from .graph_store import DistGraphStore

__all__ = ["LocalFeatureStore", "LocalGraphStore", "bind_partition_data", "partition_ref"]

_S = TypeVar("_S", bound="_FromPartition")


def _config_in(root_dir: str | os.PathLike[str]) -> Path:
    """The partition config: ``root_dir`` itself (a ``.json``) or the one config inside it."""
    path = Path(root_dir)
    if path.is_file():
        return path
    found = sorted(p for p in path.glob("*.json") if p.name != "META.json") if path.is_dir() else []
    if len(found) != 1:
        what = "no partition config (*.json)" if not found else f"several configs {[p.name for p in found]}"
        raise InvalidRequestError(
            f"from_partition({str(root_dir)!r}): {what}; partition with python -m "
            "asyncgraph.pyg.partition_dataset or python -m asyncgraph.partition, or pass the config file"
        )
    return found[0]


class _FromPartition:
    """What both stores share: the partition named by ``from_partition`` and PyG's ``meta``."""

    partition: PartitionRef | None = None
    meta: dict[str, Any] | None = None
    num_partitions: int = 1
    partition_idx: int = 0
    _bound: bool = False

    @classmethod
    def from_partition(cls: type[_S], root_dir: str | os.PathLike[str], pid: int) -> _S:
        """PyG's constructor: partition ``pid`` of the graph partitioned under ``root_dir``."""
        config = _config_in(root_dir)
        book, name, _, _ = load_partition_book(config, pid)
        store = cls.__new__(cls)
        store._init_unbound()
        store.partition = PartitionRef(config.resolve(), int(pid), int(book.num_partitions()), name)
        store.num_partitions, store.partition_idx = int(book.num_partitions()), int(pid)
        store.meta = {
            "num_parts": int(book.num_partitions()),
            "node_types": list(book.ntypes) if book.is_hetero else None,
            "edge_types": [list(c) for c in book.canonical_etypes] if book.is_hetero else None,
            "is_hetero": bool(book.is_hetero),
            "is_sorted": True,  # in-edges are stored by destination (CSC)
        }
        return store

    def _init_unbound(self) -> None:
        raise NotImplementedError

    @property
    def client(self) -> Client:
        if not self._bound:
            raise InvalidRequestError(
                f"{type(self).__name__}.from_partition() stores are connected by the first "
                "DistNeighborLoader given them (with current_ctx=, master_addr=, master_port=)"
            )
        return super().client  # type: ignore[misc,no-any-return]


class LocalFeatureStore(_FromPartition, DistFeatureStore):
    """PyG's ``LocalFeatureStore``; a :class:`DistFeatureStore` once a loader connects it."""

    labels: Any = None

    def _init_unbound(self) -> None:
        FeatureStore.__init__(self)
        self.labels = None

    def bind(self, g: Any) -> None:
        """Serve from ``g`` (the loader calls this after connecting)."""
        self._bound = True
        DistFeatureStore.__init__(self, g)


class LocalGraphStore(_FromPartition, DistGraphStore):
    """PyG's ``LocalGraphStore``; a :class:`DistGraphStore` once a loader connects it."""

    def _init_unbound(self) -> None:
        GraphStore.__init__(self)

    def bind(self, g: Any) -> None:
        """Serve from ``g`` (the loader calls this after connecting)."""
        self._bound = True
        DistGraphStore.__init__(self, g)


def partition_ref(data: Any) -> PartitionRef | None:
    """The partition of a ``(LocalFeatureStore, LocalGraphStore)`` pair not yet connected, else None."""
    if not isinstance(data, tuple) or len(data) != 2:
        return None
    refs = [s.partition for s in data if isinstance(s, _FromPartition) and not s._bound]
    if not refs:
        return None
    if any(r != refs[0] for r in refs):
        raise InvalidRequestError(f"the feature and graph stores name different partitions: {refs}")
    return refs[0]


def bind_partition_data(data: Any, kwargs: dict[str, Any]) -> None:
    """Connect a ``from_partition`` pair (``dist_context.connect_partitions`` with the loader's
    ``current_ctx``, ``master_addr`` and ``master_port``) and bind both stores."""
    ref = partition_ref(data)
    if ref is None:
        return
    from asyncgraph.distributed import DistGraph

    from .dist_context import connect_partitions

    connect_partitions(ref, kwargs.get("current_ctx"), kwargs.get("master_addr"), kwargs.get("master_port"))
    g = DistGraph(ref.graph_name)
    for store in data:
        if isinstance(store, _FromPartition) and not store._bound:
            store.bind(g)  # type: ignore[attr-defined]
