"""Relational layers over :class:`~asyncgraph.dataloading.hetero_block.HeteroBlock`s (RGCN-style).

``HeteroGraphConv`` holds one module per relation (edge type name or canonical triple) and sums
the outputs that land on the same destination type, as DGL's ``HeteroGraphConv(aggregate='sum')``.
Each relation module is a homogeneous layer called as ``module(relation_block, h)`` where ``h``
is ``cat(h_dst[dst_type], h_src[src_type])``, so ``SAGEConv`` works per relation unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from asyncgraph.dataloading.hetero_block import HeteroBlock
from asyncgraph.errors import InvalidRequestError, UnknownTypeError
from asyncgraph.nn.sage import Dropout, SAGEConv

__all__ = ["HeteroGraphConv", "HeteroGraphSAGE"]


def _key(etype: tuple[str, str, str]) -> str:
    return ":".join(etype)


class HeteroGraphConv(nn.Module):
    """Per-relation modules, outputs summed per destination type (``aggregate='sum'``).

    ``mods`` is keyed by relation name or by ``"src:rel:dst"``; relations of the block with no
    module are skipped (as DGL does).
    """

    def __init__(self, mods: Mapping[str, nn.Module], aggregate: str = "sum") -> None:
        super().__init__()
        if aggregate not in ("sum", "mean"):
            raise InvalidRequestError(f"aggregate must be 'sum' or 'mean', got {aggregate!r}")
        self.mods = nn.ModuleDict(dict(mods))
        self.aggregate = aggregate

    def _module(self, etype: tuple[str, str, str]) -> nn.Module | None:
        for key in (_key(etype), etype[1]):
            if key in self.mods:
                return self.mods[key]
        return None

    def forward(
        self,
        block: HeteroBlock,
        h: Mapping[str, torch.Tensor],
        mod_args: Mapping[str, tuple[Any, ...]] | None = None,
        mod_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Destination features per node type from source features ``h`` per node type.

        ``mod_args`` / ``mod_kwargs`` (keyed by relation name, as in DGL) are passed on to that
        relation's module, e.g. RGCN's per-relation ``{"weight": W}``.
        """
        bad = [t for t in h if t not in block.ntypes]
        if bad:
            raise UnknownTypeError(f"features for unknown node type(s) {bad}; block has {block.ntypes}")
        outs: dict[str, list[torch.Tensor]] = {}
        for etype in block.canonical_etypes:
            mod = self._module(etype)
            s, _, d = etype
            if mod is None or s not in h or d not in h or block.num_dst_nodes(d) == 0:
                continue
            x = torch.cat([h[d][: block.num_dst_nodes(d)], h[s]])
            args = (mod_args or {}).get(etype[1], ())
            kwargs = (mod_kwargs or {}).get(etype[1], {})
            outs.setdefault(d, []).append(mod(block.relation_block(etype), x, *args, **kwargs))
        result: dict[str, torch.Tensor] = {}
        for d, parts in outs.items():
            total = torch.stack(parts).sum(0)
            result[d] = total / len(parts) if self.aggregate == "mean" else total
        return result


class HeteroGraphSAGE(nn.Module):
    """``n_layers`` of ``HeteroGraphConv`` over per-relation ``SAGEConv``s (ReLU + dropout between);
    returns logits of ``blocks[-1]``'s destination nodes of ``target`` type."""

    def __init__(
        self,
        canonical_etypes: Sequence[tuple[str, str, str]],
        in_feats: int,
        hidden: int,
        n_classes: int,
        n_layers: int,
        target: str,
        dropout: float = 0.5,
        aggregator: str = "mean",
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise InvalidRequestError(f"n_layers must be >= 1, got {n_layers}")
        dims = [in_feats] + [hidden] * (n_layers - 1) + [n_classes]
        self.layers = nn.ModuleList(
            HeteroGraphConv(
                {_key(c): SAGEConv(dims[i], dims[i + 1], aggregator=aggregator) for c in canonical_etypes}
            )
            for i in range(n_layers)
        )
        self.dropout = Dropout(dropout)
        self.target = target

    def forward(self, blocks: Sequence[HeteroBlock], x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if len(blocks) != len(self.layers):
            raise InvalidRequestError(f"expected {len(self.layers)} blocks, got {len(blocks)}")
        h: dict[str, Any] = dict(x)
        for i, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = {t: self.dropout(torch.relu(v)) for t, v in h.items()}
        if self.target not in h:
            raise UnknownTypeError(f"no output for node type {self.target!r}; got {sorted(h)}")
        out: torch.Tensor = h[self.target]
        return out
