"""Layer-wise distributed inference: every node's output of a model made of layers over blocks.

Sampled mini-batch inference recomputes the lower layers of every batch's neighbourhood; layer-wise
inference computes each layer once for every node (DGL's ``inference()`` loop in its examples,
made an API here). For layer ``i`` every trainer takes its share of the nodes (``node_split``),
builds one-layer blocks in batches of ``batch_size`` destinations (all in-edges, or ``fanouts[i]``
sampled), reads the previous layer's rows from a DistTensor, writes its outputs to layer ``i``'s
DistTensor, and meets the others at a barrier before layer ``i + 1``. The prefetching node loader
builds batch ``k + 1``'s block and pulls its input rows while batch ``k`` computes, so memory per
trainer is bounded by the batch (its block and rows), not by the graph. Full-neighbourhood
``SAGEConv`` layers over nodes of co-located partitions skip all of that: ``inference_direct``
sums the source rows in place in the partitions' shared memory (one thread's work per trainer).

Durability and resuming: outputs are persistent tensors ``<name>.<i>`` and a per-node progress
tensor ``<name>.done`` (int8: layers finished for that node) is written after each batch's
outputs. With the servers run with ``--state-dir`` (and ``--wal``) they survive a server restart;
``resume=True`` skips every node whose layer is already done, so a job restarted after a trainer
was killed continues from where it stopped (the last finished layer, and within a layer the
batches already written). Layer ``i - 1``'s outputs are deleted once layer ``i`` is complete
(``keep_intermediate=False``), so at most two layers' outputs exist at a time.

Exact: with full neighbourhoods (``fanouts=None``) and a model in ``eval()`` mode the result equals a
full-graph forward pass on one machine up to floating-point summation order (tested to 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from asyncgraph.arrays import as_id_array
from asyncgraph.errors import InvalidRequestError, UnknownTypeError

__all__ = ["LayerFn", "layerwise_inference", "write_npy"]

#: ``(layer index, layer, block, input rows of the block's sources) -> output rows of its dsts``.
LayerFn = Callable[[int, nn.Module, Any, torch.Tensor], torch.Tensor]
_NPY_CHUNK_ROWS = 1 << 16


def _layers_of(model: nn.Module | Sequence[nn.Module]) -> list[nn.Module]:
    for attr in ("layers", "convs"):  # our and DGL-style models; PyG's BasicGNN
        if isinstance(model, nn.Module) and hasattr(model, attr):
            layers: Sequence[nn.Module] = getattr(model, attr)
            return list(layers)
    if isinstance(model, Sequence) and all(isinstance(m, nn.Module) for m in model):
        return list(model)
    raise InvalidRequestError(
        "model must have a .layers (or PyG's .convs) list of modules or be a sequence of modules"
    )


def _out_dim(layer: nn.Module, given: Sequence[int] | None, i: int) -> int:
    from asyncgraph.inference_pass import hetero_out_dim

    if given is not None:
        return int(given[i])
    dim = getattr(layer, "out_feats", getattr(layer, "out_channels", None))
    if dim is None:
        dim = hetero_out_dim(layer)
    if dim is None:
        raise InvalidRequestError(f"layer {i} ({type(layer).__name__}) has no out_feats: pass out_dims")
    return int(dim)


def _edge_balanced_share(g: Any) -> torch.Tensor:
    """This trainer's contiguous range of node IDs, cut so that every trainer gets the same
    ``in-degree + mean in-degree`` total: a layer costs per in-edge (a source row to pull and
    aggregate) and per node (the dense maps), and partitions balanced by nodes can differ
    several-fold in in-edges (METIS on DGL's graph: 1.2M vs 9.3M), which left one trainer doing
    most of a layer while the other waited at the barrier."""
    from asyncgraph.distributed.context import rank_world

    rank, world = rank_world()
    n = g.num_nodes()
    if world == 1 or n == 0:
        return torch.arange(n if rank == 0 else 0, dtype=torch.int64)
    deg = np.asarray(g.in_degrees(), dtype=np.float64)
    cost = np.cumsum(deg + deg.mean())
    cuts = np.searchsorted(cost, cost[-1] * np.arange(1, world) / world, side="left")
    bounds = [0, *(int(c) for c in cuts), n]
    return torch.arange(bounds[rank], bounds[rank + 1], dtype=torch.int64)


def _my_nodes(g: Any, nodes: Any, balance: str = "nodes") -> torch.Tensor:
    """This trainer's homogeneous node IDs: ``nodes`` (IDs, or ``{ntype: per-type IDs}`` on a typed
    graph), by default its share of every node (of every type): ``balance="nodes"`` its
    ``node_split`` share, ``"edges"`` (homogeneous graphs) an in-edge-balanced range."""
    from asyncgraph.dataloading.fetch import client_of
    from asyncgraph.distributed.context import rank_world
    from asyncgraph.distributed.split import node_split

    book = g.get_partition_book()
    if isinstance(nodes, Mapping):
        bad = [t for t in nodes if t not in book.ntypes]
        if bad:
            raise UnknownTypeError(f"nodes: unknown node type(s) {bad}; known: {book.ntypes}")
        parts = [book.map_to_homo_nid(as_id_array(v, f"nodes[{t!r}]"), t) for t, v in nodes.items()]
        return torch.from_numpy(np.concatenate(parts) if parts else np.empty(0, dtype=np.int64))
    if nodes is not None:
        return torch.from_numpy(as_id_array(nodes, "nodes"))
    if not book.is_hetero:
        if balance == "edges":
            base = _edge_balanced_share(g)
        else:
            base = node_split(torch.ones(g.num_nodes(), dtype=torch.bool), book, force_even=True)
        added = client_of(g).added_nodes()  # a live graph's nodes at the start (issue 35)
        if added is None or not added.size:
            return base
        rank, world = rank_world()
        return torch.cat([base, torch.from_numpy(added[rank::world])])
    split = {
        t: node_split(torch.ones(book.num_nodes_of(t), dtype=torch.bool), book, force_even=True, ntype=t)
        for t in book.ntypes
    }
    return _my_nodes(g, split, balance)


def layerwise_inference(
    g: Any,
    model: nn.Module | Sequence[nn.Module],
    x: Any,
    *,
    batch_size: int = 4096,
    fanouts: Sequence[Any] | None = None,
    activation: Callable[[torch.Tensor], torch.Tensor] | None = torch.relu,
    layer_fn: LayerFn | None = None,
    out_dims: Sequence[int] | None = None,
    nodes: Any = None,
    name: str = "inference",
    resume: bool = False,
    keep_intermediate: bool = False,
    device: str | torch.device | None = None,
    prefetch: int = 2,
    seed: int = 0,
    balance: str = "edges",
    direct: bool = True,
    stats: dict[str, float] | None = None,
) -> Any:
    """Outputs of ``model``'s last layer for every node, as a persistent DistTensor.

    ``model``: a module with ``.layers`` (``GraphSAGE``, DGL-style models) or ``.convs`` (PyG's
    ``BasicGNN`` models) or a list of layers, each called as ``layer(block, h_src)`` (a PyG
    ``MessagePassing`` layer as ``layer((h_src, h_dst), block.edge_index, size=...)``);
    ``activation`` runs between layers (not after the last), or ``layer_fn(i, layer, block,
    h_src)`` replaces the whole step. ``x``: the input features, a node DistTensor
    (``g.ndata["feat"]``) or its name. ``nodes``: this trainer's nodes (default: a contiguous
    range of IDs with an equal share of in-edges, ``balance="edges"``, or ``balance="nodes"``:
    ``node_split``'s equal share of its partition's nodes). ``fanouts[i]`` samples layer ``i``'s
    in-edges instead of taking them all. Collective: every trainer calls it with the same
    arguments. The model runs under ``torch.no_grad()`` in ``eval()`` mode (restored after).

    Heterogeneous graphs: each layer maps ``{ntype: h_src}`` to ``{ntype: h_dst}`` over a
    ``HeteroBlock`` (``nn.HeteroGraphConv``); ``nodes`` is ``{ntype: per-type IDs}`` (default:
    every type's ``node_split`` share) and the result is ``{ntype: DistTensor}``, per-type views
    of the last layer's outputs (``fanouts[i]`` may be a dict by edge type).

    ``direct`` (default): a full-neighbourhood ``SAGEConv`` layer (mean, sum, gcn) over nodes of
    co-located partitions is computed straight from their shared memory, without blocks, pulls
    or a loader thread (``asyncgraph.inference_direct``; same results). ``stats``, if given, is
    filled with this trainer's seconds inside the layers and nodes done by each path.
    """
    from asyncgraph.distributed.tensor import DistTensor
    from asyncgraph.inference_pass import LayerPass

    layers = _layers_of(model)
    if not layers:
        raise InvalidRequestError("model has no layers")
    if fanouts is not None and len(fanouts) != len(layers):
        raise InvalidRequestError(f"fanouts names {len(fanouts)} layers, the model has {len(layers)}")
    if out_dims is not None and len(out_dims) != len(layers):
        raise InvalidRequestError(f"out_dims names {len(out_dims)} layers, the model has {len(layers)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidRequestError(f"batch_size must be a positive int, got {batch_size!r}")
    if not name or "/" in name or ":" in name or "#" in name:
        raise InvalidRequestError(f"name {name!r} must be non-empty, without '/', ':' or '#'")
    x_name = x if isinstance(x, str) else getattr(x, "name", None)
    if not isinstance(x_name, str) or not (  # a heterograph's x may be stored per type
        x_name in g.ndata or any(x_name in g.ndata.typed_names(t) for t in g.ntypes)
    ):
        raise InvalidRequestError(f"x must be a node tensor of the graph (or its name), got {x!r}")
    typed = bool(g.get_partition_book().is_hetero)
    num_nodes = g.num_nodes()
    dims = [_out_dim(layer, out_dims, i) for i, layer in enumerate(layers)]
    if balance not in ("edges", "nodes"):
        raise InvalidRequestError(f"balance must be 'edges' or 'nodes', got {balance!r}")
    mine = _my_nodes(g, nodes, balance)
    mine_np = mine.numpy()
    progress = DistTensor((num_nodes,), torch.int8, f"{name}.done", persistent=True, part_policy="node")
    outputs = [
        DistTensor((num_nodes, d), torch.float32, f"{name}.{i}", persistent=True, part_policy="node")
        for i, d in enumerate(dims)
    ]
    step = LayerPass(
        g, outputs, progress, dims, batch_size, fanouts, activation, layer_fn, device, prefetch, seed, direct
    )
    if not resume:  # a fresh run: no node has finished any layer
        progress[mine] = torch.zeros(mine.numel(), dtype=torch.int8)
        g.barrier(f"{name}.start")
    was_training = [m.training for m in layers]
    for m in layers:
        m.eval()
    try:
        with torch.no_grad():
            for i, layer in enumerate(layers):
                done = progress[mine].numpy() if mine.numel() else np.empty(0, dtype=np.int8)
                todo = mine_np[done <= i]
                source = x_name if i == 0 else outputs[i - 1].name
                if todo.size:
                    (step.run_typed if typed else step.run)(i, layer, todo, source)
                g.barrier(f"{name}.layer{i}")
                if i > 0 and not keep_intermediate and g.rank() == 0:
                    outputs[i - 1].delete()  # layer i is complete everywhere: its input can go
                if i > 0 and not keep_intermediate:
                    g.barrier(f"{name}.freed{i}")
    finally:
        for m, was in zip(layers, was_training, strict=True):
            m.train(was)
        if stats is not None:
            stats.update(step.times)
    if not typed:
        return outputs[-1]
    last = outputs[-1]
    return {
        t: DistTensor((g.num_nodes(t), dims[-1]), torch.float32, last.name, persistent=True,
                      part_policy=g.get_node_partition_policy(t))
        for t in g.ntypes
    }  # fmt: skip


def write_npy(out: Any, path: str | Path, orig_nids: Any = None, chunk_rows: int = _NPY_CHUNK_ROWS) -> Path:
    """Write every row of node tensor ``out`` to ``path`` (``.npy``), read in bounded chunks.

    With ``orig_nids`` (``orig_nids[new_id] == original_id``, from ``partition_graph`` or
    ``load_orig_ids``) row ``v`` of the file is original node ``v``'s; otherwise rows follow the
    partitioned IDs. The file is written beside ``path`` and renamed into place when complete.
    """
    path = Path(path)
    n = len(out)
    mapping = None if orig_nids is None else as_id_array(orig_nids, "orig_nids")
    if mapping is not None and mapping.size != n:
        raise InvalidRequestError(f"orig_nids has {mapping.size} entries, the tensor {n} rows")
    tmp = path.with_name(path.name + ".tmp.npy")
    dtype = np.dtype(str(out.dtype).replace("torch.", ""))
    arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=tuple(out.shape))
    step = max(1, int(chunk_rows))
    for start in range(0, n, step):
        stop = min(n, start + step)
        rows = out[start:stop].numpy()
        if mapping is None:
            arr[start:stop] = rows
        else:
            arr[mapping[start:stop]] = rows
    arr.flush()
    del arr
    tmp.replace(path)
    return path
