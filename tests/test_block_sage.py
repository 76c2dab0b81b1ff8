"""Tests of to_block, NeighborSampler and SAGEConv/GraphSAGE."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from asyncgraph.dataloading import Block, NeighborSampler, SampleFn, to_block
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError
from asyncgraph.kernels import sample_csc
from asyncgraph.nn import GraphSAGE, SAGEConv


def random_edges(num_nodes: int, num_edges: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges)


def test_to_block_relabel() -> None:
    src = np.array([7, 3, 9, 7, 5, 9, 2, 8])
    dst = np.array([3, 5, 5, 2, 3, 3, 5, 2])
    dst_nodes = np.array([5, 3, 2])
    block = to_block(src, dst, dst_nodes, eids=np.arange(8) + 100)
    assert block.srcnodes.tolist() == [5, 3, 2, 7, 9, 8]  # dst prefix, then first appearance
    assert block.dstnodes.tolist() == [5, 3, 2]
    assert (block.num_src_nodes(), block.num_dst_nodes(), block.num_edges()) == (6, 3, 8)
    assert block.srcnodes[block.edge_index[0]].tolist() == src.tolist()
    assert block.dstnodes[block.edge_index[1]].tolist() == dst.tolist()
    assert block.eids.tolist() == list(range(100, 108))
    assert block.edge_index.dtype == block.srcnodes.dtype == torch.int64
    moved = block.to("cpu")
    assert isinstance(moved, Block) and torch.equal(moved.edge_index, block.edge_index)


def test_to_block_random_and_torch_inputs() -> None:
    src, dst = random_edges(500, 3000, 1)
    dst_nodes = np.unique(dst)[np.random.default_rng(2).permutation(np.unique(dst).size)]
    block = to_block(torch.from_numpy(src), torch.from_numpy(dst), torch.from_numpy(dst_nodes))
    assert block.eids.numel() == 0
    assert torch.equal(block.srcnodes[: block.num_dst_nodes()], block.dstnodes)
    assert torch.equal(block.srcnodes[block.edge_index[0]], torch.from_numpy(src))
    assert torch.equal(block.dstnodes[block.edge_index[1]], torch.from_numpy(dst))
    assert torch.unique(block.srcnodes).numel() == block.num_src_nodes()
    new = block.srcnodes[block.num_dst_nodes() :].numpy()
    not_dst = src[~np.isin(src, dst_nodes)]
    _, first = np.unique(not_dst, return_index=True)
    np.testing.assert_array_equal(new, not_dst[np.sort(first)])


def test_to_block_validation() -> None:
    with pytest.raises(ValueError, match="unique"):
        to_block([1], [2], [2, 2])
    with pytest.raises(ValueError, match="not among"):
        to_block([1, 2], [2, 4], [2, 3])
    with pytest.raises(InvalidRequestError):
        to_block([1, 2], [2], [2])
    with pytest.raises(DTypeMismatchError):
        to_block(np.array([1.0]), [2], [2])
    empty = to_block([], [], [4, 1])
    assert empty.srcnodes.tolist() == [4, 1] and empty.edge_index.shape == (2, 0)


@pytest.mark.parametrize("compiled_path", [False, True])
def test_to_block_compiled_and_numpy_relabel_agree(
    compiled_path: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled relabel (one pass) gives numpy's output and errors, and leaves the scratch
    table all -1 either way (a later block must not see this one's labels)."""
    from asyncgraph.dataloading import block as block_module
    from asyncgraph.dataloading import relabel_kernel
    from asyncgraph.kernels.jit import disabled

    if compiled_path:
        if disabled():
            pytest.skip("ASYNCGRAPH_NO_JIT is set")
        assert relabel_kernel.wait_ready(120)
    else:
        monkeypatch.setattr(relabel_kernel, "relabel", lambda *a: None)
    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(1, 300))
        src, dst = random_edges(n, int(rng.integers(0, 2000)), trial)
        extra = rng.integers(0, n, int(rng.integers(0, 20)))  # destinations without in-edges
        dst_nodes = np.unique(np.concatenate([dst, extra]))
        dst_nodes = dst_nodes[rng.permutation(dst_nodes.size)]
        table = block_module._table(n + 1)
        got = block_module._relabel_table(src, dst, dst_nodes, table)
        want = block_module._relabel_sort(src, dst, dst_nodes)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        assert (table == -1).all()
    table = block_module._table(10)
    with pytest.raises(ValueError, match="unique"):
        block_module._relabel_table(np.array([1]), np.array([2]), np.array([2, 2]), table)
    assert (table == -1).all()
    with pytest.raises(ValueError, match="destination 4 is not among"):
        block_module._relabel_table(np.array([1, 2]), np.array([2, 4]), np.array([2, 3]), table)
    assert (table == -1).all()


