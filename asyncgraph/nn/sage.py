"""GraphSAGE layers over ``Block``s, in pure torch (DGL's ``SAGEConv`` semantics).

Messages are aggregated with ``index_add`` / ``scatter_reduce`` over the block's edges, so a
layer is a handful of vectorised kernels and works with autograd. A destination with no
in-edges aggregates to zeros (for every aggregator, as DGL does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from asyncgraph.dataloading.block import Block
from asyncgraph.errors import InvalidRequestError, ShapeMismatchError

__all__ = ["GraphSAGE", "SAGEConv"]

_AGGREGATORS = ("mean", "sum", "max", "pool", "gcn")


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

    def forward(self, block: Block, h_src: torch.Tensor) -> torch.Tensor:
        """Features of the block's destination nodes, ``[num_dst_nodes, out_feats]``."""
        num_src, num_dst = block.num_src_nodes, block.num_dst_nodes
        if h_src.dim() != 2 or h_src.shape[0] != num_src:
            raise ShapeMismatchError(f"h_src must have shape [{num_src}, in_feats], got {tuple(h_src.shape)}")
        src, dst = block.edge_index[0].to(h_src.device), block.edge_index[1].to(h_src.device)
        h_dst = h_src[:num_dst]
        lin_first = self.in_feats > self.out_feats
        agg = self.aggregator

        if agg in ("mean", "sum", "gcn"):
            feat = self.fc_neigh(h_src) if lin_first else h_src
            summed = feat.new_zeros((num_dst, feat.shape[1])).index_add(0, dst, feat[src])
            if agg == "sum":
                h_neigh = summed
            else:
                deg = torch.bincount(dst, minlength=num_dst).to(feat.dtype).unsqueeze(1)
                if agg == "mean":
                    h_neigh = summed / deg.clamp(min=1)
                else:  # gcn: the node itself counts as one more neighbour
                    h_neigh = (summed + feat[:num_dst]) / (deg + 1)
            if not lin_first:
                h_neigh = self.fc_neigh(h_neigh)
        else:  # max / pool
            feat = torch.relu(self.fc_pool(h_src)) if self.fc_pool is not None else h_src
            index = dst.unsqueeze(1).expand(-1, feat.shape[1])
            h_neigh = feat.new_zeros((num_dst, feat.shape[1])).scatter_reduce(
                0, index, feat[src], reduce="amax", include_self=False
            )
            h_neigh = self.fc_neigh(h_neigh)

        out = h_neigh if self.fc_self is None else self.fc_self(h_dst) + h_neigh
        if self.bias is not None:
            out = out + self.bias
        if self.activation is not None:
            out = self.activation(out)
        if self.norm is not None:
            out = self.norm(out)
        return out

    def extra_repr(self) -> str:
        return f"in_feats={self.in_feats}, out_feats={self.out_feats}, aggregator={self.aggregator!r}"


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
        self.dropout = nn.Dropout(dropout)
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
