"""Exported model artifacts: a ``GraphSAGE`` as a ``torch.export`` program over plain tensors,
served with no class path (no model code imported).

A block is an object, which neither ``torch.export`` nor TorchScript takes as an input; a SAGE
layer needs only three tensors of it: each edge's local source and destination index and the
destinations' in-degrees (whose length is the destination count). ``SAGETensorForm`` is the
model over those tensors (the same maths as ``SAGEConv``: ``index_add`` / ``scatter_reduce``
instead of the CSR products, equal to 1e-5), exported with dynamic sizes (nodes and edges per
layer), saved as ``model.pt2`` (``torch.export.save``) beside ``model.json`` (``"exported"``
instead of ``"class"``). ``ExportedModel`` takes blocks again: it hands the program each block's
tensors, so the serving core runs an exported model as it runs a module.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.errors import InvalidRequestError
from asyncgraph.nn.sage import GraphSAGE, SAGEConv

__all__ = [
    "EXPORTED_PROGRAM",
    "ExportedModel",
    "SAGETensorForm",
    "block_tensors",
    "export_program",
    "load_exported",
    "save_program",
]

EXPORTED_PROGRAM = "model.pt2"


def block_tensors(
    blocks: Sequence[Block],
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Per block: local source index, local destination index (int64 ``[E]``) and in-degrees
    (float32 ``[num_dst]``), the inputs of ``SAGETensorForm``."""
    srcs, dsts, degs = [], [], []
    for block in blocks:
        srcs.append(block.edge_index[0])
        dsts.append(block.edge_index[1])
        degs.append(block.csr()[2].to(torch.float32))
    return srcs, dsts, degs


class _LayerForm(nn.Module):
    """One ``SAGEConv`` over (h_src, src, dst, deg); its weights are the layer's own."""

    def __init__(self, conv: SAGEConv) -> None:
        super().__init__()
        if conv.norm is not None or conv.activation is not None:
            raise InvalidRequestError("export: SAGEConv with norm or activation is not supported")
        self.aggregator = conv.aggregator
        self.fc_pool, self.fc_self, self.fc_neigh, self.bias = (
            conv.fc_pool,
            conv.fc_self,
            conv.fc_neigh,
            conv.bias,
        )

    def forward(
        self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, deg: torch.Tensor
    ) -> torch.Tensor:
        num_dst = deg.shape[0]
        h_dst = h[:num_dst]
        if self.aggregator in ("mean", "sum", "gcn"):
            summed = h.new_zeros((num_dst, h.shape[1])).index_add(0, dst, h[src])
            if self.aggregator == "mean":
                h_neigh = summed / deg.clamp(min=1).unsqueeze(1)
            elif self.aggregator == "gcn":
                h_neigh = (summed + h_dst) / (deg + 1).unsqueeze(1)
            else:
                h_neigh = summed
        else:  # max / pool
            feat = torch.relu(self.fc_pool(h)) if self.fc_pool is not None else h
            index = dst.unsqueeze(1).expand(-1, feat.shape[1])
            h_neigh = feat.new_zeros((num_dst, feat.shape[1])).scatter_reduce(
                0, index, feat[src], reduce="amax", include_self=False
            )
        out: torch.Tensor = self.fc_neigh(h_neigh)
        if self.fc_self is not None:
            out = out + self.fc_self(h_dst)
        if self.bias is not None:
            out = out + self.bias
        return out


class SAGETensorForm(nn.Module):
    """``GraphSAGE`` in eval mode over tensors: ``forward(x, srcs, dsts, degs)`` (one entry per
    block, outermost first; see ``block_tensors``) -> the last block's destinations' rows."""

    def __init__(self, model: GraphSAGE) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_LayerForm(conv) for conv in model.layers)  # type: ignore[arg-type]

    def forward(
        self, x: torch.Tensor, srcs: list[torch.Tensor], dsts: list[torch.Tensor], degs: list[torch.Tensor]
    ) -> torch.Tensor:
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h, srcs[i], dsts[i], degs[i])
            if i != len(self.layers) - 1:
                h = torch.relu(h)
        return h


def _example(n_layers: int, in_feats: int) -> tuple[torch.Tensor, list[Block]]:
    """Small blocks whose sizes all differ (so no dimension is specialised to another's size)."""
    dst_counts = [5 + 2 * (n_layers - i) for i in range(n_layers + 1)]  # input side first, shrinking
    blocks = []
    for i in range(n_layers):
        n_src, n_dst = dst_counts[i], dst_counts[i + 1]
        src = torch.arange(n_src + 3) % n_src
        dst = torch.arange(n_src + 3) % n_dst
        blocks.append(to_block(src, dst, torch.arange(n_dst)))
        assert blocks[-1].num_src_nodes() == n_src
    return torch.randn(dst_counts[0], in_feats, generator=torch.Generator().manual_seed(0)), blocks


def export_program(model: nn.Module) -> Any:
    """The ``torch.export`` program of ``model``'s tensor form, every node and edge count dynamic
    (``artifact.export_model`` writes it into a model folder)."""
    if not isinstance(model, GraphSAGE):
        raise InvalidRequestError(f"export_model exports a GraphSAGE, got {type(model).__name__}")
    form = SAGETensorForm(model).eval()
    first = model.layers[0]
    assert isinstance(first, SAGEConv)
    x, blocks = _example(model.n_layers, int(first.in_feats))
    srcs, dsts, degs = block_tensors(blocks)
    nodes = [torch.export.Dim(f"nodes{i}", min=0) for i in range(model.n_layers + 1)]
    edges = [torch.export.Dim(f"edges{i}", min=0) for i in range(model.n_layers)]
    dynamic = (
        {0: nodes[0]},
        [{0: e} for e in edges],
        [{0: e} for e in edges],
        [{0: n} for n in nodes[1:]],
    )
    with torch.no_grad():
        return torch.export.export(form, (x, srcs, dsts, degs), dynamic_shapes=dynamic)


def save_program(program: Any, path: Path) -> None:
    """Write ``program`` to ``path`` atomically (a temporary file beside it, then renamed)."""
    tmp = path.with_name("tmp-" + path.name)
    torch.export.save(program, tmp)
    os.replace(tmp, path)


class ExportedModel(nn.Module):
    """An exported program behind the module interface the serving core calls:
    ``model(blocks, x)``."""

    def __init__(self, program: Any, source: str) -> None:
        super().__init__()
        self.program = program
        self.source = source

    def train(self, mode: bool = True) -> ExportedModel:
        """Only records the mode: the program is inference-only (it has no dropout to switch)."""
        self.training = mode
        return self

    def forward(self, blocks: Sequence[Block], x: torch.Tensor) -> torch.Tensor:
        srcs, dsts, degs = block_tensors(blocks)
        out: torch.Tensor = self.program(x, srcs, dsts, [d.to(x.device) for d in degs])
        return out


def load_exported(folder: Path, filename: str, device: str | torch.device) -> nn.Module:
    """The exported program ``folder / filename`` as an ``ExportedModel`` (no class imported)."""
    path = folder / filename
    try:
        program = torch.export.load(path).module()
    except Exception as exc:  # missing, truncated, another format: whatever the reader raises
        raise InvalidRequestError(
            f"{path}: not a loadable exported program ({type(exc).__name__}: {str(exc)[:300]})"
        ) from None
    return ExportedModel(program.to(device), str(path))