def dense_reference(block: Block, h: torch.Tensor, conv: SAGEConv) -> torch.Tensor:
    """SAGEConv computed through a dense [num_dst, num_src] adjacency (multi-edges counted)."""
    adj = torch.zeros(block.num_dst_nodes(), block.num_src_nodes(), dtype=h.dtype)
    adj.index_put_(
        (block.edge_index[1], block.edge_index[0]),
        torch.ones(block.num_edges(), dtype=h.dtype),
        accumulate=True,
    )
    deg = adj.sum(1, keepdim=True)
    if conv.aggregator == "sum":
        neigh = adj @ h
    elif conv.aggregator == "mean":
        neigh = (adj @ h) / deg.clamp(min=1)
    elif conv.aggregator == "gcn":
        neigh = (adj @ h + h[: block.num_dst_nodes()]) / (deg + 1)
    else:
        feat = torch.relu(conv.fc_pool(h)) if conv.fc_pool is not None else h
        masked = torch.where(adj.unsqueeze(2) > 0, feat.unsqueeze(0), torch.tensor(-torch.inf, dtype=h.dtype))
        neigh = torch.where(deg > 0, masked.max(1).values, torch.zeros((), dtype=h.dtype))
    out: torch.Tensor = conv.fc_neigh(neigh)
    if conv.fc_self is not None:
        out = out + conv.fc_self(h[: block.num_dst_nodes()])
    return out + conv.bias if conv.bias is not None else out


@pytest.mark.parametrize("aggregator", ["mean", "sum", "max", "pool", "gcn"])
@pytest.mark.parametrize(("in_feats", "out_feats"), [(6, 4), (3, 5)])
def test_sageconv_matches_dense(aggregator: str, in_feats: int, out_feats: int) -> None:
    torch.manual_seed(0)
    src, dst = random_edges(40, 150, 3)
    dst_nodes = np.concatenate([np.unique(dst), [1000]])  # node 1000 has no in-edges
    block = to_block(src, dst, dst_nodes)
    conv = SAGEConv(in_feats, out_feats, aggregator=aggregator).double()
    with torch.no_grad():
        if conv.bias is not None:
            conv.bias.uniform_(-1, 1)
    h = torch.randn(block.num_src_nodes(), in_feats, dtype=torch.float64, requires_grad=True)
    out = conv(block, h)
    assert out.shape == (block.num_dst_nodes(), out_feats)
    torch.testing.assert_close(out, dense_reference(block, h, conv))
    out.square().sum().backward()
    assert h.grad is not None and torch.isfinite(h.grad).all() and h.grad.abs().sum() > 0
    assert all(p.grad is not None for p in conv.parameters())
    if aggregator != "gcn":  # an isolated destination only sees fc_self(h_dst) + bias
        expected = conv.fc_self(h[block.num_dst_nodes() - 1]) + conv.bias  # type: ignore[misc]
        torch.testing.assert_close(out[-1], expected)


def test_sageconv_options_and_errors() -> None:
    block = to_block([1, 2], [0, 0], [0])
    conv = SAGEConv(3, 2, bias=False, activation=torch.relu, norm=torch.nn.LayerNorm(2))
    out = conv(block, torch.randn(3, 3))
    assert out.shape == (1, 2) and conv.bias is None
    with pytest.raises(ValueError):
        SAGEConv(3, 2, aggregator="lstm")
    with pytest.raises(ValueError):
        conv(block, torch.randn(4, 3))


