"""What a PyG loader's batches are made of: picklable recipes, built in loader workers or in place.

``asyncgraph.pyg``'s ``DistNeighborLoader`` / ``DistLinkNeighborLoader`` with ``num_workers=N``
run asyncgraph's loader worker processes (``workers.py``), as the DGL-style loaders do: each
worker gets a recipe here once, then per batch a **task** (one int64 array) and the batch's
seed, and builds the batch with its own client: the sample, the relabelling and every node
attribute's rows pulled straight into the batch slot the training process maps (``hops.py``).
The training process only turns the unpacked dicts into ``Data`` / ``HeteroData``. With
``num_workers=0`` the loaders build the same recipe's batches on the client's event loop, so
both give equal batches for one seed. Nothing here imports torch_geometric: a worker starts
without it.

A node task is the batch's seeds then their positions in ``input_nodes`` (``input_id``). A link
task is ``[num_pos, positions, sources, destinations, label bytes]``: the labels travel as raw
bytes (any dtype); the negatives are drawn in the recipe from the batch seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.dataloading.fetch import Allocate
from asyncgraph.dataloading.hops import hops_payload, sample_and_pull
from asyncgraph.dataloading.stats import LoaderStats

__all__ = ["PyGLinkRecipe", "PyGNodeRecipe", "link_task", "node_task"]

_NEG_STREAM = 0x6E65675F  # keys the negatives' generator apart from the sampling seeds


@dataclass
class _Sampling:
    """How a batch is sampled and which node attributes it carries (PyG's layout)."""

    fanouts: list[Any]
    replace: bool
    attrs: dict[str, str]  # batch attribute -> node tensor
    hetero: bool

    async def sample(
        self,
        aio: AsyncClient,
        seeds: Any,
        batch_seed: int,
        stats: LoaderStats,
        allocate: Allocate | None,
        extra_bytes: int,
    ) -> dict[str, Any]:
        hops, parts, feats = await sample_and_pull(
            aio,
            seeds,
            self.fanouts,
            self.replace,
            self.attrs,
            self.hetero,
            batch_seed,
            stats,
            allocate,
            extra_bytes,
        )
        return hops_payload(hops, parts, feats)


def node_task(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """A node batch's task: its seeds, then their positions in ``input_nodes``."""
    return np.concatenate([seeds.astype(np.int64, copy=False), positions.astype(np.int64, copy=False)])


@dataclass
class PyGNodeRecipe(_Sampling):
    """``DistNeighborLoader``'s batches (``input_type``: the seeds' node type, heterogeneous)."""

    input_type: str | None = None

    async def build(
        self,
        aio: AsyncClient,
        task: np.ndarray,
        batch_seed: int,
        stats: LoaderStats,
        allocate: Allocate | None,
    ) -> dict[str, Any]:
        """The batch of ``task`` (``node_task``) as the loader delivers it, before ``to_data``."""
        half = task.size // 2
        seeds, input_id = task[:half], torch.from_numpy(task[half:])
        extra = 2 * task.nbytes
        if self.input_type is None:
            payload = await self.sample(aio, seeds, batch_seed, stats, allocate, extra)
            payload.update(input_id=input_id, batch_size=int(half))
            return payload
        payload = await self.sample(aio, {self.input_type: seeds}, batch_seed, stats, allocate, extra)
        payload["nodes"][self.input_type].update(input_id=input_id, batch_size=int(half))
        return payload


def link_task(eli: torch.Tensor, label: torch.Tensor | None, positions: np.ndarray) -> np.ndarray:
    """A link batch's task: ``[num_pos, positions, sources, destinations, label bytes]``."""
    pos = torch.from_numpy(positions.astype(np.int64, copy=False))
    parts = [np.array([pos.numel()], np.int64), pos.numpy(), eli[0, pos].numpy(), eli[1, pos].numpy()]
    if label is not None:
        raw = label[pos].contiguous().reshape(-1).view(torch.uint8).numpy()
        words = np.zeros(-(-raw.size // 8), np.int64)
        words.view(np.uint8)[: raw.size] = raw
        parts.append(words)
    return np.concatenate(parts)


@dataclass
class PyGLinkRecipe(_Sampling):
    """``DistLinkNeighborLoader``'s batches: PyG's ``LinkLoader`` layout (see ``link_loader.py``)."""

    input_type: tuple[str, str, str] | None = None
    sizes: tuple[int, int] = (0, 0)  # node counts of the sources' and destinations' types
    neg_mode: str | None = None  # "binary", "triplet" or None
    neg_amount: float = 1.0
    label_dtype: str | None = None  # the given edge_label's dtype (None: ones)
    label_shape: tuple[int, ...] = ()

    def _labels(self, task: np.ndarray, num_pos: int) -> torch.Tensor:
        if self.label_dtype is None:
            return torch.ones(num_pos)
        dtype = getattr(torch, self.label_dtype)
        count = num_pos * math.prod(self.label_shape)
        nbytes = count * torch.empty(0, dtype=dtype).element_size()
        raw = torch.from_numpy(task[1 + 3 * num_pos :].view(np.uint8)[:nbytes].copy())
        return raw.view(dtype).reshape(num_pos, *self.label_shape)

    async def build(
        self,
        aio: AsyncClient,
        task: np.ndarray,
        batch_seed: int,
        stats: LoaderStats,
        allocate: Allocate | None,
    ) -> dict[str, Any]:
        """The batch of ``task`` (``link_task``) as the loader delivers it, before ``to_data``."""
        num_pos = int(task[0])
        pos = torch.from_numpy(task[1 : 1 + num_pos])
        src = torch.from_numpy(task[1 + num_pos : 1 + 2 * num_pos])
        dst = torch.from_numpy(task[1 + 2 * num_pos : 1 + 3 * num_pos])
        label = self._labels(task, num_pos)
        rng = np.random.default_rng([batch_seed, _NEG_STREAM])
        n_src, n_dst = self.sizes
        if self.neg_mode is not None:  # uniform negatives as PyG's neg_sample draws them, seeded per batch
            num_neg = math.ceil(num_pos * self.neg_amount)
            dst_neg = torch.from_numpy(rng.integers(0, n_dst, num_neg, dtype=np.int64))
            if self.neg_mode == "binary":
                src = torch.cat([src, torch.from_numpy(rng.integers(0, n_src, num_neg, dtype=np.int64))])
                dst = torch.cat([dst, dst_neg])
                label = torch.cat([label, label.new_zeros((num_neg, *label.shape[1:]))])
            else:
                dst = torch.cat([dst, dst_neg])
        extra = 8 * (num_pos + 3 * (src.numel() + dst.numel())) + label.numel() * label.element_size()
        if self.input_type is not None:
            return await self._build_hetero(aio, pos, src, dst, label, batch_seed, stats, allocate, extra)
        uniq, inv = np.unique(torch.cat([src, dst]).numpy(), return_inverse=True)
        inverse = torch.from_numpy(inv.reshape(-1))
        payload = await self.sample(aio, uniq, batch_seed, stats, allocate, extra)
        payload.update(input_id=pos, batch_size=num_pos)
        if self.neg_mode != "triplet":
            payload.update(edge_label_index=inverse.view(2, -1), edge_label=label)
        else:
            ns = src.numel()
            payload.update(
                src_index=inverse[:ns],
                dst_pos_index=inverse[ns : ns + num_pos],
                dst_neg_index=inverse[ns + num_pos :].view(num_pos, -1).squeeze(-1),
            )
        return payload

    async def _build_hetero(
        self,
        aio: AsyncClient,
        pos: torch.Tensor,
        src: torch.Tensor,
        dst: torch.Tensor,
        label: torch.Tensor,
        batch_seed: int,
        stats: LoaderStats,
        allocate: Allocate | None,
        extra: int,
    ) -> dict[str, Any]:
        """A heterogeneous batch laid out as PyG's ``LinkLoader`` lays it out."""
        etype = self.input_type
        assert etype is not None
        st, dt = etype[0], etype[2]
        num_pos = int(pos.numel())
        if st == dt:
            uniq, inv = np.unique(torch.cat([src, dst]).numpy(), return_inverse=True)
            seeds = {st: uniq}
            src_idx, dst_idx = torch.from_numpy(inv[: src.numel()]), torch.from_numpy(inv[src.numel() :])
        else:
            us, inv_s = np.unique(src.numpy(), return_inverse=True)
            ud, inv_d = np.unique(dst.numpy(), return_inverse=True)
            seeds = {st: us, dt: ud}
            src_idx, dst_idx = torch.from_numpy(inv_s), torch.from_numpy(inv_d)
        payload = await self.sample(aio, seeds, batch_seed, stats, allocate, extra)
        edges = payload["edges"].setdefault(etype, {})
        edges.update(input_id=pos)
        if self.neg_mode != "triplet":
            edges.update(edge_label_index=torch.stack([src_idx, dst_idx]), edge_label=label)
        else:
            payload["nodes"][st]["src_index"] = src_idx
            payload["nodes"][dt]["dst_pos_index"] = dst_idx[:num_pos]
            payload["nodes"][dt]["dst_neg_index"] = dst_idx[num_pos:].view(num_pos, -1).squeeze(-1)
        return payload
