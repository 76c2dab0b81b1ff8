"""GraphSAGE layers over ``Block``s, in pure torch (DGL's ``SAGEConv`` semantics).

Messages are aggregated with ``index_add`` / ``scatter_reduce`` over the block's edges, so a
layer is a handful of vectorised kernels and works with autograd. For floating-point features
on the CPU or CUDA, ``mean``/``sum``/``gcn`` use sparse CSR matrix products instead (forward
``A @ x``, backward ``A^T @ g`` with the transpose cached on the block; no ``[edges, feats]``
gather).
A destination with no in-edges aggregates to zeros (for every aggregator, as DGL does).

Every kernel runs on the block's device (no host round trips: the CSR comes cached with the
block, or is built there with torch ops). Under ``torch.autocast`` (or with float16/bfloat16
features) sums are accumulated in float32 and cast back to the features' dtype: there are no
half-precision sparse kernels on CPU, and half-precision sums over many neighbours lose digits.

``Dropout`` is ``nn.Dropout`` with masks drawn by numpy's PCG64 (16-bit uniform thresholds,
seeded from torch's generator, so ``torch.manual_seed`` still fixes them): torch's CPU
``bernoulli_`` costs several times the rest of a GraphSAGE layer on hidden-256 activations.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from asyncgraph.dataloading.block import Block
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError
from asyncgraph.inference_kernel import neighbour_sum

__all__ = ["Dropout", "GraphSAGE", "SAGEConv"]

_AGGREGATORS = ("mean", "sum", "max", "pool", "gcn")
# dtypes aggregated as they are; others (float16/bfloat16) are summed in float32 and cast back
_SPMM_DTYPES = (torch.float32, torch.float64)
_SPMM_DEVICES = ("cpu", "cuda")
# Aggregate features that need a gradient with CSR products too (forward A @ x, backward A^T @ g);
# False falls back to gather + index_add (kept for A/B measurement: benchmarks/sage_ab.py).
SPMM_GRAD = True


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums over neighbours accumulate in."""
    return dtype if dtype in _SPMM_DTYPES else torch.float32


