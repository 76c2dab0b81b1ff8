"""DGL's ``GraphConv`` and ``WeightBasis`` over blocks, in pure torch (same maths as DGL).

``GraphConv`` sums neighbour features with one CSR product (``torch.sparse.mm``) on the block's
device and normalises by degrees as DGL's ``norm`` says: ``"right"`` divides by the destination's
in-degree (a mean), ``"left"`` by the source's out-degree, ``"both"`` by the square roots of both,
``"none"`` not at all. A destination without in-edges gets zeros (DGL raises unless
``allow_zero_in_degree``; in a sampled block of one relation that is common, so it is allowed).
As in DGL, a source's out-degree (``"left"``, ``"both"``) is counted inside the block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from asyncgraph.dataloading.block import Block
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError
from asyncgraph.nn.sage import _csr_matrix

__all__ = ["GraphConv", "WeightBasis"]

_NORMS = ("none", "both", "right", "left")


class GraphConv(nn.Module):
    """``out = norm(A) @ (h_src W) + b`` over a block (DGL's ``GraphConv``; ``weight=False``
    takes the weight as ``forward(..., weight=W)``, as RGCN's per-relation weights do)."""

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        norm: str = "both",
        weight: bool = True,
        bias: bool = True,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
        allow_zero_in_degree: bool = False,
    ) -> None:
        super().__init__()
        if norm not in _NORMS:
            raise InvalidRequestError(f"norm must be one of {_NORMS}, got {norm!r}")
        self.in_feats, self.out_feats, self.norm = in_feats, out_feats, norm
        self.activation = activation
        self.allow_zero_in_degree = allow_zero_in_degree
        self.weight = nn.Parameter(torch.empty(in_feats, out_feats)) if weight else None
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weight, zero bias (DGL's initialisation)."""
        if self.weight is not None:
            nn.init.xavier_uniform_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        block: Block,
        feat: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        weight: torch.Tensor | None = None,
        edge_weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Destination features ``[num_dst_nodes, out_feats]`` from source features ``feat``
        (or the pair ``(h_src, h_dst)``; ``h_dst`` is not used, as in DGL)."""
        h_src = feat[0] if isinstance(feat, (tuple, list)) else feat
        num_src, num_dst = block.num_src_nodes(), block.num_dst_nodes()
        if h_src.dim() < 2 or h_src.shape[0] != num_src:
            raise ShapeMismatchError(f"h_src must have shape [{num_src}, in_feats], got {tuple(h_src.shape)}")
        if weight is not None and self.weight is not None:
            raise InvalidRequestError("GraphConv has its own weight; pass weight= only with weight=False")
        w = self.weight if weight is None else weight
        crow, col, in_deg = (t.to(h_src.device) for t in block.csr())
        dtype = h_src.dtype
        if edge_weight is not None:  # edge order -> CSR order
            order = torch.sort(block.edge_index[1].to(h_src.device), stable=True).indices
            values = edge_weight.to(dtype).reshape(-1)[order]
        else:
            values = torch.ones(col.numel(), dtype=dtype, device=h_src.device)
        if self.norm in ("left", "both"):
            out_deg = torch.bincount(col, minlength=num_src).clamp(min=1).to(dtype)
            scale = out_deg.pow(-0.5) if self.norm == "both" else out_deg.reciprocal()
            h_src = h_src * scale.view(-1, *([1] * (h_src.dim() - 1)))
        if w is not None and self.in_feats > self.out_feats:  # multiply first: fewer rows to sum
            h_src = h_src @ w
            w = None
        adj = _csr_matrix(crow, col, values, (num_dst, num_src))
        flat = h_src.reshape(num_src, -1)
        rst = torch.sparse.mm(adj, flat).reshape(num_dst, *h_src.shape[1:])
        if w is not None:
            rst = rst @ w
        if self.norm in ("right", "both"):
            deg = in_deg.clamp(min=1).to(dtype)
            scale = deg.pow(-0.5) if self.norm == "both" else deg.reciprocal()
            rst = rst * scale.view(-1, *([1] * (rst.dim() - 1)))
        if self.bias is not None:
            rst = rst + self.bias
        if self.activation is not None:
            rst = self.activation(rst)
        out: torch.Tensor = rst
        return out

    def extra_repr(self) -> str:
        return f"in={self.in_feats}, out={self.out_feats}, normalization={self.norm}"


class WeightBasis(nn.Module):
    """``num_outputs`` weights of ``shape`` as combinations of ``num_bases`` shared bases
    (basis decomposition, DGL's ``WeightBasis``); ``forward()`` returns ``[num_outputs, *shape]``."""

    def __init__(self, shape: tuple[int, ...], num_bases: int, num_outputs: int) -> None:
        super().__init__()
        if num_bases < 1 or num_outputs < 1:
            raise InvalidRequestError(
                f"num_bases and num_outputs must be >= 1, got {num_bases}, {num_outputs}"
            )
        self.shape, self.num_bases, self.num_outputs = tuple(shape), num_bases, num_outputs
        self.weight = nn.Parameter(torch.empty(num_bases, *shape))
        nn.init.xavier_uniform_(self.weight, gain=nn.init.calculate_gain("relu"))
        self.w_comp: nn.Parameter | None = None
        if num_outputs != num_bases:
            self.w_comp = nn.Parameter(torch.empty(num_outputs, num_bases))
            nn.init.xavier_uniform_(self.w_comp, gain=nn.init.calculate_gain("relu"))

    def forward(self, *args: Any) -> torch.Tensor:
        if self.w_comp is None:
            base: torch.Tensor = self.weight
            return base
        out: torch.Tensor = (self.w_comp @ self.weight.view(self.num_bases, -1)).view(
            self.num_outputs, *self.shape
        )
        return out
