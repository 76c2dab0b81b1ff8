"""The client's graph-structure queries: neighbor sampling, degrees and edge endpoints.

Each query is validation plus one ``scatter`` (by the seeds' or edges' owners) or ``broadcast``
(out-edges, which every partition may hold), merged in the caller's order. A part of
``AsyncClient``; it reads the client's state (book, partitions, feature caches) and asks the
tensor catalog for metadata (``features``, ``prob=``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array, unique_sorted
from asyncgraph.errors import InvalidRequestError, OutOfRangeError
from asyncgraph.kernels.edge_queries import merge_samples
from asyncgraph.names import edge_key, typed_name
from asyncgraph.protocol.ops import Op, SampleEdgesArgs
from asyncgraph.service import Partition
from asyncgraph.service.base import SampledRows

from .cache import meta_row_bytes
from .catalog import TensorCatalog
from .edge_routing import edge_positions, node_positions
from .scatter import broadcast, gather_rows, scatter, take
from .state import ClientState
from .traffic import Traffic, count_remote

__all__ = ["StructureQueries"]


class StructureQueries:
    """Sampling and structure queries over every partition (a part of ``AsyncClient``)."""

    def __init__(self, state: ClientState, catalog: TensorCatalog) -> None:
        self.state = state
        self.catalog = catalog

    async def sample_neighbors(
        self,
        seeds: Any,
        fanout: int,
        *,
        replace: bool = False,
        seed: int | None = None,
        traffic: Traffic | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample in-edges of global ``seeds``: each owner samples its seeds, all concurrently.

        Returns global ``(src, dst, eids)``, grouped by owning partition in partition order.
        ``traffic`` (optional) counts the requests sent over a socket.
        """
        gids = as_id_array(seeds, "seeds")
        parts = node_positions(self.state.book, gids)  # added nodes too (issue 35)
        if traffic is not None:
            count_remote(self.state.partitions, parts, Op.SAMPLE, traffic)
        fan, rep = int(fanout), bool(replace)
        results = await scatter(
            self.state.partitions, parts, Op.SAMPLE, lambda p, pos: p.sample(take(gids, pos), fan, rep, seed)
        )
        if len(results) == 1:
            return results[0][1]
        if not results:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        src, dst, eids = (np.concatenate([r[1][k] for r in results]) for k in range(3))
        return src, dst, eids

    async def sample_with_features(
        self,
        seeds: Any,
        fanout: int,
        features: Sequence[str],
        *,
        replace: bool = False,
        seed: int | None = None,
        traffic: Traffic | None = None,
    ) -> SampledRows:
        """``sample_neighbors`` whose answers also carry the rows of ``features`` (tensor keys) of
        the sampled nodes each owner holds (its seeds and the sources in its range).

        ``ids`` (sorted) and ``rows[k]`` cover those nodes of every owner together; the rows are
        what ``pull_numpy`` would return (caches are not consulted). When some owners are held in
        this process, they sample first and the sources they sample that a remote owner holds are
        added to that owner's request, so its answer carries their rows too (except rows every
        named tensor's feature cache holds: those are read here by the pull that follows). An
        owner may carry fewer rows than that (a server carries none when they would not fit one
        reply): callers pull whatever ``ids`` lacks. ``traffic`` counts the requests, and the
        rows and bytes that crossed a socket.
        """
        gids = as_id_array(seeds, "seeds")
        names = list(features)
        metas = [await self.catalog.tensor_meta(name) for name in names]
        for meta in metas:
            if meta.policy != "node":
                raise InvalidRequestError(f"sample_with_features: {meta.name!r} is not a node tensor")
        parts = node_positions(self.state.book, gids)  # added nodes too (issue 35)
        fan, rep = int(fanout), bool(replace)
        if traffic is not None:
            count_remote(self.state.partitions, parts, Op.SAMPLE, traffic)
        owners = [i for i, pos in enumerate(parts) if pos.size]
        local = [i for i in owners if self.state.partitions[i].runs_here(Op.SAMPLE)]
        results: list[tuple[np.ndarray | None, SampledRows]]
        if local and len(local) < len(owners):
            # sample here first: the sources we sample that a remote owner holds ride in its answer
            done: dict[int, SampledRows] = {}
            for i in local:
                done[i] = await self.state.partitions[i].sample_with_features(
                    gids[parts[i]], fan, rep, seed, names
                )
            extra = self._carry_requests(owners, done, names)
            todo = [pos if i not in done else pos[:0] for i, pos in enumerate(parts)]
            answered = await scatter(
                self.state.partitions,
                todo,
                Op.SAMPLE,
                lambda p, _: p.sample_with_features(
                    gids[parts[p.part_id]], fan, rep, seed, names, extra[p.part_id]
                ),
            )
            remote = [i for i in owners if i not in done]
            for i, (_, r) in zip(remote, answered, strict=True):
                done[i] = r
            results = [(parts[i], done[i]) for i in owners]
        else:
            results = await scatter(
                self.state.partitions,
                parts,
                Op.SAMPLE,
                lambda p, pos: p.sample_with_features(take(gids, pos), fan, rep, seed, names),
            )
        if traffic is not None:  # results are in partition order
            row_bytes = sum(meta_row_bytes(m) for m in metas)
            for i, (_, r) in zip(owners, results, strict=True):
                if not self.state.partitions[i].runs_here(Op.SAMPLE):
                    traffic.remote_rows += int(r.ids.size)
                    traffic.remote_bytes += int(r.ids.size) * row_bytes
        if len(results) == 1:
            return results[0][1]
        if not results:
            empty = np.empty(0, np.int64)
            rows = [np.empty((0, *m.row_shape), m.dtype) for m in metas]
            return SampledRows(empty, empty, empty, empty, rows)
        src, dst, eids, ids = (np.concatenate([r[1][k] for r in results]) for k in range(4))
        order = np.argsort(ids, kind="stable")
        rows = [np.concatenate([r[1].rows[k] for r in results])[order] for k in range(len(names))]
        return SampledRows(src, dst, eids, ids[order], rows)

    def _carry_requests(
        self, owners: list[int], done: dict[int, SampledRows], names: list[str]
    ) -> dict[int, np.ndarray]:
        """For each owner not in ``done``: the sources sampled in ``done`` that it holds, less
        those every named tensor's feature cache holds (the pull that follows reads them here)."""
        src_here = np.concatenate([r.src for r in done.values()])
        owner_here = self.state.book.owner(src_here, "node")
        caches = [self.state.caches.get(name) for name in names]
        extra: dict[int, np.ndarray] = {}
        for i in owners:
            if i in done:
                continue
            ids_i = unique_sorted(src_here[owner_here == i])
            if ids_i.size and all(c is not None for c in caches):
                cached = np.ones(ids_i.size, dtype=bool)
                for c in caches:
                    assert c is not None
                    cached &= c.lookup(ids_i)[0]
                ids_i = ids_i[~cached]
            extra[i] = ids_i
        return extra

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
            meta = await self.catalog.tensor_meta(edge_key(prob))
            if meta.policy != "edge" or len(meta.shape) != 1:
                raise InvalidRequestError(f"prob must name a 1-D edge tensor, got {meta.name} {meta.shape}")
        exc = as_id_array(exclude, "exclude") if exclude is not None else np.empty(0, np.int64)
        exc_parts = edge_positions(self.state.book, exc)  # new edge IDs too (issue 35)
        fan, rep = int(fanout), bool(replace)

        def args(part: Partition, ids: np.ndarray) -> SampleEdgesArgs:
            return SampleEdgesArgs(ids, fan, edge_dir, rep, seed, prob, exc[exc_parts[part.part_id]])

        if edge_dir == "out" and gids.size and int(gids.max()) >= self.state.book.num_nodes:
            await self.degrees(gids, "out")  # added seeds: their owners say they exist
        if edge_dir == "in":
            parts = node_positions(self.state.book, gids)
            results = [
                r
                for _, r in await scatter(
                    self.state.partitions,
                    parts,
                    Op.SAMPLE_EDGES,
                    lambda p, pos: p.sample_edges(args(p, take(gids, pos))),
                )
            ]
        else:
            results = await broadcast(self.state.partitions, lambda p: p.sample_edges(args(p, gids)))
            return merge_samples(results, gids.size, fan, rep, seed)
        if not results:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        src, dst, eids = (np.concatenate([r[k] for r in results]) for k in ("src", "dst", "eids"))
        return src, dst, eids

    def _typed_probs(self, prob: Any) -> Any:
        """``prob`` with names of per-type tensors (``"w"`` stored as ``"src:rel:dst/w"``)
        resolved per edge type: a name becomes each type's own tensor, None for the types
        without one (uniform, as DGL samples them); other names are kept."""
        book = self.state.book
        if not book.is_hetero or prob is None:
            return prob
        names = [prob] * len(book.canonical_etypes) if isinstance(prob, str) else list(prob)
        if isinstance(prob, str) and self.catalog.cached_meta(edge_key(prob)) is not None:
            return prob
        out: list[Any] = []
        for c, name in zip(book.canonical_etypes, names, strict=False):
            typed = None if not isinstance(name, str) else typed_name(":".join(c), name)
            if typed is not None and self.catalog.cached_meta(edge_key(typed)) is not None:
                out.append(typed)
            else:
                out.append(None if isinstance(prob, str) else name)
        if isinstance(prob, str) and all(n is None for n in out):
            return prob  # no type has it: the server names the missing tensor
        return out if len(names) == len(book.canonical_etypes) else prob

    async def sample_etypes(
        self,
        seeds: Any,
        etype_fanouts: Any,
        *,
        seed: int | None = None,
        prob: str | Sequence[str | None] | None = None,
        exclude: Any = None,
    ) -> dict[str, np.ndarray]:
        """In-edges of homogeneous ``seeds`` with a fanout per edge type, sampled by each seed's
        owner (the server reads each edge's type), weighted by edge tensor ``prob`` (or a list:
        one tensor per edge type, DGL's per-type ``prob``; None: uniform), never
        picking homogeneous edge IDs ``exclude``. Returns ``src``, ``dst``, ``eids`` (homogeneous)
        and each edge's ``etype`` (index into the book's canonical_etypes) and ``type_eid``."""
        gids = as_id_array(seeds, "seeds")
        exc = as_id_array(exclude, "exclude") if exclude is not None else None
        prob = self._typed_probs(prob)
        one = prob if isinstance(prob, str) or prob is None else None
        per_type = None if isinstance(prob, str) or prob is None else list(prob)
        if per_type is not None and len(per_type) != len(self.state.book.canonical_etypes):
            raise InvalidRequestError(
                f"need one prob per edge type ({len(self.state.book.canonical_etypes)}), got {len(per_type)}"
            )
        fan = as_id_array(etype_fanouts, "etype_fanouts")
        if fan.size != len(self.state.book.canonical_etypes):
            raise InvalidRequestError(
                f"need one fanout per edge type ({len(self.state.book.canonical_etypes)}), got {fan.size}"
            )
        parts = node_positions(self.state.book, gids)  # added nodes too (issue 35)

        book = self.state.book

        def call(p: Partition, pos: np.ndarray | None) -> Awaitable[dict[str, np.ndarray]]:
            mine = exc
            if exc is not None:  # in-edges of a partition's seeds are its own edges: send only those
                lo, hi = book.edge_range(p.part_id)
                mine = exc[(exc >= lo) & (exc < hi)]
            args = SampleEdgesArgs(take(gids, pos), -1, "in", False, seed, one, mine, fan, per_type)
            return p.sample_edges(args)

        results = [r for _, r in await scatter(self.state.partitions, parts, Op.SAMPLE_EDGES, call)]
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
            if lo < 0:
                raise OutOfRangeError(f"node ID {lo} outside [0, {self.state.book.num_nodes})")
            if hi >= self.state.book.num_nodes and edge_dir == "out":
                # added nodes (issue 35): their owners say they exist, every partition counts
                await self.degrees(np.unique(gids[gids >= self.state.book.num_nodes]), "in")
        if edge_dir == "out":
            counts = await broadcast(self.state.partitions, lambda p: p.degrees(gids, "out"))
            total: np.ndarray = np.stack(counts).sum(axis=0, dtype=np.int64)
            return total
        if gids is None:
            return np.concatenate(await broadcast(self.state.partitions, lambda p: p.degrees(None, "in")))
        parts = node_positions(self.state.book, gids)  # added nodes: their owner checks them
        results = await scatter(
            self.state.partitions, parts, Op.DEGREES, lambda p, pos: p.degrees(take(gids, pos), "in")
        )
        return gather_rows(results, gids.size, (), np.int64)

    async def added_nodes(self) -> np.ndarray | None:
        """Every node added to a live graph (issue 35), sorted by partition then slot: each
        owner's ``info`` counts them. None when no partition was updated."""
        infos = await broadcast(self.state.partitions, lambda p: p.info())
        if not any(info.live for info in infos):
            return None
        book = self.state.book
        parts = book.num_partitions()
        added = [book.num_nodes + i.part_id + parts * np.arange(i.added_nodes, dtype=np.int64) for i in infos]
        return np.concatenate([np.empty(0, np.int64), *added])

    async def live_edges(self, chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Every live edge as global ``(src, dst, eids)`` in edge-ID order, read as the full
        in-neighbourhood of every node (base and ``added_nodes``), ``chunk`` seeds a request;
        None when no partition was updated (the base's edge IDs are then a range:
        ``find_edges`` over it answers)."""
        added = await self.added_nodes()
        if added is None:
            return None
        seeds = np.concatenate([np.arange(self.state.book.num_nodes, dtype=np.int64), added])
        got = [await self.sample_neighbors(seeds[lo : lo + chunk], -1) for lo in range(0, seeds.size, chunk)]
        src, dst, eids = (np.concatenate([g[k] for g in got]) for k in range(3))
        order = np.argsort(eids, kind="stable")
        return src[order], dst[order], eids[order]

    async def find_edges(self, eids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Global int64 ``(src, dst)`` of global edge IDs, in the caller's order.

        Duplicates are allowed; a negative ID raises ``OutOfRangeError`` before any request is
        sent, an ID that names no live edge (never added, or removed) ``UnknownEdgeError``.
        """
        gids = as_id_array(eids, "eids")
        parts = edge_positions(self.state.book, gids)
        results = await scatter(
            self.state.partitions, parts, Op.FIND_EDGES, lambda p, pos: p.find_edges(take(gids, pos))
        )
        src = gather_rows([(pos, r[0]) for pos, r in results], gids.size, (), np.int64)
        dst = gather_rows([(pos, r[1]) for pos, r in results], gids.size, (), np.int64)
        return src, dst
