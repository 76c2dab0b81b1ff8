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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.dataloading.block import Block
from asyncgraph.dataloading.fetch import sample_and_pull
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import DTypeMismatchError, OutOfRangeError, ShapeMismatchError, UnknownTensorError
from asyncgraph.names import node_key

__all__ = ["BatchTimes", "InferenceCore"]


@dataclass
class BatchTimes:
    """Seconds one batch spent sampling, pulling features and in the forward pass."""

    sample: float = 0.0
    pull: float = 0.0
    forward: float = 0.0


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
        carry_features: bool = True,
        inline_rows: int = 0,
    ) -> None:
        self.aio = aio
        self.model = model.eval()
        self.sampler = NeighborSampler(list(fanouts))
        self.feat = feat
        self.device = torch.device(device)
        self.seed = int(seed)
        self.carry_features = carry_features
        #: batches with at most this many input rows run their forward on the event loop
        self.inline_rows = int(inline_rows)
        self.num_nodes = int(aio.book.num_nodes)
        self.out_dim: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncgraph-forward")

    async def check_features(self) -> None:
        """Raise ``UnknownTensorError`` unless the graph has the model's input node tensor."""
        try:
            await self.aio.tensor_meta(node_key(self.feat))
        except UnknownTensorError:
            raise UnknownTensorError(
                f"the graph has no node tensor {self.feat!r} (the model's input)"
            ) from None

    def check_nodes(self, nodes: np.ndarray) -> np.ndarray:
        """``nodes`` as a 1-D int64 array of existing node IDs, else a typed error naming the problem."""
        if nodes.dtype.kind not in "iu":
            raise DTypeMismatchError(f"node IDs must be integers, got {nodes.dtype}")
        if nodes.ndim != 1:
            raise ShapeMismatchError(f"node IDs must be 1-D, got shape {list(nodes.shape)}")
        ids = nodes.astype(np.int64, copy=False)
        if ids.size:
            bad = ids[(ids < 0) | (ids >= self.num_nodes)]
            if bad.size:
                raise OutOfRangeError(
                    f"unknown node ID {int(bad[0])}: the graph has nodes 0..{self.num_nodes - 1}"
                    + (f" ({bad.size} IDs out of range)" if bad.size > 1 else "")
                )
        return ids

    async def infer(self, seeds: np.ndarray, times: BatchTimes | None = None) -> torch.Tensor:
        """The model's output rows (CPU, in ``seeds`` order) for distinct, sorted ``seeds``."""
        times = times if times is not None else BatchTimes()
        stats = LoaderStats()
        sampled = await sample_and_pull(
            self.aio,
            self.sampler,
            seeds,
            self.seed,
            stats,
            node_feats=[self.feat],
            carry_features=self.carry_features,
        )
        times.sample, times.pull = sampled.sample_time, sampled.pull_time
        t0 = time.perf_counter()
        if sampled.input_nodes.size <= self.inline_rows:  # a hand-off costs more than it frees
            out = self._forward(sampled.blocks)
        else:
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(self._executor, self._forward, sampled.blocks)
        times.forward = time.perf_counter() - t0
        if self.out_dim is None:
            self.out_dim = int(out.shape[1]) if out.ndim == 2 else 1
        return out

    def _forward(self, blocks: list[Block]) -> torch.Tensor:
        x = blocks[0].srcdata[self.feat]
        if self.device.type != "cpu":
            blocks = [b.to(self.device) for b in blocks]
            x = x.to(self.device)
        with torch.no_grad():
            out: torch.Tensor = self.model(blocks, x)
        return out.detach().to("cpu", torch.float32)

    def close(self) -> None:
        """Stop the forward thread (after the last batch)."""
        self._executor.shutdown(wait=True)
