"""The interface of one partition, whether held in this process or reached over a connection."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from asyncgraph.protocol.info import ServerInfo
from asyncgraph.protocol.ops import Op, SampleEdgesArgs
from asyncgraph.storage.store import PartitionStore, TensorMeta


class SampledRows(NamedTuple):
    """A sample's global ``(src, dst, eids)`` and, for each requested feature, the rows
    (``rows[k]``) of the sampled nodes the answering partition owns (``ids``, sorted)."""

    src: np.ndarray
    dst: np.ndarray
    eids: np.ndarray
    ids: np.ndarray
    rows: list[np.ndarray]


class Partition(Protocol):
    """What the client can ask of one partition; every method validates before it changes anything."""

    part_id: int

    @property
    def name(self) -> str:
        """Who serves it, for messages (a server address, or ``local partition 0``)."""
        ...

    @property
    def store(self) -> PartitionStore | None:
        """The in-process store, if the partition's memory is mapped here."""
        ...

    @property
    def closed(self) -> bool: ...

    def runs_here(self, op: Op) -> bool:
        """Whether ``op`` runs in this process (no round trip): such calls are awaited inline."""
        ...

    async def pull(
        self,
        name: str,
        ids: np.ndarray,
        row_bytes: int = 0,
        *,
        out: np.ndarray | None = None,
        where: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows ``ids``; ``row_bytes`` (one row's size, if known) lets a remote partition split
        a large pull into pipelined chunks. With ``out`` the rows are written to ``out[where]``
        (``where`` None: ``out[:len(ids)]``) and ``out`` is returned: a remote partition copies
        each chunk there as it arrives instead of the caller assembling the rows afterwards."""
        ...

    async def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str) -> None: ...

    async def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    async def sample_with_features(
        self,
        seeds: np.ndarray,
        fanout: int,
        replace: bool,
        seed: int | None,
        features: Sequence[str],
        extra: np.ndarray | None = None,
    ) -> SampledRows: ...

    async def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    async def add_edges(
        self, src: np.ndarray, dst: np.ndarray, data: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """Append edges ``src -> dst`` (every ``dst`` owned here) with rows ``data`` of edge
        tensors: their new global edge IDs."""
        ...

    async def compact(self) -> dict[str, float]:
        """Fold this partition's live overlay into a new CSC; what it did."""
        ...

    async def remove_edges(self, eids: np.ndarray) -> None:
        """Remove the live edges ``eids`` owned here."""
        ...

    async def add_nodes(self, num: int, data: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Add ``num`` nodes owned here with rows ``data`` of node tensors: their new global IDs."""
        ...

    async def degrees(self, ids: np.ndarray | None, edge_dir: str) -> np.ndarray:
        """In-degrees of owned ``ids``, or this partition's out-edge counts of ``ids`` (None: all)."""
        ...

    async def sample_edges(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        """``asyncgraph.kernels.edge_queries.sample_edges`` on this partition."""
        ...

    async def sparse_update(
        self, name: str, ids: np.ndarray, grads: np.ndarray, spec: Mapping[str, Any]
    ) -> None: ...

    async def create_tensor(
        self,
        name: str,
        policy: str,
        shape: list[int],
        dtype: str,
        init: dict[str, Any] | None,
        holder: str | None = None,
    ) -> tuple[TensorMeta, bool]:
        """The tensor's meta and whether this call created it on this partition (``holder``:
        non-persistent, reference counted by holder)."""
        ...

    async def delete_tensor(self, name: str) -> None: ...

    async def release_tensors(self, holder: str, names: list[str], every: bool = False) -> list[str]:
        """Drop ``holder``'s references to non-persistent tensors; returns the names deleted."""
        ...

    async def list_tensors(self) -> list[TensorMeta]: ...

    async def info(self) -> ServerInfo: ...

    def close(self) -> None: ...
