"""PyG's ``BaseSampler`` with the sampling done by asyncgraph's servers.

PyG's neighbour sampling (``NeighborSampler`` over pyg-lib) expands every node once, at the hop
that first reaches it: hop ``k`` samples ``num_neighbors[k]`` in-edges of the nodes that hop
``k - 1`` added (the seeds for hop 0), and the batch's nodes are the seeds followed by each
hop's new nodes in order of first appearance. :func:`sample_hops` reproduces that layout with
one request wave per hop (each frontier split by owner, every server at once) and vectorised
relabelling (sorted ID table + ``searchsorted``; no Python loop over nodes or edges). Note the
order of fanouts: PyG's ``num_neighbors[0]`` is the seeds' hop, DGL's ``fanouts[-1]``.

``DistNeighborSampler`` wraps it in PyG's interface (``sample_from_nodes``,
``sample_from_edges`` with PyG's own negative sampling) and, as PyG's distributed sampler of the
same name did, carries each batch's features in ``metadata[-3:]`` = ``(x, y, edge_attr)``:
PyG's ``NodeLoader``/``LinkLoader`` recognise the class name and build the ``Data`` from them,
so a batch's features are pulled in the same coroutine as its sample (one pull per tensor).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import (
    BaseSampler,
    EdgeSamplerInput,
    HeteroSamplerOutput,
    NegativeSampling,
    NodeSamplerInput,
    SamplerOutput,
)
from torch_geometric.sampler.neighbor_sampler import edge_sample, node_sample

from asyncgraph.arrays import as_id_array
from asyncgraph.client.sync_client import Client
from asyncgraph.dataloading.fetch import AUTO, Auto, client_of
from asyncgraph.dataloading.hetero_block import pull_by_type
from asyncgraph.dataloading.hops import Hops, sample_hops, split_types
from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import node_key
from asyncgraph.partition.book import RangePartitionBook

from .attrs import fanouts, resolve_attrs
from .link import ClientLink

__all__ = ["DistNeighborSampler", "Hops", "check_options", "sample_hops"]

CanonicalEType = tuple[str, str, str]


def check_options(
    *,
    replace: bool = False,
    subgraph_type: Any = "directional",
    disjoint: bool = False,
    temporal_strategy: str = "uniform",
    time_attr: str | None = None,
    weight_attr: str | None = None,
    input_time: Any = None,
    hetero: bool = False,
) -> None:
    """``InvalidRequestError`` naming any PyG sampling option asyncgraph's servers do not offer."""
    st = getattr(subgraph_type, "value", subgraph_type)
    if st != "directional":
        raise InvalidRequestError(
            f"subgraph_type={st!r} is not supported: asyncgraph samples 'directional' subgraphs only"
        )
    if disjoint:
        raise InvalidRequestError("disjoint=True is not supported: seeds share one sampled subgraph")
    if time_attr is not None or input_time is not None or temporal_strategy != "uniform":
        raise InvalidRequestError(
            "temporal sampling (time_attr, input_time, temporal_strategy) is not supported"
        )
    if weight_attr is not None:
        raise InvalidRequestError("weight_attr is not supported: neighbours are sampled uniformly")
    if replace and hetero:
        raise InvalidRequestError("replace=True is not supported on heterogeneous graphs")


def to_sampler_output(hops: Hops) -> SamplerOutput:
    """PyG's homogeneous ``SamplerOutput`` of a sample."""
    t = torch.from_numpy
    return SamplerOutput(
        node=t(hops.nodes),
        row=t(hops.row),
        col=t(hops.col),
        edge=t(hops.edge),
        batch=None,
        num_sampled_nodes=list(hops.num_nodes),
        num_sampled_edges=list(hops.num_edges),
    )


def to_hetero_output(book: RangePartitionBook, hops: Hops) -> tuple[HeteroSamplerOutput, dict[str, Any]]:
    """PyG's ``HeteroSamplerOutput`` of a heterogeneous sample, and the per-type pieces."""
    parts = split_types(book, hops)

    def t(d: dict[Any, np.ndarray]) -> dict[Any, torch.Tensor]:
        return {k: torch.from_numpy(v) for k, v in d.items()}

    out = HeteroSamplerOutput(
        node=t(parts["node"]),
        row=t(parts["row"]),
        col=t(parts["col"]),
        edge=t(parts["edge"]),
        batch=None,
        num_sampled_nodes=parts["nsn"],
        num_sampled_edges=parts["nse"],
    )
    return out, parts


