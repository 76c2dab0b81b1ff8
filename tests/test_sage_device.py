"""SAGEConv/GraphSAGE on a device and under autocast: float32 accumulation, same maths, grads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from asyncgraph.dataloading import Block, to_block
from asyncgraph.nn import GraphSAGE, SAGEConv

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _blocks(seed: int) -> list[Block]:
    rng = np.random.default_rng(seed)
    seeds = np.arange(20)
    src = rng.integers(0, 200, 150)
    dst = rng.integers(0, 20, 150)
    top = to_block(src, dst, seeds)
    inner_dst = top.srcnodes.numpy()
    src2 = rng.integers(0, 200, 400)
    dst2 = inner_dst[rng.integers(0, inner_dst.size, 400)]
    bottom = to_block(src2, dst2, inner_dst)
    return [bottom, top]


@pytest.mark.parametrize("aggregator", ["mean", "sum", "gcn", "pool"])
def test_cpu_autocast_bfloat16_forward_and_backward(aggregator: str) -> None:
    torch.manual_seed(0)
    blocks = _blocks(1)
    x = torch.randn(blocks[0].num_src_nodes(), 16)
    y = torch.randint(0, 5, (blocks[1].num_dst_nodes(),))
    model = GraphSAGE(16, 32, 5, 2, dropout=0.0, aggregator=aggregator)
    ref = model(blocks, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(blocks, x)
        loss = F.cross_entropy(out.float(), y)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.05)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().sum()) > 0, name
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the sparse-product path
        out_ng = model(blocks, x)
    torch.testing.assert_close(out_ng.float(), out.detach().float(), atol=0.05, rtol=0.05)


@pytest.mark.parametrize("aggregator", ["mean", "sum", "gcn"])
def test_half_precision_features_aggregate_in_float32(aggregator: str) -> None:
    blocks = _blocks(2)
    conv = SAGEConv(8, 4, aggregator=aggregator).to(torch.bfloat16)
    x = torch.randn(blocks[0].num_src_nodes(), 8)
    with torch.no_grad():
        spmm = conv(blocks[0], x.to(torch.bfloat16))  # no grad: one CSR product, float32 inside
    x_grad = x.to(torch.bfloat16).requires_grad_()
    scatter = conv(blocks[0], x_grad)  # index_add path, float32 accumulation
    assert spmm.dtype == scatter.dtype == torch.bfloat16
    torch.testing.assert_close(spmm, scatter.detach(), atol=0.02, rtol=0.02)


def test_block_to_carries_the_cached_csr() -> None:
    block = _blocks(3)[0]
    assert "csr" not in block.to("cpu")._cache
    csr = block.csr()
    moved = block.to("cpu")
    assert all(torch.equal(a, b) for a, b in zip(moved._cache["csr"], csr, strict=True))


@needs_cuda
@pytest.mark.parametrize("aggregator", ["mean", "sum", "gcn", "max", "pool"])
def test_graphsage_on_cuda_matches_cpu(aggregator: str) -> None:
    torch.manual_seed(0)
    blocks = _blocks(4)
    x = torch.randn(blocks[0].num_src_nodes(), 16)
    model = GraphSAGE(16, 32, 5, 2, dropout=0.0, aggregator=aggregator)
    ref = model(blocks, x)
    dev = torch.device("cuda")
    gpu_blocks = [b.to(dev) for b in blocks]
    model_gpu = model.to(dev)
    out = model_gpu(gpu_blocks, x.to(dev))
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)
    fresh = [Block(b.srcnodes, b.dstnodes, b.edge_index, b.eids) for b in gpu_blocks]  # no cached CSR
    crow, col, deg = fresh[0].csr()
    assert crow.is_cuda and col.is_cuda and deg.is_cuda
    assert all(torch.equal(a.cpu(), b) for a, b in zip((crow, col, deg), blocks[0].csr(), strict=True))
    with torch.no_grad():
        torch.testing.assert_close(model_gpu(fresh, x.to(dev)).cpu(), ref, atol=1e-4, rtol=1e-4)
    with torch.autocast("cuda", dtype=torch.float16):
        half = model_gpu(gpu_blocks, x.to(dev))
    half.float().sum().backward()
    torch.testing.assert_close(half.float().cpu(), ref, atol=0.1, rtol=0.05)