class SAGEConv(nn.Module):
    """``out = fc_self(h_dst) + fc_neigh(agg_{src -> dst} h_src) (+ bias)``, then activation, norm.

    Aggregators: ``mean``, ``sum``, ``max`` (elementwise max of neighbour features), ``pool``
    (max of ``relu(fc_pool(h_src))``, DGL's pool) and ``gcn`` (``fc_neigh`` of the mean over the
    neighbours and the node itself, no ``fc_self``). For ``mean``/``sum``/``gcn`` ``fc_neigh`` is
    applied before aggregation when it shrinks the features (fewer rows to scatter), as DGL does.
    """

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        aggregator: str = "mean",
        bias: bool = True,
        norm: Callable[[torch.Tensor], torch.Tensor] | None = None,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        if aggregator not in _AGGREGATORS:
            raise InvalidRequestError(f"unknown aggregator {aggregator!r}; expected one of {_AGGREGATORS}")
        self.in_feats = in_feats
        self.out_feats = out_feats
        self.aggregator = aggregator
        self.norm = norm
        self.activation = activation
        self.fc_pool = nn.Linear(in_feats, in_feats) if aggregator == "pool" else None
        self.fc_self = nn.Linear(in_feats, out_feats, bias=False) if aggregator != "gcn" else None
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights with the ReLU gain and zero biases, as DGL initialises them."""
        gain = nn.init.calculate_gain("relu")
        for lin in (self.fc_pool, self.fc_self, self.fc_neigh):
            if lin is not None:
                nn.init.xavier_uniform_(lin.weight, gain=gain)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, block: Block, h_src: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Features of the block's destination nodes, ``[num_dst_nodes, out_feats]``.

        ``h_src`` is the sources' features (the destinations' are its first rows) or, as DGL's
        layers accept, the pair ``(h_src, h_dst)``.
        """
        num_src, num_dst = block.num_src_nodes(), block.num_dst_nodes()
        given_dst: torch.Tensor | None = None
        if isinstance(h_src, (tuple, list)):
            if len(h_src) != 2:
                raise ShapeMismatchError(f"a feature pair must be (h_src, h_dst), got {len(h_src)} tensors")
            h_src, given_dst = h_src
            if given_dst.dim() != 2 or given_dst.shape[0] != num_dst:
                raise ShapeMismatchError(
                    f"h_dst must have shape [{num_dst}, in_feats], got {tuple(given_dst.shape)}"
                )
        if h_src.dim() != 2 or h_src.shape[0] != num_src:
            raise ShapeMismatchError(f"h_src must have shape [{num_src}, in_feats], got {tuple(h_src.shape)}")
        src, dst = block.edge_index[0].to(h_src.device), block.edge_index[1].to(h_src.device)
        h_dst = h_src[:num_dst] if given_dst is None else given_dst
        lin_first = self.in_feats > self.out_feats
        agg = self.aggregator
        exact_dtype = h_src.dtype in _SPMM_DTYPES
        if lin_first and exact_dtype and not torch.is_grad_enabled() and agg in ("mean", "sum", "gcn"):
            lin_first = _lin_first_cheaper(num_src, num_dst, int(src.numel()), self.in_feats, self.out_feats)

        if agg in ("mean", "sum", "gcn"):
            feat = self.fc_neigh(h_src) if lin_first else h_src
            if (
                feat.device.type in _SPMM_DEVICES
                and feat.is_floating_point()
                and (SPMM_GRAD or not feat.requires_grad)
            ):
                h_neigh = _spmm_aggregate(block, feat, agg)
            else:
                acc = _acc_dtype(feat.dtype)
                feat_acc = feat.to(acc)
                summed = feat_acc.new_zeros((num_dst, feat.shape[1])).index_add(0, dst, feat_acc[src])
                if agg == "sum":
                    h_neigh = summed
                else:
                    deg = torch.bincount(dst, minlength=num_dst).to(acc).unsqueeze(1)
                    if agg == "mean":
                        h_neigh = summed / deg.clamp(min=1)
                    else:  # gcn: the node itself counts as one more neighbour
                        h_neigh = (summed + feat_acc[:num_dst]) / (deg + 1)
                h_neigh = h_neigh.to(feat.dtype)
            if not lin_first:
                h_neigh = self.fc_neigh(h_neigh)
        else:  # max / pool
            feat = torch.relu(self.fc_pool(h_src)) if self.fc_pool is not None else h_src
            index = dst.unsqueeze(1).expand(-1, feat.shape[1])
            h_neigh = feat.new_zeros((num_dst, feat.shape[1])).scatter_reduce(
                0, index, feat[src], reduce="amax", include_self=False
            )
            h_neigh = self.fc_neigh(h_neigh)

        return self.combine(h_neigh, h_dst)

    def combine(self, h_neigh: torch.Tensor, h_dst: torch.Tensor) -> torch.Tensor:
        """The layer's output from its transformed neighbour aggregate and the destinations' own
        features: fc_self(h_dst) + h_neigh + bias with the sum fused into the matmuls (fewer
        passes over [num_dst, out_feats] activations, forward and backward; DGL's maths), then
        activation and norm. Also used by inference's direct pass (``inference_direct.py``)."""
        if self.fc_self is None:
            out = h_neigh if self.bias is None else h_neigh + self.bias.to(h_neigh.dtype)
        else:
            if self.bias is not None:
                h_neigh = h_neigh + self.bias
            out = torch.addmm(h_neigh, h_dst, self.fc_self.weight.t())
        if self.activation is not None:
            out = self.activation(out)
        if self.norm is not None:
            out = self.norm(out)
        return out

    def extra_repr(self) -> str:
        return f"in_feats={self.in_feats}, out_feats={self.out_feats}, aggregator={self.aggregator!r}"


def _lin_first_cheaper(num_src: int, num_dst: int, num_edges: int, d_in: int, d_out: int) -> bool:
    """Whether ``fc_neigh`` before the CSR product costs fewer multiply-adds than after it.

    DGL's rule (first when ``in_feats > out_feats``) keeps per-edge messages small; with CSR
    products there are none, and the linear map before runs on every source row: in a full
    neighbourhood block (layer-wise inference: ~one source per edge) after is cheaper, e.g.
    256 -> 50 on 4096 destinations with 41k sources: 0.52 G multiply-adds before, 0.06 G after.
    Used under ``no_grad`` with float32/float64 features only (training keeps DGL's order; in half
    precision the order changes the rounding too much to swap it silently)."""
    before = num_src * d_in * d_out + num_edges * d_out
    after = num_edges * d_in + num_dst * d_in * d_out
    return before < after


