"""Loader workers feeding a CUDA device: the batches equal the CPU ones, the slots the device copy
reads are pinned, and feature rows are written on the host once. Skipped without CUDA
(``python -m benchmarks.gpu_suite`` runs this file on a GPU host)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from asyncgraph.client import Client
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import DistGraph

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("overlap", [True, False])
def test_worker_batches_on_cuda_equal_cpu_batches(pubmed2: Any, overlap: bool) -> None:
    client = Client.standalone(pubmed2.part_config)
    try:
        g = DistGraph("pubmed", client=client)
        nids = np.arange(0, g.num_nodes(), 13)
        sampler = NeighborSampler([5, 3])
        cpu = list(DistNodeDataLoader(g, nids, sampler, 200, seed=2))
        loader = DistNodeDataLoader(
            g, nids, sampler, 200, seed=2, num_workers=2, device="cuda", overlap=overlap, prefetch=3
        )
        got = list(loader)
        torch.cuda.synchronize()
        assert len(got) == len(cpu)
        for a, b in zip(cpu, got, strict=True):
            assert b.blocks[0].srcdata["feat"].is_cuda and b.input_nodes.is_cuda
            assert torch.equal(a.input_nodes, b.input_nodes.cpu())
            assert torch.equal(a.blocks[0].srcdata["feat"], b.blocks[0].srcdata["feat"].cpu())
            assert torch.equal(a.blocks[-1].dstdata["label"], b.blocks[-1].dstdata["label"].cpu())
            for x, y in zip(a.blocks, b.blocks, strict=True):
                assert torch.equal(x.edge_index, y.edge_index.cpu())
        assert loader.stats.host_copy_bytes == loader.stats.feature_bytes > 0
        assert loader._pool is not None
        slots = [s for w in loader._pool._workers for s in w.slots.values()]
        assert slots and all(s.pinned for s in slots)  # the device copy reads pinned memory
        loader.close()
    finally:
        client.close()