def whole_graph_sample_fn(
    num_nodes: int, num_edges: int, replace: bool, seed: int
) -> tuple[SampleFn, np.ndarray, np.ndarray]:
    """A SampleFn over one whole-graph CSC, as a single server would serve it."""
    src, dst = random_edges(num_nodes, num_edges, seed)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    indices, eids = src[order].astype(np.int64), order.astype(np.int64)
    rng = np.random.default_rng(seed)

    async def sample_fn(seeds: np.ndarray, fanout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        await asyncio.sleep(0)
        s, pos, e = sample_csc(indptr, indices, eids, seeds, fanout, replace, rng)
        return s, seeds[pos], e

    return sample_fn, src, dst


@pytest.mark.parametrize("replace", [False, True])
async def test_sampler_blocks_chain(replace: bool) -> None:
    sample_fn, src, dst = whole_graph_sample_fn(300, 3000, replace, 4)
    sampler = NeighborSampler([5, 3], replace=replace)
    assert sampler.fanouts == [5, 3] and sampler.replace is replace
    seeds = np.array([10, 3, 250, 77], dtype=np.int64)
    input_nodes, output_nodes, blocks = await sampler.sample_blocks(sample_fn, seeds)
    assert len(blocks) == 2
    np.testing.assert_array_equal(output_nodes, seeds)
    assert blocks[-1].dstnodes.tolist() == seeds.tolist()
    assert torch.equal(blocks[0].dstnodes, blocks[1].srcnodes)
    np.testing.assert_array_equal(blocks[0].srcnodes.numpy(), input_nodes)
    counts = torch.bincount(blocks[1].edge_index[1], minlength=4)
    assert int(counts.max()) <= 3 and int(blocks[0].edge_index[1].bincount().max()) <= 5
    for block in blocks:  # every block edge is a graph edge with the matching edge ID
        gsrc, gdst = block.srcnodes[block.edge_index[0]].numpy(), block.dstnodes[block.edge_index[1]].numpy()
        np.testing.assert_array_equal(src[block.eids.numpy()], gsrc)
        np.testing.assert_array_equal(dst[block.eids.numpy()], gdst)
    model = GraphSAGE(8, 16, 3, n_layers=2)
    logits = model(blocks, torch.randn(input_nodes.size, 8))
    assert logits.shape == (4, 3)
    logits.sum().backward()


def test_sampler_validation() -> None:
    with pytest.raises(ValueError):
        NeighborSampler([])
    with pytest.raises(ValueError):
        NeighborSampler([5, -3])
    with pytest.raises(TypeError):
        NeighborSampler([2.5])  # type: ignore[list-item]


@pytest.mark.parametrize("aggregator", ["mean", "sum", "gcn"])
@pytest.mark.parametrize(("in_feats", "out_feats"), [(6, 4), (3, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sageconv_csr_gradients_equal_the_gather_path(
    aggregator: str, in_feats: int, out_feats: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward and backward through CSR products (A @ x, A^T @ g) equal gather + index_add and the
    dense reference's gradients (multi-edges and an isolated destination included)."""
    import asyncgraph.nn.sage as sage

    src, dst = random_edges(60, 300, 5)
    dst_nodes = np.concatenate([np.unique(dst), [1000]])
    results = []
    for use_csr in (True, False):
        monkeypatch.setattr(sage, "SPMM_GRAD", use_csr)
        block = to_block(src, dst, dst_nodes)
        torch.manual_seed(1)
        conv = SAGEConv(in_feats, out_feats, aggregator=aggregator).to(dtype)
        h = torch.randn(block.num_src_nodes(), in_feats, dtype=dtype, requires_grad=True)
        out = conv(block, h)
        out.square().sum().backward()
        results.append((out.detach(), h.grad, [p.grad for p in conv.parameters()]))
        if dtype == torch.float64:
            h_ref = h.detach().clone().requires_grad_(True)
            dense_reference(block, h_ref, conv).square().sum().backward()
            torch.testing.assert_close(h.grad, h_ref.grad)
    (o1, g1, p1), (o2, g2, p2) = results
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(g1, g2)
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("aggregator", ["mean", "sum", "gcn"])
@pytest.mark.parametrize(("in_feats", "out_feats"), [(6, 4), (3, 5)])
def test_inference_neighbour_sums_equal_the_csr_product(
    aggregator: str, in_feats: int, out_feats: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``no_grad`` on CPU float32 a small block is summed by the compiled kernel (not a CSR
    product): the same outputs (multi-edges, an isolated destination), the kernel really used,
    bit for bit the same as its numpy form before it loads, and a block over the size bound
    takes the CSR product."""
    import asyncgraph.nn.sage as sage
    from asyncgraph.inference_kernel import NEIGHBOUR_SUM, wait_ready

    assert wait_ready(300.0)
    src, dst = random_edges(60, 300, 7)
    dst_nodes = np.concatenate([np.unique(dst), [1000]])
    torch.manual_seed(2)
    conv = SAGEConv(in_feats, out_feats, aggregator=aggregator)
    h = torch.randn(to_block(src, dst, dst_nodes).num_src_nodes(), in_feats)
    calls = []
    kernel = NEIGHBOUR_SUM.kernels
    assert kernel is not None
    monkeypatch.setattr(NEIGHBOUR_SUM, "kernels", lambda *a: (calls.append(1), kernel(*a))[1])
    outs = []
    for bound in (1 << 22, 0):  # kernel, then the CSR product
        monkeypatch.setattr(sage, "_SMALL_BLOCK", bound)
        with torch.no_grad():
            outs.append(conv(to_block(src, dst, dst_nodes), h))
    assert len(calls) == 1  # the kernel ran for the small bound only
    monkeypatch.setattr(sage, "_SMALL_BLOCK", 1 << 22)
    monkeypatch.setattr(NEIGHBOUR_SUM, "kernels", None)  # not loaded (yet): its numpy form
    monkeypatch.setattr(NEIGHBOUR_SUM, "ready", lambda: False)
    with torch.no_grad():
        torch.testing.assert_close(conv(to_block(src, dst, dst_nodes), h), outs[0], atol=0, rtol=0)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    ref = dense_reference(to_block(src, dst, dst_nodes), h.double(), conv.double()).float()
    torch.testing.assert_close(outs[0], ref, rtol=1e-5, atol=1e-5)
