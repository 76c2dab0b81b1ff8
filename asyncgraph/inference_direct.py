"""Direct layer-wise inference: a GraphSAGE layer computed straight from co-located partitions.

The loader path of ``LayerPass`` builds a block per batch (full in-neighbourhoods through the
sampler, relabelled), gathers one source row per in-edge into a new ``[sources, feats]`` array,
then aggregates it. For a full-neighbourhood ``SAGEConv`` (mean, sum, gcn) on destinations whose
partition is co-located (its server on this host, its memory mapped here) none of that is
needed: the destinations' in-edges are a slice of that partition's CSC, and each neighbour sum
reads the source rows where they are stored, in the shared memory of the partition that owns
them (``inference_kernel.neighbour_sum``, under that partition's read lock). Rows of sources in
partitions that are not co-located are pulled once per batch (unique IDs). No sampling
request, relabelling, gather or prefetch thread: one trainer is one core's work (its torch
threads for the dense maps), so trainers on one host scale with the cores they are given.

Only the maths of ``asyncgraph.nn.SAGEConv.forward`` for these aggregators is repeated here
(``fc_self(h_dst) + fc_neigh(agg) + bias``, activation, norm), checked against the loader path
by ``tests/test_inference_direct.py``; any other layer, a ``layer_fn``, ``fanouts`` or a device
takes the loader path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from asyncgraph.arrays import unique_sorted
from asyncgraph.inference_kernel import neighbour_sum
from asyncgraph.inference_kernel import wait_ready as kernel_ready
from asyncgraph.names import node_key
from asyncgraph.storage.store import PartitionStore

__all__ = ["DirectPass", "direct_layer"]

_DIRECT_AGGREGATORS = ("mean", "sum", "gcn")
_KERNEL_WAIT_S = 120.0


def direct_layer(layer: nn.Module) -> bool:
    """Whether ``layer`` is one the direct path computes exactly: our ``SAGEConv`` (not a
    subclass that changes ``forward``) with a mean, sum or gcn aggregator."""
    from asyncgraph.nn.sage import SAGEConv

    return (
        isinstance(layer, SAGEConv)
        and type(layer).forward is SAGEConv.forward
        and layer.aggregator in _DIRECT_AGGREGATORS
    )


class DirectPass:
    """One layer over node IDs whose partitions are co-located (see the module's docstring)."""

    def __init__(self, g: Any, batch_size: int) -> None:
        from asyncgraph.dataloading.fetch import client_of

        client = client_of(g)
        self.loop = client.loop
        self.client_aio = client.async_client
        self.book = self.client_aio.book
        self.batch_size = batch_size
        self.local = {p.part_id: p for p in self.client_aio.partitions if p.store is not None}
        #: seconds spent in neighbour sums and in the dense maps, and nodes done, over all layers
        self.times = {"neighbour_sum": 0.0, "dense": 0.0, "nodes": 0.0}
        self._kernel_checked = False
        #: The graph was updated (issue 35): this path reads the base CSC only, so it stands aside.
        self.live = self.loop.run(self.client_aio.added_nodes()) is not None

    def split(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``ids`` as ``(those whose partition is co-located, the rest)``."""
        if not self.local or not ids.size or self.live:
            return ids[:0], ids  # a live graph (issue 35): the sampled path reads its overlay
        here = np.isin(self.book.owner(ids, "node"), np.fromiter(self.local, dtype=np.int64))
        return ids[here], ids[~here]

    def _stores(self) -> dict[int, PartitionStore]:
        """The co-located partitions' stores now (a restarted server's memory is re-attached
        by the client, so they are looked up again for every layer)."""
        stores = {}
        for pid, part in self.local.items():
            store = part.store
            assert store is not None, "a co-located partition has a store"
            stores[pid] = store
        return stores

    def _rows(self, name: str) -> dict[int, np.ndarray]:
        """Every co-located partition's rows of node tensor ``name``, mapped here (a one-row
        pull through the client maps a tensor created after the partition was attached, and
        checks that its server is the one whose memory this is)."""
        key = node_key(name)
        held = [pid for pid in self.local if self.book.node_range(pid)[1] > self.book.node_range(pid)[0]]
        for pid in held:
            self.loop.run(
                self.client_aio.pull_numpy(key, np.array([self.book.node_range(pid)[0]], dtype=np.int64))
            )
        stores = self._stores()
        return {pid: stores[pid].local_rows(key) for pid in held}

    def _batches(self, ids: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """``(partition, sorted unique IDs)`` batches of at most ``batch_size``, each in one
        partition (unique: a batch spanning as many IDs as it holds is a contiguous range)."""
        ids = unique_sorted(ids)
        owners = self.book.owner(ids, "node")
        cuts = np.flatnonzero(np.diff(owners)) + 1
        for chunk in np.split(ids, cuts):
            if not chunk.size:
                continue
            pid = int(self.book.owner(chunk[:1], "node")[0])
            for b in range(0, chunk.size, self.batch_size):
                yield pid, chunk[b : b + self.batch_size]

    def run(self, i: int, layer: nn.Module, todo: np.ndarray, source: str, finish: Any) -> None:
        """Layer ``i`` of ``layer`` for ``todo`` (all co-located), reading tensor ``source``;
        ``finish(i, ids, out)`` activates and writes each batch's outputs."""
        if not self._kernel_checked:
            kernel_ready(_KERNEL_WAIT_S)  # the numpy form would do, ~5x slower
            self._kernel_checked = True
        rows = self._rows(source)
        stores = self._stores()
        key = node_key(source)
        remote_parts = [p for p in range(int(self.client_aio.num_partitions)) if p not in self.local]
        for pid, batch in self._batches(todo):
            store = stores[pid]
            pos = batch - self.book.node_range(pid)[0]
            contiguous = int(pos[-1] - pos[0]) + 1 == pos.size
            if contiguous:
                starts = store.indptr[pos[0] : pos[-1] + 1]
                ends = store.indptr[pos[0] + 1 : pos[-1] + 2]
            else:
                starts, ends = store.indptr[pos], store.indptr[pos + 1]
            t0 = time.perf_counter()
            own = rows[pid]
            agg = np.zeros((batch.size, own.shape[1]), dtype=np.float32)
            for q, rows_q in rows.items():
                with stores[q].lock.read():
                    neighbour_sum(agg, starts, ends, store.indices, rows_q, self.book.node_range(q)[0])
            with store.lock.read():
                h_dst = own[pos[0] : pos[-1] + 1] if contiguous else own[pos]
                h_dst = torch.from_numpy(np.array(h_dst, dtype=np.float32))
            if remote_parts:
                self._add_remote(agg, starts, ends, store.indices, key)
            t1 = time.perf_counter()
            out = self._sage(layer, h_dst, torch.from_numpy(agg), torch.from_numpy(ends - starts))
            self.times["neighbour_sum"] += t1 - t0
            self.times["dense"] += time.perf_counter() - t1
            self.times["nodes"] += batch.size
            finish(i, torch.from_numpy(batch), out)

    def _add_remote(
        self, agg: np.ndarray, starts: np.ndarray, ends: np.ndarray, indices: np.ndarray, key: str
    ) -> None:
        """Add the rows of sources owned by partitions that are not co-located: pulled once
        (unique IDs) through the client, then summed from the pulled array."""
        counts = ends - starts
        offsets = np.concatenate(([0], np.cumsum(counts)))
        src = indices[np.repeat(starts - offsets[:-1], counts) + np.arange(int(offsets[-1]))]
        far = ~np.isin(self.book.owner(src, "node"), np.fromiter(self.local, dtype=np.int64))
        if not far.any():
            return
        wanted = unique_sorted(src[far])
        pulled = self.loop.run(self.client_aio.pull_numpy(key, wanted)).astype(np.float32, copy=False)
        at = np.full(src.size, -1, dtype=np.int64)
        at[far] = np.searchsorted(wanted, src[far])
        neighbour_sum(agg, offsets[:-1], offsets[1:], at, np.ascontiguousarray(pulled), 0)

    @staticmethod
    def _sage(layer: Any, h_dst: torch.Tensor, summed: torch.Tensor, deg: torch.Tensor) -> torch.Tensor:
        """``SAGEConv.forward``'s maths from the neighbour sums (see the module's docstring)."""
        deg_f = deg.to(summed.dtype).unsqueeze(1)
        if layer.aggregator == "mean":
            h_neigh = summed / deg_f.clamp(min=1)
        elif layer.aggregator == "gcn":  # the node itself counts as one more neighbour
            h_neigh = (summed + h_dst) / (deg_f + 1)
        else:
            h_neigh = summed
        out: torch.Tensor = layer.combine(layer.fc_neigh(h_neigh), h_dst)
        return out
