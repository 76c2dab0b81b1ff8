"""Small graph-like results of ``DistGraph`` queries, and DGL-style partition policies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import as_id_array
from asyncgraph.names import DEFAULT_NTYPE, DEFAULT_RELATION
from asyncgraph.partition.book import RangePartitionBook

__all__ = ["ALL", "EID", "NID", "EdgePartitionPolicy", "NodePartitionPolicy", "SampledSubgraph"]

#: DGL's names of the original-ID fields (``dgl.NID`` / ``dgl.EID``).
NID = "_ID"
EID = "_ID"
#: DGL's "every node" marker (``dgl.ALL``).
ALL = slice(None)


class SampledSubgraph:
    """Edges ``src -> dst`` with their global edge IDs in ``edata[EID]``, DGL-graph-like.

    Without relabelling (sampling, ``in_subgraph``) the endpoints are global node IDs and the
    graph has all ``num_nodes`` nodes; relabelled (``edge_subgraph``) they index ``ndata[NID]``,
    the global IDs of the subgraph's nodes. It unpacks as the tuple ``(src, dst, eids)`` that
    ``sample_neighbors`` used to return (``to_tuple()`` gives it too).
    """

    def __init__(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        eids: np.ndarray,
        num_nodes: int,
        nids: np.ndarray | None = None,
    ) -> None:
        self._src = torch.from_numpy(np.ascontiguousarray(src, dtype=np.int64))
        self._dst = torch.from_numpy(np.ascontiguousarray(dst, dtype=np.int64))
        self._eids = torch.from_numpy(np.ascontiguousarray(eids, dtype=np.int64))
        self._num_nodes = int(num_nodes)
        self._nids = None if nids is None else torch.from_numpy(np.ascontiguousarray(nids, dtype=np.int64))
        self.edata: dict[str, torch.Tensor] = {EID: self._eids}

    @property
    def ndata(self) -> dict[str, torch.Tensor]:
        """``{NID: global node IDs}`` (``arange(num_nodes)`` when not relabelled)."""
        nids = self._nids if self._nids is not None else torch.arange(self._num_nodes)
        return {NID: nids}

    @property
    def idtype(self) -> torch.dtype:
        return torch.int64

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def edges(self, form: str = "uv") -> tuple[torch.Tensor, ...]:
        """``(src, dst)``; ``form="all"`` adds the edge IDs, ``form="eid"`` gives them alone."""
        if form == "uv":
            return self._src, self._dst
        if form == "all":
            return self._src, self._dst, self._eids
        if form == "eid":
            return (self._eids,)
        from asyncgraph.errors import InvalidRequestError

        raise InvalidRequestError(f"form must be 'uv', 'all' or 'eid', got {form!r}")

    def num_edges(self) -> int:
        return int(self._eids.numel())

    def num_nodes(self) -> int:
        return self._num_nodes

    number_of_edges = num_edges
    number_of_nodes = num_nodes

    def to_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._src, self._dst, self._eids

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.to_tuple())

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.to_tuple()[index]

    def __repr__(self) -> str:
        return f"SampledSubgraph(num_nodes={self._num_nodes}, num_edges={self.num_edges()})"


def relabel(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global endpoints -> (sorted unique global node IDs, local src, local dst)."""
    nids, inverse = np.unique(np.concatenate([src, dst]), return_inverse=True)
    return nids, inverse[: src.size], inverse[src.size :]


class _PartitionPolicy:
    """Maps global IDs of one kind to partitions and local IDs (DGL's ``PartitionPolicy``)."""

    kind = ""

    def __init__(
        self, book: RangePartitionBook, part_id: int, ntype: str | None = None, etype: Any = None
    ) -> None:
        self.partition_book = book
        self.part_id = part_id
        # policies of a heterogeneous graph name their type: tensors made with one hold that
        # type's rows and take its per-type IDs (DGL's "node~<ntype>" / "edge~<etype>" policies)
        self.ntype = ntype if book.is_hetero else None
        self.etype: tuple[str, str, str] | None = (
            book.canonical_etypes[book.etype_id(etype)] if book.is_hetero and etype is not None else None
        )

    @property
    def policy_str(self) -> str:
        return f"{self.kind}:_{'N' if self.kind == 'node' else 'E'}"

    @property
    def type_name(self) -> str:
        return DEFAULT_NTYPE if self.kind == "node" else DEFAULT_RELATION

    def to_partid(self, ids: Any) -> torch.Tensor:
        return torch.from_numpy(self.partition_book.owner(as_id_array(ids), self.kind))

    def to_local(self, ids: Any) -> torch.Tensor:
        book, gids = self.partition_book, as_id_array(ids)
        local = (
            book.nid2localnid(gids, self.part_id)
            if self.kind == "node"
            else book.eid2localeid(gids, self.part_id)
        )
        return torch.from_numpy(local)

    def get_part_size(self) -> int:
        lo, hi = (
            self.partition_book.node_range(self.part_id)
            if self.kind == "node"
            else (self.partition_book.edge_range(self.part_id))
        )
        return hi - lo

    def get_size(self) -> int:
        book = self.partition_book
        return book.num_nodes if self.kind == "node" else book.num_edges

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.policy_str!r}, part_id={self.part_id})"


class NodePartitionPolicy(_PartitionPolicy):
    kind = "node"


class EdgePartitionPolicy(_PartitionPolicy):
    kind = "edge"
