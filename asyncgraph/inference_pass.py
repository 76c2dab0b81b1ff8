"""One layer of layer-wise inference over a set of nodes: homogeneous, typed (hetero) or PyG.

``asyncgraph.inference.layerwise_inference`` decides which nodes still need layer ``i`` and
handles progress, barriers and freeing; this module runs the layer over those nodes in bounded
batches with the prefetching node loader and writes the outputs and the progress rows.

Typed graphs: node tensors live over the homogeneous ID space (``distributed/hetero.py``), so a
layer's outputs are one stored tensor ``<name>.<i>`` for every node type (one width per layer);
each batch's ``{ntype: rows}`` output is put back in the block's homogeneous destination order
(``HeteroBlock.src_pos``) and written with one push.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from asyncgraph.errors import InvalidRequestError, ShapeMismatchError

__all__ = ["LayerPass", "call_layer", "hetero_out_dim", "is_pyg_layer"]


def is_pyg_layer(layer: nn.Module) -> bool:
    """Whether ``layer`` is a PyG ``MessagePassing`` layer (called as ``conv(x, edge_index)``);
    checked by class name so that PyG stays an optional dependency."""
    return any(
        c.__name__ == "MessagePassing" and "torch_geometric" in c.__module__ for c in type(layer).__mro__
    )


def call_layer(layer: nn.Module, block: Any, h: torch.Tensor) -> torch.Tensor:
    """``layer(block, h)`` for our (and DGL-style) layers; a PyG layer gets the bipartite pair
    ``(h_src, h_dst)`` and the block's ``edge_index`` with ``size=(num_src, num_dst)``."""
    if is_pyg_layer(layer):
        nd = block.num_dst_nodes()
        out: torch.Tensor = layer((h, h[:nd]), block.edge_index, size=(int(h.shape[0]), nd))
        return out
    result: torch.Tensor = layer(block, h)
    return result


def hetero_out_dim(layer: nn.Module) -> int | None:
    """The output width of a ``HeteroGraphConv``-style layer (``.mods``): its relation modules'
    common ``out_feats``/``out_channels``; ``None`` when it has no such modules."""
    mods = getattr(layer, "mods", None)
    if not isinstance(mods, nn.ModuleDict | dict) or not mods:
        return None
    dims = {getattr(m, "out_feats", getattr(m, "out_channels", None)) for m in mods.values()}
    if None in dims or len(dims) != 1:
        raise InvalidRequestError(
            f"{type(layer).__name__}'s relation modules have output widths {sorted(map(str, dims))}: "
            "layer-wise inference stores one width per layer; pass out_dims"
        )
    return int(next(iter(dims)))  # type: ignore[arg-type]


