"""The client's graph-structure queries: neighbor sampling, degrees and edge endpoints.

Each query is validation plus one ``scatter`` (by the seeds' or edges' owners) or ``broadcast``
(out-edges, which every partition may hold), merged in the caller's order. A base of
``AsyncClient``; it needs the partition book, the partitions and the tensor catalog (``prob=``
names an edge tensor).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import InvalidRequestError, OutOfRangeError
from asyncgraph.kernels.edge_queries import merge_samples
from asyncgraph.protocol.ops import Op, SampleEdgesArgs
from asyncgraph.service import Partition

from .catalog import TensorCatalog
from .scatter import broadcast, gather_rows, scatter, split_by_owner, take

__all__ = ["StructureQueries"]


class StructureQueries(TensorCatalog):
    """Sampling and structure queries over every partition (a base of ``AsyncClient``)."""

    async def sample_neighbors(
        self, seeds: Any, fanout: int, *, replace: bool = False, seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample in-edges of global ``seeds``: each owner samples its seeds, all concurrently.

        Returns global ``(src, dst, eids)``, grouped by owning partition in partition order.
        """
        gids = as_id_array(seeds, "seeds")
        parts = split_by_owner(self.book.owner(gids, "node"), self.num_partitions)
        fan, rep = int(fanout), bool(replace)
        results = await scatter(
            self.partitions, parts, Op.SAMPLE, lambda p, pos: p.sample(take(gids, pos), fan, rep, seed)
        )
        if len(results) == 1:
            return results[0][1]
        if not results:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        src, dst, eids = (np.concatenate([r[1][k] for r in results]) for k in range(3))
        return src, dst, eids

    async def sample_edges(
        self,
        seeds: Any,
        fanout: int,
        *,
        edge_dir: str = "in",
        replace: bool = False,
        seed: int | None = None,
        prob: str | None = None,
        exclude: Any = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample with options: in-edges (by the seeds' owners) or out-edges (every partition
        samples its edges from the seeds; the client merges exactly), weighted by edge tensor
        ``prob`` (without replacement: Efraimidis-Spirakis), never picking edge IDs ``exclude``.

        Returns global ``(src, dst, eids)``.
        """
        gids = as_id_array(seeds, "seeds")
        if edge_dir not in ("in", "out"):
            raise InvalidRequestError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
        if isinstance(fanout, bool) or not isinstance(fanout, int | np.integer) or int(fanout) < -1:
            raise InvalidRequestError(f"fanout must be an integer >= -1, got {fanout!r}")
        if prob is not None:
            meta = await self.tensor_meta(prob if prob.startswith("edge:") else f"edge:{prob}")
            if meta.policy != "edge" or len(meta.shape) != 1:
                raise InvalidRequestError(f"prob must name a 1-D edge tensor, got {meta.name} {meta.shape}")
        exc = as_id_array(exclude, "exclude") if exclude is not None else np.empty(0, np.int64)
        exc_parts = split_by_owner(self.book.owner(exc, "edge"), self.num_partitions)
        fan, rep = int(fanout), bool(replace)

        def args(part: Partition, ids: np.ndarray) -> SampleEdgesArgs:
            return SampleEdgesArgs(ids, fan, edge_dir, rep, seed, prob, exc[exc_parts[part.part_id]])

        if edge_dir == "in":
            parts = split_by_owner(self.book.owner(gids, "node"), self.num_partitions)
            results = [
                r
                for _, r in await scatter(
                    self.partitions,
                    parts,
                    Op.SAMPLE_EDGES,
                    lambda p, pos: p.sample_edges(args(p, take(gids, pos))),
                )
            ]
        else:
            results = await broadcast(self.partitions, lambda p: p.sample_edges(args(p, gids)))
            return merge_samples(results, gids.size, fan, rep, seed)
        if not results:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        src, dst, eids = (np.concatenate([r[k] for r in results]) for k in ("src", "dst", "eids"))
        return src, dst, eids

    async def sample_etypes(
        self, seeds: Any, etype_fanouts: Any, *, seed: int | None = None, prob: str | None = None
    ) -> dict[str, np.ndarray]:
        """In-edges of homogeneous ``seeds`` with a fanout per edge type, sampled by each seed's
        owner (the server reads each edge's type). Returns ``src``, ``dst``, ``eids`` (homogeneous)
        and each edge's ``etype`` (index into the book's canonical_etypes) and ``type_eid``."""
        gids = as_id_array(seeds, "seeds")
        fan = as_id_array(etype_fanouts, "etype_fanouts")
        if fan.size != len(self.book.canonical_etypes):
            raise InvalidRequestError(
                f"need one fanout per edge type ({len(self.book.canonical_etypes)}), got {fan.size}"
            )
        parts = split_by_owner(self.book.owner(gids, "node"), self.num_partitions)

        def call(p: Partition, pos: np.ndarray | None) -> Awaitable[dict[str, np.ndarray]]:
            return p.sample_edges(SampleEdgesArgs(take(gids, pos), -1, "in", False, seed, prob, None, fan))

        results = [r for _, r in await scatter(self.partitions, parts, Op.SAMPLE_EDGES, call)]
        keys = ("src", "dst", "eids", "etype", "type_eid")
        if not results:
            return {k: np.empty(0, np.int64) for k in keys}
        return {k: np.concatenate([r[k] for r in results]) for k in keys}

    async def degrees(self, ids: Any, edge_dir: str) -> np.ndarray:
        """In- or out-degrees (int64) of global node ``ids`` in the caller's order (None: all nodes).

        In-degrees are answered by the owners; out-degrees add up every partition's count.
        """
        if edge_dir not in ("in", "out"):
            raise InvalidRequestError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
        gids = None if ids is None else as_id_array(ids)
        if gids is not None and gids.size:
            lo, hi = int(gids.min()), int(gids.max())
            if lo < 0 or hi >= self.book.num_nodes:
                raise OutOfRangeError(f"node ID {lo if lo < 0 else hi} outside [0, {self.book.num_nodes})")
        if edge_dir == "out":
            counts = await broadcast(self.partitions, lambda p: p.degrees(gids, "out"))
            total: np.ndarray = np.stack(counts).sum(axis=0, dtype=np.int64)
            return total
        if gids is None:
            return np.concatenate(await broadcast(self.partitions, lambda p: p.degrees(None, "in")))
        parts = split_by_owner(self.book.owner(gids, "node"), self.num_partitions)
        results = await scatter(
            self.partitions, parts, Op.DEGREES, lambda p, pos: p.degrees(take(gids, pos), "in")
        )
        return gather_rows(results, gids.size, (), np.int64)

    async def find_edges(self, eids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Global int64 ``(src, dst)`` of global edge IDs, in the caller's order.

        Duplicates are allowed; an ID outside ``[0, num_edges)`` raises ``OutOfRangeError``
        before any request is sent.
        """
        gids = as_id_array(eids, "eids")
        parts = split_by_owner(self.book.owner(gids, "edge"), self.num_partitions)
        results = await scatter(
            self.partitions, parts, Op.FIND_EDGES, lambda p, pos: p.find_edges(take(gids, pos))
        )
        src = gather_rows([(pos, r[0]) for pos, r in results], gids.size, (), np.int64)
        dst = gather_rows([(pos, r[1]) for pos, r in results], gids.size, (), np.int64)
        return src, dst
