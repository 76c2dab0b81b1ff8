"""Prefetching loaders that yield PyG ``Data``/``HeteroData``: PyG's distributed loaders' names.

``DistNeighborLoader`` / ``DistLinkNeighborLoader`` run on asyncgraph's prefetch engine
(``dataloading/prefetch.py``): while the model computes on batch ``k``, batches ``k+1..k+prefetch``
are sampled by the servers (:func:`~asyncgraph.pyg.sampler.sample_hops`) and their ``x``/``y``
pulled, on the client's event loop; with ``device=`` each batch is also copied there in the
background. A batch is prepared as plain dicts of tensors (what the device copier walks) and
becomes a ``Data``/``HeteroData`` when the training loop receives it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Mapping
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NegativeSampling

from asyncgraph.dataloading.fetch import AUTO, Auto, client_of, mask_or_ids
from asyncgraph.dataloading.prefetch import PrefetchingLoader
from asyncgraph.errors import InvalidRequestError, UnknownTypeError

from .sampler import DistNeighborSampler, check_options

__all__ = ["DistLinkNeighborLoader", "DistNeighborLoader"]


def _graph_of(data: Any) -> Any:
    """The DistGraph behind ``data``: a DistGraph, or a ``(DistFeatureStore, DistGraphStore)`` pair."""
    return data[1].graph if isinstance(data, tuple) else data


def _homo_payload(out: Any, x: Any, y: Any) -> dict[str, Any]:
    return {
        "edge_index": torch.stack([out.row, out.col]),
        "x": x,
        "y": y,
        "n_id": out.node,
        "e_id": out.edge,
        "num_sampled_nodes": out.num_sampled_nodes,
        "num_sampled_edges": out.num_sampled_edges,
    }


def _hetero_payload(out: Any, xs: Any, ys: Any) -> dict[str, Any]:
    nodes = {t: {"n_id": n, "num_sampled_nodes": out.num_sampled_nodes[t]} for t, n in out.node.items()}
    for t, v in (xs or {}).items():
        nodes[t]["x"] = v
    for t, v in (ys or {}).items():
        nodes[t]["y"] = v
    edges = {
        c: {
            "edge_index": torch.stack([out.row[c], out.col[c]]),
            "e_id": out.edge[c],
            "num_sampled_edges": out.num_sampled_edges[c],
        }
        for c in out.row
    }
    return {"nodes": nodes, "edges": edges}


def to_data(payload: dict[str, Any]) -> Data | HeteroData:
    """A prepared batch (dicts of tensors) as PyG's ``Data`` or ``HeteroData``."""
    if "nodes" not in payload:
        data = Data()
        for k, v in payload.items():
            if v is not None:
                data[k] = v
        return data
    hd = HeteroData()
    for t, attrs in payload["nodes"].items():
        for k, v in attrs.items():
            hd[t][k] = v
    for c, attrs in payload["edges"].items():
        for k, v in attrs.items():
            hd[c][k] = v
    for k, v in payload.get("graph", {}).items():
        hd[k] = v
    return hd


class _PyGLoader(PrefetchingLoader[Any]):
    """What both loaders share: the sampler, the prefetch engine, dicts → ``Data`` on delivery."""

    sampler: DistNeighborSampler

    def _received(self, waited_since: float, result: Any) -> Any:
        return to_data(super()._received(waited_since, result))