_CSR_WARNED = False
#: edges x features up to which an inference block is summed by the compiled kernel
_SMALL_BLOCK = 1 << 22
_NUMPY_FLOATS: dict[torch.dtype, type[np.floating[Any]]] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
}


def _csr_matrix(
    crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    global _CSR_WARNED
    if _CSR_WARNED:  # torch warns once per process; a catch_warnings per block cost ~5 us
        return torch.sparse_csr_tensor(crow, col, values, size=size, check_invariants=False)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        made = torch.sparse_csr_tensor(crow, col, values, size=size, check_invariants=False)
    _CSR_WARNED = True
    return made


def _adjacency(
    block: Block, agg: str, dtype: torch.dtype, device: torch.device, transposed: bool
) -> torch.Tensor:
    """The block's ``[num_dst, num_src]`` aggregation matrix (or its transpose) as CSR on
    ``device``, cached on the block; built with torch ops there (no host round trip)."""
    key = f"spmm:{agg}:{dtype}:{device}:{transposed}"
    adj: torch.Tensor | None = block._cache.get(key)
    if adj is not None:
        return adj
    crow, col, deg = (t.to(device) for t in block.csr())
    np_dtype = _NUMPY_FLOATS.get(dtype)
    if agg == "mean" and device.type == "cpu" and np_dtype is not None:  # numpy: one op, not ~5
        in_degrees = deg.numpy()
        one = np_dtype(1.0)
        values = torch.from_numpy(np.repeat(one / np.maximum(in_degrees, 1).astype(np_dtype), in_degrees))
    elif agg == "mean":
        values = (1.0 / deg.clamp(min=1).to(dtype)).repeat_interleave(deg, output_size=col.numel())
    else:
        values = torch.ones(col.numel(), dtype=dtype, device=device)
    n_dst, n_src = block.num_dst_nodes(), block.num_src_nodes()
    if not transposed:
        adj = _csr_matrix(crow, col, values, (n_dst, n_src))
    else:  # rows = sources: entries sorted by source (stable), row index = their destination
        order = torch.sort(col, stable=True).indices
        counts = torch.bincount(col, minlength=n_src)
        crow_t = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        row = torch.arange(n_dst, dtype=col.dtype, device=device).repeat_interleave(
            deg, output_size=col.numel()
        )
        adj = _csr_matrix(crow_t, row[order], values[order], (n_src, n_dst))
    block._cache[key] = adj
    return adj


class _SpMM(torch.autograd.Function):
    """``adj @ x`` with ``x``'s gradient ``adj_t() @ g`` (CSR x dense products, no gather); the
    transpose is built on first backward and cached on the block."""

    @staticmethod
    def forward(
        ctx: Any, adj: torch.Tensor, adj_t: Callable[[], torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        ctx.adj_t = adj_t
        out: torch.Tensor = torch.sparse.mm(adj, x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        with torch.autocast(grad.device.type, enabled=False):  # the product stays in grad's dtype
            return None, None, torch.sparse.mm(ctx.adj_t(), grad.contiguous())


def _spmm_aggregate(block: Block, feat: torch.Tensor, agg: str) -> torch.Tensor:
    """``sum``/``mean``/``gcn`` aggregation of ``feat`` as CSR products on its device, forward
    and (when ``feat`` needs a gradient) backward.

    Half-precision features are multiplied in float32 and the result cast back.
    """
    acc = _acc_dtype(feat.dtype)
    if not torch.is_grad_enabled() and feat.device.type == "cpu" and feat.dtype == torch.float32:
        summed = _neighbour_sum_cpu(block, feat)
        if summed is not None:  # inference on CPU: no CSR tensor to build, one pass
            return _finish_sum(block, summed, feat, agg)
    adj = _adjacency(block, agg, acc, feat.device, transposed=False)
    feat_acc = feat.to(acc)
    with torch.autocast(feat.device.type, enabled=False):  # the product stays in ``acc``
        if feat_acc.requires_grad:
            adj_t = functools.partial(_adjacency, block, agg, acc, feat.device, True)
            out: torch.Tensor = _SpMM.apply(adj, adj_t, feat_acc)  # type: ignore[no-untyped-call]
        else:
            out = torch.sparse.mm(adj, feat_acc)
    if agg == "gcn":  # the node itself counts as one more neighbour
        deg = block.csr()[2].to(feat.device)
        out = (out + feat_acc[: block.num_dst_nodes()]) / (deg.to(acc) + 1).unsqueeze(1)
    return out.to(feat.dtype)


def _neighbour_sum_cpu(block: Block, feat: torch.Tensor) -> np.ndarray | None:
    """Per destination, the sum of its sources' rows of CPU float32 ``feat`` (inference), in edge
    order: the single-threaded compiled kernel of direct inference (its numpy form, bit for bit
    the same sums, until it is loaded); None for large blocks (torch's CSR product uses every
    thread) and non-contiguous rows. For online inference's small blocks, building a sparse
    tensor and its product cost ~0.25 ms of a ~1 ms forward."""
    crow, col, _ = block.csr()
    if feat.dim() != 2 or not feat.is_contiguous() or col.numel() * feat.shape[1] > _SMALL_BLOCK:
        return None
    starts = crow.numpy()
    out = np.zeros((block.num_dst_nodes(), feat.shape[1]), dtype=np.float32)
    neighbour_sum(out, starts[:-1], starts[1:], col.numpy(), feat.numpy(), 0)
    return out


def _finish_sum(block: Block, summed: np.ndarray, feat: torch.Tensor, agg: str) -> torch.Tensor:
    """``sum``/``mean``/``gcn`` from the per-destination neighbour sums (in place)."""
    if agg != "sum":
        deg = block.csr()[2].numpy()
        if agg == "gcn":  # the node itself counts as one more neighbour
            summed += feat.numpy()[: summed.shape[0]]
            summed /= (deg + 1).astype(np.float32)[:, None]
        else:
            summed /= np.maximum(deg, 1).astype(np.float32)[:, None]
    return torch.from_numpy(summed)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, scaling and train/eval behaviour) with a fast CPU mask.

    Keep-masks come from 16-bit uniforms of a numpy PCG64 generator seeded from torch's default
    generator, so a unit is kept with probability ``1 - round(p * 2**16) / 2**16`` (exact for
    ``p = 0.5``; within ``2**-17`` of ``1 - p`` otherwise). Other devices and dtypes use
    ``F.dropout``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = float(self.p)
        if not self.training or p == 0.0:
            return x
        if p >= 1.0 or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
            return F.dropout(x, p, True, self.inplace)
        seed = int(torch.randint(0, 1 << 62, (1,), dtype=torch.int64))
        bits = np.frombuffer(np.random.default_rng(seed).bytes(2 * x.numel()), dtype=np.uint16)
        scale = np.dtype(np.float32 if x.dtype == torch.float32 else np.float64).type(1.0 / (1.0 - p))
        mask = np.multiply(bits >= round(p * 65536), scale)
        mask_t = torch.from_numpy(mask).view(x.shape)
        return x.mul_(mask_t) if self.inplace else x * mask_t


class GraphSAGE(nn.Module):
    """Stack of ``n_layers`` SAGEConvs (ReLU + dropout between layers) mapping blocks to logits."""

    def __init__(
        self,
        in_feats: int,
        hidden: int,
        n_classes: int,
        n_layers: int,
        dropout: float = 0.5,
        aggregator: str = "mean",
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise InvalidRequestError(f"n_layers must be >= 1, got {n_layers}")
        dims = [in_feats] + [hidden] * (n_layers - 1) + [n_classes]
        self.layers = nn.ModuleList(
            SAGEConv(dims[i], dims[i + 1], aggregator=aggregator) for i in range(n_layers)
        )
        self.dropout = Dropout(dropout)
        self.n_layers = n_layers

    def forward(self, blocks: Sequence[Block], x: torch.Tensor) -> torch.Tensor:
        """Logits of ``blocks[-1]``'s destination nodes from input features ``x`` of ``blocks[0]``."""
        if len(blocks) != self.n_layers:
            raise InvalidRequestError(f"expected {self.n_layers} blocks, got {len(blocks)}")
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
            h = layer(block, h)
            if i != self.n_layers - 1:
                h = self.dropout(torch.relu(h))
        return h