class DistNeighborSampler(BaseSampler):  # type: ignore[misc]
    """PyG's ``BaseSampler`` over a ``DistGraph`` (or a ``(DistFeatureStore, DistGraphStore)`` pair).

    ``num_neighbors`` is PyG's: a list per hop (``-1`` = every in-edge), or on a heterogeneous
    graph a dict ``{edge type: list}`` naming every edge type with the same number of hops
    (else PyG's ``ValueError``, as ``InvalidRequestError``). ``x``/``y`` name the node tensors
    carried as the batch's ``x`` and ``y`` (defaults: tensors named ``x``/``y``, else
    ``feat``/``label``; ``None`` for none); on a heterogeneous graph each is carried for the
    node types that have it. Options the servers do not offer (``disjoint``, ``subgraph_type``
    other than ``'directional'``, temporal or weighted sampling, ``replace`` on a heterogeneous
    graph) raise ``InvalidRequestError`` naming them. ``seed`` makes every call's sample
    reproducible. Picklable and fork-safe (``link.py``): PyG's loaders may run it in
    ``num_workers`` processes.
    """

    def __init__(
        self,
        data: Any,
        num_neighbors: Any,
        *,
        replace: bool = False,
        subgraph_type: Any = "directional",
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: str | None = None,
        weight_attr: str | None = None,
        x: str | Auto | None = AUTO,
        y: str | Auto | None = AUTO,
        seed: int | None = None,
        attrs: Sequence[str] | Auto | None = None,
    ) -> None:
        graph = data[1].graph if isinstance(data, tuple) else data
        self._link = ClientLink(client_of(graph))
        self.is_hetero = bool(self.book.is_hetero)
        check_options(
            replace=replace,
            subgraph_type=subgraph_type,
            disjoint=disjoint,
            temporal_strategy=temporal_strategy,
            time_attr=time_attr,
            weight_attr=weight_attr,
            hetero=self.is_hetero,
        )
        self.fanouts = fanouts(num_neighbors, self.book)
        self.replace = bool(replace)
        #: batch attribute -> node tensor: ``x``, ``y``, then ``attrs`` (the loaders' extra ones)
        self.attrs = resolve_attrs(self.client, x, y, attrs)
        self.x: str | None = self.attrs.get("x")
        self.y: str | None = self.attrs.get("y")
        self._rng = np.random.default_rng(seed)

    @property
    def client(self) -> Client:
        """This process's client (a worker process opens its own: ``link.py``)."""
        return self._link.client

    @property
    def book(self) -> RangePartitionBook:
        return self.client.book

    @property
    def edge_permutation(self) -> None:
        """Edge IDs are the servers' own: no permutation."""
        return None

    @property
    def num_nodes(self) -> int | dict[str, int]:
        if self.is_hetero:
            return {t: self.book.num_nodes_of(t) for t in self.book.ntypes}
        return self.book.num_nodes

    def _next_seed(self) -> int:
        return int(self._rng.integers(1 << 62))

    async def sample_async(
        self, seeds: Any, seed: int, input_type: str | None = None, *, sample_time: list[float] | None = None
    ) -> tuple[SamplerOutput | HeteroSamplerOutput, dict[str, Any]]:
        """A sample of ``seeds`` (tensor, or ``{ntype: ids}``) and its node attributes in PyG's
        layout: ``{name: rows}`` (homogeneous) or ``{name: {ntype: rows}}`` (types that have it).
        ``sample_time`` gets the seconds spent sampling (the rest is the pull)."""
        client = self.client
        aio, book = client.async_client, client.book
        if self.is_hetero:
            if not isinstance(seeds, Mapping):
                raise InvalidRequestError("seeds of a heterogeneous graph must be {node type: ids}")
            from asyncgraph.distributed.hetero import seeds_to_homo

            gids = seeds_to_homo(book, seeds)
        else:
            gids = as_id_array(seeds, "seeds")
        if gids.size:
            book.owner(gids, "node")  # OutOfRangeError names the ID before any request
        started = time.perf_counter()
        hops = await sample_hops(aio, gids, self.fanouts, replace=self.replace, seed=seed)
        if sample_time is not None:
            sample_time.append(time.perf_counter() - started)
        if not self.is_hetero:
            rows = await asyncio.gather(
                *(aio.pull_numpy(node_key(t), hops.nodes) for t in self.attrs.values())
            )
            return to_sampler_output(hops), {
                a: torch.from_numpy(r) for a, r in zip(self.attrs, rows, strict=True)
            }
        out, parts = to_hetero_output(book, hops)
        pos = dict(zip(book.ntypes, parts["pos"], strict=True))
        plan = {a: [nt for nt in book.ntypes if book.ntype_has(nt, t)] for a, t in self.attrs.items()}
        wanted = [a for a in plan if plan[a]]
        by_type = await asyncio.gather(  # per type of a per-type tensor, else one pull split by type
            *(pull_by_type(aio, self.attrs[a], hops.nodes, {nt: pos[nt] for nt in plan[a]}) for a in wanted)
        )
        return out, dict(zip(wanted, by_type, strict=True))

    def _sample(self, seed: Any, seed_time: Any = None, **kwargs: Any) -> Any:
        if seed_time is not None:
            check_options(input_time=seed_time)
        input_type = next(iter(seed)) if isinstance(seed, Mapping) else None
        out, feats = self.client.loop.run(self.sample_async(seed, self._next_seed(), input_type))
        y = feats.get("y")
        if input_type is not None:  # PyG's loaders read the labels of the seeds' type only
            y = {input_type: y[input_type]} if y and input_type in y else None
        out.metadata = (feats.get("x"), y)  # completed by sample_from_*
        return out

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs: Any) -> Any:
        """PyG's node sampling: ``metadata = (input_id, seed_time, x, y, edge_attr)``."""
        feats: list[Any] = []

        def fn(seed: Any, seed_time: Any) -> Any:
            out = self._sample(seed, seed_time)
            feats.extend(out.metadata)
            return out

        out = node_sample(index, fn)
        out.metadata = (*out.metadata, *feats, None)
        return out

    def sample_from_edges(self, index: EdgeSamplerInput, neg_sampling: NegativeSampling | None = None) -> Any:
        """PyG's link sampling (and its negative sampling); ``metadata`` ends with ``(x, y, None)``."""
        if index.time is not None:
            check_options(input_time=index.time)
        feats: list[Any] = []

        def fn(seed: Any, seed_time: Any) -> Any:
            out = self._sample(seed, seed_time)
            feats.extend(out.metadata)
            return out

        out = edge_sample(index, fn, self.num_nodes, False, None, neg_sampling)
        if self.is_hetero:  # PyG would set y on the input *edge* type: no labels for links
            feats[1] = None
        out.metadata = (*out.metadata, *feats, None)
        return out

    def __repr__(self) -> str:
        return f"DistNeighborSampler(num_neighbors={self.fanouts!r}, replace={self.replace})"