class DistNeighborLoader(_PyGLoader):
    """Node mini-batches as PyG ``Data``/``HeteroData``, sampled by the servers and prefetched.

    The arguments are ``torch_geometric.loader.NeighborLoader``'s: ``data`` is a ``DistGraph`` (or
    a ``(DistFeatureStore, DistGraphStore)`` pair), ``num_neighbors`` a list per hop (PyG's order:
    the seeds' hop first) or ``{edge type: list}``, ``input_nodes`` IDs or a mask, or
    ``(node type, IDs or mask)`` on a heterogeneous graph (``None``: every node). Each batch has
    ``x``, ``y``, ``edge_index`` (local), ``n_id``, ``e_id``, ``num_sampled_nodes``,
    ``num_sampled_edges``, ``input_id`` and ``batch_size`` (seeds first: ``out[:batch_size]``).
    ``x``/``y`` choose the node tensors carried (default ``feat``/``label``). Options the servers
    do not offer raise ``InvalidRequestError`` naming them; ``num_workers`` is accepted and
    ignored (the prefetcher overlaps instead). ``prefetch``, ``device``, ``overlap`` and ``seed``
    are asyncgraph's loader options.
    """

    def __init__(
        self,
        data: Any,
        num_neighbors: Any,
        input_nodes: Any = None,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        *,
        replace: bool = False,
        subgraph_type: Any = "directional",
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: str | None = None,
        input_time: Any = None,
        x: str | Auto | None = AUTO,
        y: str | Auto | None = AUTO,
        prefetch: int = 2,
        device: str | torch.device | None = None,
        overlap: bool = True,
        seed: int | None = None,
        num_workers: int = 0,
        transform: Any = None,
    ) -> None:
        g = _graph_of(data)
        client = client_of(g)
        if transform is not None:
            raise InvalidRequestError("transform is not supported: apply it to each batch in the loop")
        check_options(input_time=input_time)
        self.sampler = DistNeighborSampler(
            g,
            num_neighbors,
            replace=replace,
            subgraph_type=subgraph_type,
            disjoint=disjoint,
            temporal_strategy=temporal_strategy,
            time_attr=time_attr,
            x=x,
            y=y,
        )
        book = client.book
        self.input_type: str | None = None
        if book.is_hetero:
            if not (isinstance(input_nodes, tuple) and len(input_nodes) == 2):
                raise InvalidRequestError(
                    "input_nodes of a heterogeneous graph must be (node type, ids); "
                    f"node types: {book.ntypes}"
                )
            ntype, ids = input_nodes
            if ntype not in book.ntypes:
                raise UnknownTypeError(f"input_nodes: unknown node type {ntype!r}; node types: {book.ntypes}")
            self.input_type = str(ntype)
            n = book.num_nodes_of(ntype)
            input_nodes = ids
        else:
            n = book.num_nodes
        nodes = np.arange(n, dtype=np.int64) if input_nodes is None else mask_or_ids(input_nodes)
        if nodes.dtype.kind not in "iu":
            raise InvalidRequestError(f"input_nodes must be integer IDs or a boolean mask, got {nodes.dtype}")
        nodes = nodes.astype(np.int64, copy=False)
        if nodes.size and (int(nodes.min()) < 0 or int(nodes.max()) >= n):
            from asyncgraph.errors import OutOfRangeError

            bad = int(nodes.min()) if int(nodes.min()) < 0 else int(nodes.max())
            raise OutOfRangeError(f"input_nodes: node ID {bad} out of range [0, {n})")
        self.input_nodes = nodes
        super().__init__(
            client.loop, nodes.size, batch_size, shuffle, drop_last, prefetch, seed, device, overlap
        )
        self.client = client

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[dict[str, Any]]:
        return self._build(positions, self._batch_seed(epoch, index))

    async def _build(self, positions: np.ndarray, batch_seed: int) -> dict[str, Any]:
        seeds = self.input_nodes[positions]
        input_id = torch.from_numpy(positions.astype(np.int64))
        if self.input_type is None:
            out, (x, y) = await self.sampler.sample_async(seeds, batch_seed)
            payload = _homo_payload(out, x, y)
            payload.update(input_id=input_id, batch_size=int(seeds.size))
            return payload
        out, (xs, ys) = await self.sampler.sample_async({self.input_type: seeds}, batch_seed, self.input_type)
        payload = _hetero_payload(out, xs, ys)
        payload["nodes"][self.input_type].update(input_id=input_id, batch_size=int(seeds.size))
        return payload


