"""``DistLinkNeighborLoader``: PyG's ``LinkNeighborLoader`` on asyncgraph's prefetch engine.

Labels follow PyG's ``LinkLoader``: with binary negative sampling, ``edge_label`` given with
``0`` among its values is shifted by one (``0`` then means "negative"), and ``edge_label`` with
triplet negative sampling is a ``ValueError``. ``edge_label_index`` is a ``[2, M]`` tensor or
PyG's ``(edge type, tensor)`` form (``(None, tensor)`` on a homogeneous graph; PyG's own
``LinkLoader`` over a ``(FeatureStore, GraphStore)`` pair needs that form).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import NegativeSampling

from asyncgraph.dataloading.fetch import AUTO, Auto, client_of
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import InvalidRequestError, OutOfRangeError

from .loader import _graph_of, _PyGLoader, homo_payload, timed_sample
from .sampler import DistNeighborSampler

__all__ = ["DistLinkNeighborLoader"]

_NEG_STREAM = 0x6E65675F  # keys the negatives' generator apart from the sampling seeds


def _label_index(edge_label_index: Any, n: int) -> torch.Tensor | None:
    """``[2, M]`` int64 node IDs from a tensor or ``(None | edge type, tensor)``, range-checked."""
    if isinstance(edge_label_index, (tuple, list)) and len(edge_label_index) == 2:
        etype, edge_label_index = edge_label_index
        if etype is not None:
            raise InvalidRequestError(
                "edge_label_index: DistLinkNeighborLoader supports homogeneous graphs only "
                f"(edge type {etype!r}; use None)"
            )
    if edge_label_index is None:
        return None
    eli = torch.as_tensor(edge_label_index)
    if eli.dim() != 2 or eli.shape[0] != 2:
        raise InvalidRequestError(f"edge_label_index must have shape [2, M], got {tuple(eli.shape)}")
    if eli.is_floating_point() or eli.dtype == torch.bool:
        raise InvalidRequestError(f"edge_label_index must hold integer node IDs, got {eli.dtype}")
    eli = eli.to(torch.int64)
    if eli.numel() and (int(eli.min()) < 0 or int(eli.max()) >= n):
        raise OutOfRangeError(f"edge_label_index: node IDs must be in [0, {n})")
    return eli


class DistLinkNeighborLoader(_PyGLoader):
    """Link mini-batches as PyG ``Data``, sampled by the servers and prefetched (homogeneous graphs).

    PyG's ``LinkNeighborLoader`` arguments: ``edge_label_index`` (``[2, M]`` global node IDs, or
    ``(None, [2, M])`` as PyG's ``LinkLoader`` takes it over stores; ``None``: every edge),
    ``edge_label`` and ``neg_sampling`` (PyG's ``NegativeSampling``, ``"binary"`` or
    ``"triplet"``, or ``neg_sampling_ratio``), with PyG's label rules (module docstring). Each
    batch carries PyG's ``edge_label_index`` (local, into ``n_id``) and ``edge_label`` (binary),
    or ``src_index``, ``dst_pos_index``, ``dst_neg_index`` (triplet), besides what
    :class:`DistNeighborLoader`'s have. Negatives are uniform random nodes, as PyG's
    ``neg_sample`` draws them, seeded per batch. PyG's and PyTorch's other loader arguments are
    taken as ``options.py`` says.
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
        attrs: Any = AUTO,
        prefetch: int = 2,
        device: str | torch.device | None = None,
        overlap: bool = True,
        seed: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        depth = self._pyg_options(
            "DistLinkNeighborLoader", prefetch, num_workers, pin_memory, prefetch_factor, transform, kwargs
        )
        g = _graph_of(data)
        client = client_of(g)
        if client.book.is_hetero:
            raise InvalidRequestError("DistLinkNeighborLoader supports homogeneous graphs only (for now)")
        self.sampler = DistNeighborSampler(
            g,
            num_neighbors,
            replace=replace,
            subgraph_type=subgraph_type,
            disjoint=disjoint,
            x=x,
            y=y,
            attrs=attrs,
        )
        eli = _label_index(edge_label_index, client.book.num_nodes)
        if eli is None:
            src, dst = client.find_edges(np.arange(client.book.num_edges, dtype=np.int64))
            eli = torch.from_numpy(np.stack([src, dst]))
        self.edge_label_index = eli
        if neg_sampling is None and neg_sampling_ratio is not None and neg_sampling_ratio > 0:
            neg_sampling = NegativeSampling("binary", neg_sampling_ratio)
        self.neg_sampling = NegativeSampling.cast(neg_sampling) if neg_sampling is not None else None
        neg = self.neg_sampling
        label = None if edge_label is None else torch.as_tensor(edge_label)
        if label is not None and label.shape[0] != eli.shape[1]:
            raise InvalidRequestError("edge_label needs one entry per column of edge_label_index")
        if neg is not None and neg.is_binary() and label is not None and label.numel() and label.min() == 0:
            label = label + 1  # as PyG's LinkLoader: zero now denotes "negative"
        if neg is not None and neg.is_triplet() and label is not None:
            raise InvalidRequestError(
                "'edge_label' needs to be undefined for 'triplet'-based negative sampling (PyG's rule): "
                "use the batch's src_index, dst_pos_index and dst_neg_index"
            )
        self.edge_label = label
        if neg is not None and (neg.src_weight is not None or neg.dst_weight is not None):
            raise InvalidRequestError(
                "neg_sampling with src_weight/dst_weight is not supported: negatives are uniform"
            )
        super().__init__(
            client.loop, eli.shape[1], batch_size, shuffle, drop_last, depth, seed, device, overlap
        )
        self._after_init()
        self.client = client

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[dict[str, Any]]:
        return self._build(positions, self._batch_seed(epoch, index), self.stats)

    async def _build(self, positions: np.ndarray, batch_seed: int, stats: LoaderStats) -> dict[str, Any]:
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
        out, feats = await timed_sample(self.sampler, stats, seeds, batch_seed)
        payload = homo_payload(out, feats)
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
