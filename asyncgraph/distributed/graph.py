"""``DistGraph``: the user's view of a partitioned graph, DGL-like."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch

from asyncgraph.client.sync_client import Client
from asyncgraph.errors import InvalidRequestError, UnknownTensorError
from asyncgraph.names import is_state_key, tensor_prefix
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.store import PartitionStore

from .context import get_client
from .tensor import DistTensor


class TensorView(MutableMapping[str, DistTensor]):
    """``g.ndata`` / ``g.edata``: name -> DistTensor for one partition policy."""

    def __init__(self, client: Client, policy: str) -> None:
        self._client = client
        self._policy = policy
        self._prefix = tensor_prefix(policy)
        self._aliases: dict[str, DistTensor] = {}

    def _names(self) -> list[str]:
        """User tensors of this policy; optimizer state (``name#state``) stays hidden."""
        metas = self._client.refresh_tensors()
        names = [
            m.name[len(self._prefix) :]
            for m in metas
            if m.name.startswith(self._prefix) and not is_state_key(m.name)
        ]
        return sorted(set(names) | set(self._aliases))

    def __getitem__(self, name: str) -> DistTensor:
        if name in self._aliases:
            return self._aliases[name]
        key = self._prefix + name
        meta = self._client.aio.cached_meta(key)
        if meta is None:
            self._client.refresh_tensors()
            meta = self._client.aio.cached_meta(key)
        if meta is None:
            raise UnknownTensorError(f"no {self._policy} tensor {name!r}; known: {self._names()}")
        return DistTensor._attach(self._client, meta)

    def __setitem__(self, name: str, tensor: DistTensor) -> None:
        if not isinstance(tensor, DistTensor):
            raise InvalidRequestError(
                f"only a DistTensor can be added to {self._policy} data, got {type(tensor).__name__}"
            )
        if tensor.policy != self._policy:
            raise InvalidRequestError(f"{tensor!r} is sharded by {tensor.policy}s, not {self._policy}s")
        if name != tensor.name:
            self._aliases[name] = tensor

    def __delitem__(self, name: str) -> None:
        if name in self._aliases:
            del self._aliases[name]
            return
        self[name].delete()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._names()


class DistGraph:
    """A partitioned graph served by asyncgraph servers, or held in-process when standalone."""

    def __init__(
        self, graph_name: str, part_config: str | Path | None = None, *, client: Client | None = None
    ) -> None:
        self._client = client if client is not None else get_client(graph_name, part_config)
        if self._client.graph_name != graph_name:
            raise InvalidRequestError(
                f"the servers hold graph {self._client.graph_name!r}, not {graph_name!r}"
            )
        self.graph_name = graph_name
        self.ndata = TensorView(self._client, "node")
        self.edata = TensorView(self._client, "edge")

    @property
    def client(self) -> Client:
        return self._client

    def num_nodes(self) -> int:
        return self._client.book.num_nodes

    def num_edges(self) -> int:
        return self._client.book.num_edges

    def number_of_nodes(self) -> int:
        return self.num_nodes()

    def number_of_edges(self) -> int:
        return self.num_edges()

    def get_partition_book(self) -> RangePartitionBook:
        return self._client.book

    @property
    def local_partition(self) -> PartitionStore | None:
        """The store of a partition this process reads through shared memory (or in-process)."""
        for part in self._client.aio.partitions:
            if part.store is not None:
                return part.store
        return None

    @property
    def local_partition_ids(self) -> list[int]:
        return self._client.aio.local_partitions()

    def sample_neighbors(
        self, seeds: Any, fanout: int, *, replace: bool = False, seed: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Global ``(src, dst, eid)`` of sampled in-edges, as ``asyncgraph.sample_neighbors`` returns."""
        src, dst, eids = self._client.sample_neighbors(seeds, fanout, replace=replace, seed=seed)
        return torch.from_numpy(src), torch.from_numpy(dst), torch.from_numpy(eids)

    def barrier(self, name: str = "default", timeout: float = 300.0) -> None:
        self._client.barrier(name, timeout)

    def find_edges(self, eids: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Global int64 ``(src, dst)`` endpoints of edge IDs ``eids`` (DGL's ``find_edges``)."""
        src, dst = self._client.find_edges(eids)
        return torch.from_numpy(src), torch.from_numpy(dst)

    def __repr__(self) -> str:
        mode = "standalone" if self._client.is_standalone else "distributed"
        return (
            f"DistGraph({self.graph_name!r}, num_nodes={self.num_nodes()}, num_edges={self.num_edges()}, "
            f"num_parts={self._client.book.num_partitions()}, {mode})"
        )