@dataclass
class LayerPass:
    """What every batch of every layer needs (shared by the homogeneous and typed passes)."""

    g: Any
    outputs: list[Any]
    progress: Any
    dims: list[int]
    batch_size: int
    fanouts: Sequence[Any] | None
    activation: Callable[[torch.Tensor], torch.Tensor] | None
    layer_fn: Callable[[int, nn.Module, Any, Any], Any] | None
    device: str | torch.device | None
    prefetch: int
    seed: int
    #: compute co-located full-neighbourhood ``SAGEConv`` layers straight from shared memory
    #: (``inference_direct``); False: every layer through the loader
    direct: bool = True
    #: seconds inside the layers (loader path: the layer call; direct path: neighbour sums and
    #: dense maps) and nodes done by each path, over all layers
    times: dict[str, float] = field(default_factory=lambda: {"layers": 0.0, "direct": 0.0, "loader": 0.0})
    _direct: Any = None

    def _direct_pass(self, i: int, layer: nn.Module) -> Any:
        """The direct pass, when layer ``i`` can take it (else None)."""
        from asyncgraph.inference_direct import DirectPass, direct_layer

        fan = None if self.fanouts is None else self.fanouts[i]
        usable = (
            self.direct
            and self.layer_fn is None
            and fan in (None, -1)
            and (self.device is None or torch.device(self.device).type == "cpu")
            and direct_layer(layer)
        )
        if not usable:
            return None
        if self._direct is None:
            self._direct = DirectPass(self.g, self.batch_size)
        return self._direct

    def _finish(self, i: int, ids: torch.Tensor, out: torch.Tensor, activate: bool = True) -> None:
        """Check a batch's outputs of layer ``i`` (after the activation between layers, unless
        a ``layer_fn`` made them) and write them with their progress rows."""
        out = self._activate(i, out) if activate else out
        if out.shape != (ids.numel(), self.dims[i]):
            raise ShapeMismatchError(
                f"layer {i} returned shape {tuple(out.shape)}, expected {(ids.numel(), self.dims[i])}"
            )
        self._write(i, ids, out)

    def _loader(self, i: int, nids: Any, source: str) -> Any:
        from asyncgraph.dataloading.node_loader import DistNodeDataLoader
        from asyncgraph.dataloading.sampler import NeighborSampler

        fan = -1 if self.fanouts is None else self.fanouts[i]
        return DistNodeDataLoader(
            self.g, nids, NeighborSampler([fan]), self.batch_size, shuffle=False, prefetch=self.prefetch,
            node_feats=[source], labels=None, seed=self.seed + i,
        )  # fmt: skip

    def _activate(self, i: int, out: torch.Tensor) -> torch.Tensor:
        last = i == len(self.outputs) - 1
        return out if self.activation is None or last else self.activation(out)

    def _write(self, i: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        self.outputs[i][ids] = rows.detach().to("cpu", torch.float32)
        self.progress[ids] = torch.full((ids.numel(),), i + 1, dtype=torch.int8)

    def run(self, i: int, layer: nn.Module, todo: np.ndarray, source: str) -> None:
        """Layer ``i`` for homogeneous node IDs ``todo``, reading rows of tensor ``source``:
        nodes of co-located partitions by the direct pass where the layer allows, the rest (all,
        otherwise) through the prefetching loader."""
        direct = self._direct_pass(i, layer)
        if direct is not None:
            here, todo = direct.split(todo)
            if here.size:
                before = sum(direct.times[k] for k in ("neighbour_sum", "dense"))
                direct.run(i, layer, here, source, self._finish)
                self.times["layers"] += sum(direct.times[k] for k in ("neighbour_sum", "dense")) - before
                self.times["direct"] += here.size
        if not todo.size:
            return
        for _, seeds, blocks in self._loader(i, todo, source):
            block = blocks[0]
            h = block.srcdata[source].to(torch.float32)
            if self.device is not None:
                block, h = block.to(self.device), h.to(self.device)
            t0 = time.perf_counter()
            if self.layer_fn is not None:
                out = self.layer_fn(i, layer, block, h)
            else:
                out = call_layer(layer, block, h)
            self.times["layers"] += time.perf_counter() - t0
            self._finish(i, seeds, out, activate=self.layer_fn is None)
        self.times["loader"] += todo.size

    def run_typed(self, i: int, layer: nn.Module, todo: np.ndarray, source: str) -> None:
        """Layer ``i`` of a heterogeneous model for homogeneous node IDs ``todo`` (any types):
        blocks are ``HeteroBlock``s, the layer maps ``{ntype: h_src}`` to ``{ntype: h_dst}``."""
        book = self.g.get_partition_book()
        types, per_type = book.map_to_per_ntype(todo)
        nids = {t: per_type[types == k] for k, t in enumerate(book.ntypes) if np.any(types == k)}
        for _, _, blocks in self._loader(i, nids, source):
            block = blocks[0]
            h = {t: d[source].to(torch.float32) for t, d in block.srcdata.items() if source in d}
            if self.device is not None:
                block, h = block.to(self.device), {t: v.to(self.device) for t, v in h.items()}
            if self.layer_fn is not None:
                out = self.layer_fn(i, layer, block, h)
            else:
                out = {t: self._activate(i, v) for t, v in layer(block, h).items()}
            dst = block.homo.dstnodes.cpu()
            rows = torch.empty((dst.numel(), self.dims[i]), dtype=torch.float32)
            for t in block.ntypes:
                n = block.num_dst_nodes(t)
                if n == 0:
                    continue
                got = out.get(t) if isinstance(out, dict) else None
                if got is None:
                    raise ShapeMismatchError(
                        f"layer {i} gave no output for node type {t!r} ({n} nodes in the batch): every "
                        "node type needs an in-relation in the model, or leave the type out of nodes"
                    )
                if tuple(got.shape) != (n, self.dims[i]):
                    raise ShapeMismatchError(
                        f"layer {i} returned shape {tuple(got.shape)} for {t!r}, expected {(n, self.dims[i])}"
                    )
                pos = block.src_pos[t]
                rows[torch.from_numpy(pos[pos < dst.numel()])] = got.detach().to("cpu", torch.float32)
            self._write(i, dst, rows)