class DistLinkNeighborLoader(_PyGLoader):
    """Link mini-batches as PyG ``Data``, sampled by the servers and prefetched (homogeneous graphs).

    PyG's ``LinkNeighborLoader`` arguments: ``edge_label_index`` (``[2, M]`` global node IDs;
    ``None``: every edge), ``edge_label`` and ``neg_sampling`` (PyG's ``NegativeSampling``,
    ``"binary"`` or ``"triplet"``, or ``neg_sampling_ratio``). Each batch carries PyG's
    ``edge_label_index`` (local, into ``n_id``) and ``edge_label`` (binary), or ``src_index``,
    ``dst_pos_index``, ``dst_neg_index`` (triplet), besides what :class:`DistNeighborLoader`'s have.
    Negatives are uniform random nodes, as PyG's ``neg_sample`` draws them, seeded per batch.
    """

    def __init__(
        self,
        data: Any,
        num_neighbors: Any,
        edge_label_index: Any = None,
        edge_label: Any = None,
        neg_sampling: NegativeSampling | str | Mapping[str, Any] | None = None,
        neg_sampling_ratio: float | None = None,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        *,
        replace: bool = False,
        subgraph_type: Any = "directional",
        disjoint: bool = False,
        x: str | Auto | None = AUTO,
        y: str | Auto | None = AUTO,
        prefetch: int = 2,
        device: str | torch.device | None = None,
        overlap: bool = True,
        seed: int | None = None,
        num_workers: int = 0,
    ) -> None:
        g = _graph_of(data)
        client = client_of(g)
        if client.book.is_hetero:
            raise InvalidRequestError("DistLinkNeighborLoader supports homogeneous graphs only (for now)")
        self.sampler = DistNeighborSampler(
            g, num_neighbors, replace=replace, subgraph_type=subgraph_type, disjoint=disjoint, x=x, y=y
        )
        n = client.book.num_nodes
        if edge_label_index is None:
            src, dst = client.find_edges(np.arange(client.book.num_edges, dtype=np.int64))
            eli = torch.from_numpy(np.stack([src, dst]))
        else:
            eli = torch.as_tensor(edge_label_index)
            if eli.dim() != 2 or eli.shape[0] != 2:
                raise InvalidRequestError(f"edge_label_index must have shape [2, M], got {tuple(eli.shape)}")
            if eli.is_floating_point() or eli.dtype == torch.bool:
                raise InvalidRequestError(f"edge_label_index must hold integer node IDs, got {eli.dtype}")
            eli = eli.to(torch.int64)
            if eli.numel() and (int(eli.min()) < 0 or int(eli.max()) >= n):
                from asyncgraph.errors import OutOfRangeError

                raise OutOfRangeError(f"edge_label_index: node IDs must be in [0, {n})")
        self.edge_label_index = eli
        self.edge_label = None if edge_label is None else torch.as_tensor(edge_label)
        if self.edge_label is not None and self.edge_label.shape[0] != eli.shape[1]:
            raise InvalidRequestError("edge_label needs one entry per column of edge_label_index")
        if neg_sampling is None and neg_sampling_ratio is not None and neg_sampling_ratio > 0:
            neg_sampling = NegativeSampling("binary", neg_sampling_ratio)
        self.neg_sampling = NegativeSampling.cast(neg_sampling) if neg_sampling is not None else None
        if self.neg_sampling is not None and (
            self.neg_sampling.src_weight is not None or self.neg_sampling.dst_weight is not None
        ):
            raise InvalidRequestError(
                "neg_sampling with src_weight/dst_weight is not supported: negatives are uniform"
            )
        super().__init__(
            client.loop, eli.shape[1], batch_size, shuffle, drop_last, prefetch, seed, device, overlap
        )
        self.client = client

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[dict[str, Any]]:
        return self._build(positions, self._batch_seed(epoch, index))

    async def _build(self, positions: np.ndarray, batch_seed: int) -> dict[str, Any]:
        pos = torch.from_numpy(positions.astype(np.int64))
        src, dst = self.edge_label_index[0, pos], self.edge_label_index[1, pos]
        num_pos = int(pos.numel())
        label = torch.ones(num_pos) if self.edge_label is None else self.edge_label[pos]
        neg = self.neg_sampling
        rng = np.random.default_rng([batch_seed, _NEG_STREAM])
        n = self.client.book.num_nodes
        if neg is not None:  # uniform negatives as PyG's neg_sample draws them, seeded per batch
            num_neg = math.ceil(num_pos * neg.amount)
            dst_neg = torch.from_numpy(rng.integers(0, n, num_neg, dtype=np.int64))
            if neg.is_binary():
                src = torch.cat([src, torch.from_numpy(rng.integers(0, n, num_neg, dtype=np.int64))])
                dst = torch.cat([dst, dst_neg])
                label = torch.cat([label, label.new_zeros((num_neg, *label.shape[1:]))])
            else:
                dst = torch.cat([dst, dst_neg])
        uniq, inv = np.unique(torch.cat([src, dst]).numpy(), return_inverse=True)
        seeds, inverse = torch.from_numpy(uniq), torch.from_numpy(inv.reshape(-1))
        out, (x, y) = await self.sampler.sample_async(seeds, batch_seed)
        payload = _homo_payload(out, x, y)
        payload.update(input_id=pos, batch_size=num_pos)
        if neg is None or neg.is_binary():
            payload.update(edge_label_index=inverse.view(2, -1), edge_label=label)
        else:
            ns = src.numel()
            payload.update(
                src_index=inverse[:ns],
                dst_pos_index=inverse[ns : ns + num_pos],
                dst_neg_index=inverse[ns + num_pos :].view(num_pos, -1).squeeze(-1),
            )
        return payload


_NEG_STREAM = 0x6E65675F  # keys the negatives' generator apart from the sampling seeds
