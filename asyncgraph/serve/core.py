"""One batch of online inference: the loaders' own sample-and-pull for the batch's nodes, then the
model's forward pass under ``no_grad`` on a one-thread executor.

The seeds are the batch's distinct node IDs, sorted, and every batch samples with the same
``batch_seed``: a request answered alone gets the same answer every time, equal to the model
applied offline to ``sample_and_pull(..., batch_seed=seed)`` of the same nodes; with fanouts -1
(every in-edge) it equals ``layerwise_inference``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.dataloading.fetch import sample_and_pull
from asyncgraph.dataloading.hetero_block import typed_node_keys
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownTensorError,
    UnknownTypeError,
)
from asyncgraph.names import node_key

__all__ = ["BatchTimes", "InferenceCore"]


@dataclass
class BatchTimes:
    """Seconds one batch spent sampling, pulling features and in the forward pass, and what its
    pulls cost (rows read from other hosts' servers, hits of the feature cache)."""

    sample: float = 0.0
    pull: float = 0.0
    forward: float = 0.0
    remote_rows: int = 0
    cache_hits: int = 0


def _ids(nodes: Any, what: str, limit: int | None) -> np.ndarray:
    """``nodes`` as 1-D int64 IDs in ``[0, limit)`` (``limit`` None: any ID >= 0, a live graph's
    added nodes above the base; ``added_exist`` asks their owners), else a typed error naming
    the first bad one."""
    arr = np.asarray(nodes)
    if arr.dtype.kind not in "iu":
        raise DTypeMismatchError(f"{what} must be integers, got {arr.dtype}")
    if arr.ndim != 1:
        raise ShapeMismatchError(f"{what} must be 1-D, got shape {list(arr.shape)}")
    ids = arr.astype(np.int64, copy=False)
    if ids.size:
        bad = ids[(ids < 0) | (ids >= limit)] if limit is not None else ids[ids < 0]
        if bad.size:
            raise OutOfRangeError(
                f"unknown node ID {int(bad[0])} ({what}): "
                + (f"the graph has 0..{limit - 1}" if limit is not None else "IDs are >= 0")
                + (f" ({bad.size} IDs out of range)" if bad.size > 1 else "")
            )
    return ids


class InferenceCore:
    """Answers ``model(blocks(nodes))`` for batches of node IDs over a connected ``AsyncClient``."""

    def __init__(
        self,
        aio: AsyncClient,
        model: nn.Module,
        fanouts: Sequence[int],
        *,
        feat: str = "feat",
        device: str | torch.device = "cpu",
        seed: int = 0,
        carry_features: bool | None = None,
        inline_rows: int = 0,
    ) -> None:
        self.async_client = aio
        self.model = model.eval()
        self.sampler = NeighborSampler(list(fanouts))
        self.feat = feat
        self.device = torch.device(device)
        self.seed = int(seed)
        #: the last sampling layer's answers carry the sampled nodes' input rows (no pull wave
        #: of their own), where some partition is read from a server; where every partition is
        #: read in this process a pull is one local gather and carrying only costs (0.35 ms of a
        #: 4-seed PubMed batch's 1.6 ms sample + pull, same outputs)
        everything_here = len(aio.local_partitions()) == aio.num_partitions
        self.carry_features = (not everything_here) if carry_features is None else carry_features
        #: batches with at most this many input rows run their forward on the event loop
        self.inline_rows = int(inline_rows)
        self.num_nodes = int(aio.book.num_nodes)
        #: a typed model's one output node type (``HeteroGraphSAGE(target=)``), else None
        self.target: str | None = getattr(model, "target", None) if aio.book.is_hetero else None
        self.out_dim: int | None = None
        #: the input tensor's row shape and dtype (known after ``check_features``)
        self.feat_shape: tuple[int, ...] = ()
        self.feat_dtype: np.dtype[Any] = np.dtype(np.float32)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncgraph-forward")

    async def check_features(self) -> None:
        """Raise ``UnknownTensorError`` unless the graph has the model's input node tensor."""
        try:
            meta = await self.async_client.tensor_meta(node_key(self.feat))
        except UnknownTensorError:
            if typed_node_keys(self.async_client, self.feat):  # a heterograph's, stored per type
                return
            raise UnknownTensorError(
                f"the graph has no node tensor {self.feat!r} (the model's input)"
            ) from None
        self.feat_shape, self.feat_dtype = tuple(int(s) for s in meta.shape[1:]), np.dtype(meta.dtype)

    def check_nodes(self, nodes: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray:
        """``nodes`` (homogeneous IDs, or ``{ntype: per-type IDs}`` on a typed graph) as a 1-D
        int64 array of existing homogeneous node IDs, else a typed error naming the problem."""
        book = self.async_client.book
        if isinstance(nodes, Mapping):
            if not book.is_hetero:
                raise UnknownTypeError("the graph has no node types: send homogeneous IDs ('nodes')")
            parts = []
            for ntype, ids in nodes.items():
                if ntype not in book.ntypes:
                    raise UnknownTypeError(f"unknown node type {ntype!r}; the graph has {book.ntypes}")
                per_type = _ids(ids, f"{ntype!r} IDs", None)  # added nodes too: added_exist
                parts.append(np.asarray(book.map_to_homo_nid(per_type, ntype), dtype=np.int64))
            homo = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        else:
            homo = _ids(nodes, "node IDs", None)  # added nodes too: added_exist
        if self.target is not None and homo.size:
            types, _ = book.map_to_per_ntype(homo)
            other = np.flatnonzero(np.asarray(types) != book.ntypes.index(self.target))
            if other.size:
                got = book.ntypes[int(types[other[0]])]
                raise InvalidRequestError(f"the model answers {self.target!r} nodes only, got a {got!r} node")
        return homo

    async def added_exist(self, homo: np.ndarray, what: str = "node") -> None:
        """``OutOfRangeError`` naming an ID above the base graph that no owner added (a live
        graph's added nodes are answered like any): checked before the request joins a batch,
        so a bad ID fails its own request only."""
        above = homo[homo >= self.num_nodes]
        if not above.size:
            return
        unique = np.unique(above)
        try:
            await self.async_client.degrees(unique, "in")  # each owner: they exist
        except OutOfRangeError as err:
            bad = await self._first_missing(unique)
            book = self.async_client.book
            if book.is_hetero:  # name it as the request did: per type
                t, per = book.map_to_per_ntype(np.array([bad], np.int64))
                kind = book.ntypes[int(t[0])]
                raise OutOfRangeError(
                    f"unknown {what} ID {int(per[0])} ({kind!r} IDs): the graph has "
                    f"0..{book.num_nodes_of(kind) - 1} and the {kind} nodes added to it"
                ) from err
            raise OutOfRangeError(
                f"unknown {what} ID {bad}: the graph has 0..{self.num_nodes - 1} and the "
                "nodes added to it"
            ) from err

    async def _first_missing(self, ids: np.ndarray) -> int:
        """The first of ``ids`` no owner holds (the error path only: one ID a call, at most 64)."""
        for gid in ids[:64].tolist():
            try:
                await self.async_client.degrees(np.array([gid], np.int64), "in")
            except OutOfRangeError:
                return int(gid)
        return int(ids[0])

    async def build_cache(self, budget_bytes: int, *, batch_size: int) -> dict[str, int]:
        """Cache the input rows of remote partitions most often needed (the loaders' feature cache,
        ranked by presampled batches of random nodes) within ``budget_bytes``; what was cached."""
        from asyncgraph.dataloading.fetch import build_feature_cache

        if self.async_client.book.is_hetero or budget_bytes <= 0:
            return {"rows": 0, "bytes": 0, "candidates": 0}
        nids = np.arange(self.num_nodes, dtype=np.int64)
        return await build_feature_cache(
            self.async_client, self.sampler, nids, [self.feat], budget_bytes,
            batch_size=batch_size, seed=self.seed, carry_features=self.carry_features,
        )  # fmt: skip

    async def graph_unreachable(self, timeout: float = 1.0) -> str | None:
        """Why the graph's servers cannot answer now (a ping over every connection within
        ``timeout``; a lost one is reconnected by it), or None when all answered."""
        from asyncgraph.protocol.ops import Op

        connections = self.async_client.connections
        if not connections:  # standalone: the partitions are in this process
            return None
        results = await asyncio.gather(
            *(asyncio.wait_for(c.call(Op.PING, {}, timeout), timeout + 0.5) for c in connections),
            return_exceptions=True,
        )
        for conn, result in zip(connections, results, strict=True):
            if isinstance(result, BaseException):
                what = type(result).__name__
                return f"graph server {conn.host}:{conn.port} does not answer ({what})"
        return None

    async def warm_up(self) -> None:
        """One batch of one node (of the model's target type): kernels loaded, output width known."""
        book = self.async_client.book
        first = np.zeros(1, dtype=np.int64)
        if self.target is not None:
            first = np.asarray(book.map_to_homo_nid(first, self.target), dtype=np.int64)
        await self.infer(first)

    async def infer(self, seeds: np.ndarray, times: BatchTimes | None = None) -> torch.Tensor:
        """The model's output rows (CPU, in ``seeds`` order) for distinct, sorted ``seeds``."""
        times = times if times is not None else BatchTimes()
        if self.async_client.book.is_hetero:
            blocks, x, order = await self._sample_typed(seeds, times)
        else:
            stats = LoaderStats()
            sampled = await sample_and_pull(
                self.async_client,
                self.sampler,
                seeds,
                self.seed,
                stats,
                node_feats=[self.feat],
                carry_features=self.carry_features,
            )
            times.sample, times.pull = sampled.sample_time, sampled.pull_time
            times.remote_rows, times.cache_hits = stats.traffic.remote_rows, stats.traffic.cache_hits
            blocks, x, order = sampled.blocks, sampled.blocks[0].srcdata[self.feat], None
        out = await self.forward(blocks, x, times)
        return out if order is None else out[order]

    async def forward(self, blocks: Sequence[Any], x: Any, times: BatchTimes) -> torch.Tensor:
        """The model on ``blocks`` and input rows ``x`` (on the forward thread, or on the loop
        for small homogeneous batches: ``inline_rows``); CPU float32 rows of the last block's
        destinations."""
        t0 = time.perf_counter()
        rows = sum(int(b.num_src_nodes()) for b in blocks[:1]) if not self.async_client.book.is_hetero else 0
        if rows and rows <= self.inline_rows:  # a hand-off costs more than it frees
            out = self._forward(blocks, x)
        else:
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(self._executor, self._forward, blocks, x)
        times.forward = time.perf_counter() - t0
        if self.out_dim is None:
            self.out_dim = int(out.shape[1]) if out.ndim == 2 else 1
        return out

    def _forward(self, blocks: Sequence[Any], x: Any) -> torch.Tensor:
        if self.device.type != "cpu":
            blocks = [b.to(self.device) for b in blocks]
            x = {t: v.to(self.device) for t, v in x.items()} if isinstance(x, dict) else x.to(self.device)
        with torch.no_grad():
            out = self.model(blocks, x)
        if isinstance(out, Mapping):  # {ntype: rows}: the target type's
            if self.target is None or self.target not in out:
                raise InvalidRequestError("a typed model's output dict needs its target node type")
            out = out[self.target]
        result: torch.Tensor = out.detach().to("cpu", torch.float32)
        return result

    async def _sample_typed(
        self, seeds: np.ndarray, times: BatchTimes
    ) -> tuple[list[Any], Any, torch.Tensor]:
        """Typed blocks and ``{ntype: features}`` for homogeneous ``seeds`` (all of the target
        type), and the positions of the seeds among the last block's destinations."""
        from asyncgraph.dataloading.hetero_block import sample_and_pull_hetero

        book = self.async_client.book
        types, per_type = book.map_to_per_ntype(seeds)
        types, per_type = np.asarray(types), np.asarray(per_type)
        seed_dict = {book.ntypes[t]: per_type[types == t] for t in np.unique(types).tolist()}
        _, outputs, blocks, times.sample, times.pull = await sample_and_pull_hetero(
            self.async_client, self.sampler, seed_dict, self.seed, node_feats=[self.feat], labels=None
        )
        first = blocks[0]
        x = {t: first.srcdata[t][self.feat] for t in first.ntypes if self.feat in first.srcdata[t]}
        target = (
            self.target if self.target is not None else book.ntypes[int(types[0])] if seeds.size else None
        )
        dst = outputs[target].numpy() if target is not None else np.empty(0, dtype=np.int64)
        sorter = np.argsort(dst, kind="stable")
        order = sorter[np.searchsorted(dst, per_type, sorter=sorter)] if dst.size else np.empty(0, np.int64)
        return list(blocks), x, torch.from_numpy(np.asarray(order, dtype=np.int64))

    def close(self) -> None:
        """Stop the forward thread (after the last batch)."""
        self._executor.shutdown(wait=True)
