"""Prefetching loaders that yield PyG ``Data``/``HeteroData``: PyG's distributed loaders' names.

``DistNeighborLoader`` / ``DistLinkNeighborLoader`` (``link_loader.py``) run on asyncgraph's
prefetch engine (``dataloading/prefetch.py``): while the model computes on batch ``k``, batches
``k+1..k+prefetch`` are sampled by the servers (:func:`~asyncgraph.pyg.sampler.sample_hops`) and
their node attributes pulled. With ``num_workers=N`` that runs in N asyncgraph loader worker
processes (``dataloading/workers.py``, the recipes of ``dataloading/pyg_recipe.py``), each row pulled
straight into memory the training process maps; with ``num_workers=0`` (or
``worker_mode="loop"``) on the client's event loop. With ``device=`` each batch is also copied
there in the background. A batch is prepared as plain dicts of tensors (what the device copier
and the workers' slots carry) and becomes a ``Data``/``HeteroData`` when the training loop
receives it. PyG's and PyTorch's loader arguments are taken as ``options.py`` says.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data, HeteroData

from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading.fetch import AUTO, Auto, client_of
from asyncgraph.dataloading.prefetch import Prefetcher, PrefetchingLoader
from asyncgraph.dataloading.pyg_recipe import PyGNodeRecipe, node_task
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import InvalidRequestError, UnknownTypeError

from .attrs import input_ids
from .local_stores import bind_partition_data
from .options import LoaderOptions, loader_options
from .sampler import DistNeighborSampler, check_options

__all__ = ["DistNeighborLoader"]

logger = logging.getLogger("asyncgraph.pyg")


def _graph_of(data: Any) -> Any:
    """The DistGraph behind ``data``: a DistGraph, or a ``(DistFeatureStore, DistGraphStore)`` pair."""
    return data[1].graph if isinstance(data, tuple) else data


def given_labels(data: Any) -> Any:
    """``labels`` set on the feature store of a ``(feature store, graph store)`` pair (PyG's
    ``LocalFeatureStore.labels``: every node's label, or the seed type's), else None."""
    return getattr(data[0], "labels", None) if isinstance(data, tuple) and len(data) == 2 else None


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
    """What both loaders share: the sampler, the recipe, where batches are built, dicts → ``Data``."""

    sampler: DistNeighborSampler
    client: Client
    _recipe: Any  # dataloading/pyg_recipe.py: PyGNodeRecipe / PyGLinkRecipe
    transform: Callable[[Any], Any] | None = None
    pin_memory: bool = False

    def _pyg_options(
        self,
        name: str,
        prefetch: int,
        num_workers: int,
        pin_memory: bool,
        prefetch_factor: int | None,
        transform: Callable[[Any], Any] | None,
        worker_mode: str,
        kwargs: dict[str, Any],
    ) -> LoaderOptions:
        """Record PyG's options; returns what the engine is given (``options.py``)."""
        opts = loader_options(name, prefetch, num_workers, pin_memory, prefetch_factor, kwargs, worker_mode)
        if transform is not None and not callable(transform):
            raise InvalidRequestError(f"transform must be callable, got {transform!r}")
        self.transform = transform
        self.pin_memory = opts.pin_memory and torch.cuda.is_available()
        self._pyg_workers = opts.num_workers
        return opts

    def _after_init(self, client: Client, recipe: Any) -> None:
        """Keep the client and recipe; start the workers now, while the caller builds its model."""
        self.client = client
        self._recipe = recipe
        self._in_workers = self.num_workers > 0  # processes (or threads) build the batches
        # PyTorch's attribute: what was asked for (worker_mode="loop": a prefetch depth)
        self.num_workers = self._pyg_workers
        if self._in_workers:
            self._worker_pool()

    def enable_multithreading(self, num_threads: int) -> contextlib.AbstractContextManager[None]:
        """PyG's ``DistLoader`` context that gives sampler worker processes ``num_threads``
        threads: asyncgraph prepares batches in its own workers or on its event loop; it changes
        nothing."""
        logger.info("enable_multithreading(%r): batches are prepared on the event loop", num_threads)
        return contextlib.nullcontext()

    def _start_epoch(self) -> tuple[int, Any]:
        """The workers' prefetcher with ``num_workers``, else the event loop's (``options.py``)."""
        if self._in_workers:
            return super()._start_epoch()
        self.stats = LoaderStats(epoch=self.epoch)
        count, make = self._epoch_maker()
        return count, Prefetcher(self._loop, make, count, self.prefetch)

    def _client_for_workers(self) -> Client:
        return self.client

    def _worker_recipe(self) -> Any:
        return self._recipe

    def _make_batch(self, positions: np.ndarray, epoch: int, index: int) -> Awaitable[dict[str, Any]]:
        """The batch a worker would build, built on the client's event loop (same recipe)."""
        task, batch_seed = self._worker_task(positions, epoch, index)
        return self._recipe.build(self.client.async_client, task, batch_seed, self.stats, None)  # type: ignore[no-any-return]

    def _payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A hook on each prepared batch before it becomes ``Data`` (``in_memory.py`` maps IDs)."""
        return payload

    def _received(self, waited_since: float, result: Any) -> Any:
        data = to_data(self._payload(super()._received(waited_since, result)))
        if self.pin_memory and self.device is None:
            data = data.pin_memory()
        return data if self.transform is None else self.transform(data)


class DistNeighborLoader(_PyGLoader):
    """Node mini-batches as PyG ``Data``/``HeteroData``, sampled by the servers and prefetched.

    The arguments are ``torch_geometric.loader.NeighborLoader``'s: ``data`` is a ``DistGraph`` (or
    a ``(DistFeatureStore, DistGraphStore)`` pair), ``num_neighbors`` a list per hop (PyG's order:
    the seeds' hop first) or ``{edge type: list}`` naming every edge type, ``input_nodes`` IDs or
    a mask (boolean, or uint8 0/1 of the group's length), or ``(node type, IDs or mask)`` on a
    heterogeneous graph (``None``: every node). Each batch has ``edge_index`` (local), ``n_id``,
    ``e_id``, ``num_sampled_nodes``, ``num_sampled_edges``, ``input_id``, ``batch_size`` (seeds
    first: ``out[:batch_size]``) and, as PyG's in-memory loaders copy every node attribute,
    ``x``, ``y`` and every other node tensor of the graph under its own name (``train_mask``, ...;
    per node type on a heterogeneous graph, for the types that have it). ``x``/``y`` choose the
    tensors carried as ``x``/``y`` (default: tensors so named, else ``feat``/``label``); ``attrs``
    the others (default all; ``[]`` none). Options the servers do not offer raise
    ``InvalidRequestError`` naming them; PyG's and PyTorch's other loader arguments
    (``pin_memory``, ``persistent_workers``, ...) are taken as ``options.py`` says.
    ``num_workers=N`` builds the batches in N asyncgraph loader worker processes (sampling,
    relabelling and every attribute's rows gathered there, once, into memory this process
    maps); the batches equal ``num_workers=0``'s. ``worker_mode="thread"`` runs those workers on
    threads, ``"loop"`` keeps every batch on the client's event loop (``num_workers`` then only
    deepens the prefetch, as before). ``prefetch``, ``device``, ``overlap``, ``seed`` and
    ``gather_threads`` are asyncgraph's loader options (``DistNodeDataLoader``'s).
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
        weight_attr: str | None = None,
        input_time: Any = None,
        x: str | Auto | None = AUTO,
        y: str | Auto | None = AUTO,
        attrs: Sequence[str] | Auto | None = AUTO,
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
            "DistNeighborLoader",
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
        check_options(input_time=input_time)
        self.labels = given_labels(data)
        if self.labels is not None and y is AUTO:
            y = None  # batches take y from the given labels
        self.sampler = DistNeighborSampler(
            g,
            num_neighbors,
            replace=replace,
            subgraph_type=subgraph_type,
            disjoint=disjoint,
            temporal_strategy=temporal_strategy,
            time_attr=time_attr,
            weight_attr=weight_attr,
            x=x,
            y=y,
            attrs=attrs,
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
        what = "input_nodes" if self.input_type is None else f"input_nodes of {self.input_type!r}"
        nodes = np.arange(n, dtype=np.int64) if input_nodes is None else input_ids(input_nodes, n, what)
        self.input_nodes = nodes
        super().__init__(
            client.loop,
            nodes.size,
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
        recipe = PyGNodeRecipe(
            list(sampler.fanouts), sampler.replace, dict(sampler.attrs), sampler.is_hetero, self.input_type
        )
        self._after_init(client, recipe)

    def _worker_task(self, positions: np.ndarray, epoch: int, index: int) -> tuple[np.ndarray, int]:
        return node_task(self.input_nodes[positions], positions), self._batch_seed(epoch, index)

    def _payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``y`` from PyG's ``LocalFeatureStore.labels`` (``given_labels``), by the batch's ``n_id``."""
        if self.labels is not None:
            seeds = payload if self.input_type is None else payload["nodes"][self.input_type]
            n_id = seeds["n_id"]
            seeds["y"] = self.labels[n_id.to(self.labels.device)].to(n_id.device)
        return payload
