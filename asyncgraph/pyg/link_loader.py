"""``DistLinkNeighborLoader``: PyG's ``LinkNeighborLoader`` on asyncgraph's prefetch engine.

Labels follow PyG's ``LinkLoader``: with binary negative sampling, ``edge_label`` given with
``0`` among its values is shifted by one (``0`` then means "negative"), and ``edge_label`` with
triplet negative sampling is a ``ValueError``. ``edge_label_index`` is a ``[2, M]`` tensor or
PyG's ``(edge type, tensor)`` form (``(None, tensor)`` on a homogeneous graph; PyG's own
``LinkLoader`` over a ``(FeatureStore, GraphStore)`` pair needs that form).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import NegativeSampling

from asyncgraph.dataloading.fetch import AUTO, Auto, client_of
from asyncgraph.dataloading.pyg_recipe import PyGLinkRecipe, link_task
from asyncgraph.errors import InvalidRequestError, OutOfRangeError, UnknownTypeError

from .loader import _graph_of, _PyGLoader
from .local_stores import bind_partition_data
from .sampler import DistNeighborSampler, check_options

__all__ = ["DistLinkNeighborLoader"]


def _split_input(edge_label_index: Any, book: Any) -> tuple[tuple[str, str, str] | None, Any]:
    """``(canonical edge type or None, [2, M] or None)`` of PyG's ``edge_label_index`` forms."""
    etype: Any = None
    if isinstance(edge_label_index, (tuple, list)) and len(edge_label_index) == 3:
        etype, edge_label_index = edge_label_index, None  # PyG: an edge type alone, all its edges
    elif isinstance(edge_label_index, (tuple, list)) and len(edge_label_index) == 2:
        etype, edge_label_index = edge_label_index
    if not book.is_hetero:
        if etype is not None:
            raise InvalidRequestError(
                f"edge_label_index: edge type {etype!r} given for a homogeneous graph (use None)"
            )
        return None, edge_label_index
    if etype is None:
        raise InvalidRequestError(
            "edge_label_index of a heterogeneous graph must be (edge type, [2, M] or None); "
            f"edge types: {book.canonical_etypes}"
        )
    try:
        canon = book.canonical_etypes[book.etype_id(tuple(etype) if isinstance(etype, list) else etype)]
    except (KeyError, ValueError) as exc:
        raise UnknownTypeError(
            f"edge_label_index: unknown edge type {etype!r}; edge types: {book.canonical_etypes}"
        ) from exc
    return canon, edge_label_index


def _label_index(edge_label_index: Any, n_src: int, n_dst: int) -> torch.Tensor:
    """``[2, M]`` int64 node IDs, range-checked (sources below ``n_src``, destinations ``n_dst``)."""
    eli = torch.as_tensor(edge_label_index)
    if eli.dim() != 2 or eli.shape[0] != 2:
        raise InvalidRequestError(f"edge_label_index must have shape [2, M], got {tuple(eli.shape)}")
    if eli.is_floating_point() or eli.dtype == torch.bool:
        raise InvalidRequestError(f"edge_label_index must hold integer node IDs, got {eli.dtype}")
    eli = eli.to(torch.int64)
    for row, n, what in ((0, n_src, "source"), (1, n_dst, "destination")):
        ids = eli[row]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise OutOfRangeError(f"edge_label_index: {what} node IDs must be in [0, {n})")
    return eli


class DistLinkNeighborLoader(_PyGLoader):
    """Link mini-batches as PyG ``Data`` / ``HeteroData``, sampled by the servers and prefetched.

    PyG's ``LinkNeighborLoader`` arguments: ``edge_label_index`` (``[2, M]`` node IDs, or
    ``(None, [2, M])`` as PyG's ``LinkLoader`` takes it over stores; ``None``: every edge; on a
    heterogeneous graph ``(edge type, [2, M] per-type IDs)`` or ``(edge type, None)``, the batch
    a ``HeteroData`` with ``edge_label_index``/``edge_label`` on that edge type and
    ``src_index`` / ``dst_pos_index`` / ``dst_neg_index`` on its node types, as PyG's),
    ``edge_label`` and ``neg_sampling`` (PyG's ``NegativeSampling``, ``"binary"`` or
    ``"triplet"``, or ``neg_sampling_ratio``), with PyG's label rules (module docstring). Each
    batch carries PyG's ``edge_label_index`` (local, into ``n_id``) and ``edge_label`` (binary),
    or ``src_index``, ``dst_pos_index``, ``dst_neg_index`` (triplet), besides what
    :class:`DistNeighborLoader`'s have. Negatives are uniform random nodes, as PyG's
    ``neg_sample`` draws them, seeded per batch. ``num_workers``, ``worker_mode`` and
    ``gather_threads`` are :class:`DistNeighborLoader`'s (batches built in loader worker
    processes, equal to ``num_workers=0``'s); PyG's and PyTorch's other loader arguments are
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
        temporal_strategy: str = "uniform",
        time_attr: str | None = None,
        weight_attr: str | None = None,
        edge_label_time: Any = None,
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
        worker_mode: str = "process",
        gather_threads: int = 1,
        **kwargs: Any,
    ) -> None:
        opts = self._pyg_options(
            "DistLinkNeighborLoader",
            prefetch,
            num_workers,
            pin_memory,
            prefetch_factor,
            transform,
            worker_mode,
            kwargs,
        )
        bind_partition_data(data, kwargs)  # LocalFeatureStore/LocalGraphStore.from_partition
        g = _graph_of(data)
        client = client_of(g)
        book = client.book
        check_options(
            temporal_strategy=temporal_strategy,
            time_attr=time_attr,
            weight_attr=weight_attr,
            input_time=edge_label_time,
        )
        self.input_type, edge_label_index = _split_input(edge_label_index, book)
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
        et = self.input_type
        self._sizes = (
            (book.num_nodes, book.num_nodes)
            if et is None
            else (book.num_nodes_of(et[0]), book.num_nodes_of(et[2]))
        )
        if edge_label_index is not None:
            eli = _label_index(edge_label_index, *self._sizes)
        elif et is None:
            eli = torch.from_numpy(np.stack(client.find_edges(np.arange(book.num_edges, dtype=np.int64))))
        else:
            from .graph_store import DistGraphStore

            eli = torch.from_numpy(np.stack(DistGraphStore(g)._coo(et)))
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
            client.loop,
            eli.shape[1],
            batch_size,
            shuffle,
            drop_last,
            opts.prefetch,
            seed,
            device,
            overlap,
            num_workers=opts.workers,
            gather_threads=gather_threads,
            worker_mode=opts.worker_mode,
        )
        sampler = self.sampler
        recipe = PyGLinkRecipe(
            list(sampler.fanouts),
            sampler.replace,
            dict(sampler.attrs),
            sampler.is_hetero,
            input_type=et,
            sizes=self._sizes,
            neg_mode=None if neg is None else ("binary" if neg.is_binary() else "triplet"),
            neg_amount=1.0 if neg is None else float(neg.amount),
            label_dtype=None if label is None else str(label.dtype).removeprefix("torch."),
            label_shape=() if label is None else tuple(label.shape[1:]),
        )
        self._after_init(client, recipe)

    def _worker_task(self, positions: np.ndarray, epoch: int, index: int) -> tuple[np.ndarray, int]:
        return link_task(self.edge_label_index, self.edge_label, positions), self._batch_seed(epoch, index)
