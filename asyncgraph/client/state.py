"""What the parts of one client share: the graph, its partitions and connections, the tensor
metadata it has seen and its feature caches.

``AsyncClient`` is composed of small parts (``TensorCatalog``, ``TensorReads``, ``TensorWrites``,
``StructureQueries``) that each hold this one ``ClientState`` rather than inheriting each other's
attributes, so what a part reads and changes is spelled out in one place.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from asyncgraph.net.connection import Connection
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.service.base import Partition
from asyncgraph.storage.store import TensorMeta

from .cache import FeatureCache

__all__ = ["ClientState"]


@dataclass
class ClientState:
    """One client's shared state (see the module docstring)."""

    graph_name: str
    book: RangePartitionBook
    #: One ``Partition`` per partition ID, in order: remote, local, or replicated.
    partitions: list[Partition]
    #: The connections behind the partitions (empty when standalone).
    connections: list[Connection]
    call_timeout: float
    num_clients: int = 1
    #: Who holds this client's references to non-persistent tensors on the servers.
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: Whether this client took a reference (a non-persistent tensor) not yet released.
    holding: bool = False
    #: Tensor metadata by name, so reads and writes validate without a round trip.
    metas: dict[str, TensorMeta] = field(default_factory=dict)
    #: Per-tensor feature caches (``TensorReads.build_cache``), dropped on this client's writes.
    caches: dict[str, FeatureCache] = field(default_factory=dict)
    #: How this client was made (``connect``'s servers and options, or ``standalone``'s
    #: partition config), so a loader's worker processes can open their own client alike.
    #: Holds the secret: kept in memory, handed to workers over a socketpair only.
    origin: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.book.grows = True  # a live graph's added IDs map by arithmetic (partition/added_ids.py)

    @property
    def num_partitions(self) -> int:
        return self.book.num_partitions()

    def forget_cache(self, name: str) -> None:
        """Drop the feature cache of ``name``: this client is about to change the tensor."""
        self.caches.pop(name, None)
