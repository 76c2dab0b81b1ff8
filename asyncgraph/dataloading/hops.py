"""PyG's neighbour sampling by the servers, a batch's node attributes, and its layout as dicts.

PyG's neighbour sampling (``NeighborSampler`` over pyg-lib) expands every node once, at the hop
that first reaches it: hop ``k`` samples ``num_neighbors[k]`` in-edges of the nodes that hop
``k - 1`` added (the seeds for hop 0), and the batch's nodes are the seeds followed by each
hop's new nodes in order of first appearance. :func:`sample_hops` reproduces that layout with
one request wave per hop (each frontier split by owner, every server at once) and vectorised
relabelling (sorted ID table + ``searchsorted``; no Python loop over nodes or edges). Note the
order of fanouts: PyG's ``num_neighbors[0]`` is the seeds' hop, DGL's ``fanouts[-1]``.

:func:`sample_and_pull` is what every batch of the PyG loaders runs, wherever it is built: on
the client's event loop or in an asyncgraph loader worker (``pyg_recipe.py``). It samples the
hops and pulls every node attribute the batch carries; given a worker's ``allocate`` it pulls
each tensor's rows straight into the worker's batch slot, and the per-type tensors of a
heterogeneous batch are contiguous slices of those arrays, so every row is copied on the host
once. :func:`hops_payload` lays a batch out as the dicts the loaders deliver (the training
process makes them ``Data`` / ``HeteroData``). No torch_geometric here: a loader worker never
imports it (``asyncgraph.pyg.sampler`` wraps these in PyG's classes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import as_id_array, unique_sorted
from asyncgraph.client.async_client import AsyncClient
from asyncgraph.client.traffic import Traffic
from asyncgraph.dataloading.fetch import Allocate
from asyncgraph.dataloading.hetero_block import _type_local
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import node_key, typed_name
from asyncgraph.partition.book import RangePartitionBook

__all__ = ["Hops", "hops_payload", "sample_and_pull", "sample_hops", "seed_ids", "split_types"]


@dataclass
class Hops:
    """One sample in PyG's layout, homogeneous IDs: ``nodes[row[i]] -> nodes[col[i]]`` is edge ``edge[i]``."""

    nodes: np.ndarray  # seeds first, then each hop's new nodes
    row: np.ndarray  # local source (the sampled neighbour)
    col: np.ndarray  # local destination (the node expanded)
    edge: np.ndarray  # global edge IDs (per-type edge IDs on a heterogeneous graph)
    etype: np.ndarray | None  # each edge's canonical type index (heterogeneous), else None
    num_nodes: list[int]  # per hop, seeds first
    num_edges: list[int]  # per hop


async def sample_hops(
    aio: AsyncClient, seeds: np.ndarray, fanouts: Sequence[Any], *, replace: bool, seed: int
) -> Hops:
    """Expand ``seeds`` hop by hop as PyG does (see the module docstring); seeds must be unique."""
    seeds = as_id_array(seeds, "seeds")
    if unique_sorted(seeds).size != seeds.size:
        raise InvalidRequestError("seeds must be unique (disjoint sampling is not supported)")
    order = np.argsort(seeds, kind="stable")
    known, known_local = seeds[order], order.astype(np.int64)  # sorted IDs -> local index
    nodes, rows, cols, edges, etypes = [seeds], [], [], [], []
    num_nodes, num_edges = [int(seeds.size)], []
    frontier, total = seeds, int(seeds.size)
    hetero = not isinstance(fanouts[0], int)
    for hop, fanout in enumerate(fanouts):
        hop_seed = (seed * 8 + hop + 1) % (1 << 62)
        if not frontier.size:
            num_nodes.append(0)
            num_edges.append(0)
            continue
        if hetero:
            out = await aio.sample_etypes(frontier, fanout, seed=hop_seed)
            src, dst, eid = out["src"], out["dst"], out["type_eid"]
            etypes.append(out["etype"])
        else:
            src, dst, eid = await aio.sample_neighbors(frontier, fanout, replace=replace, seed=hop_seed)
        pos = np.minimum(np.searchsorted(known, src), known.size - 1)
        fresh = src[known[pos] != src]
        uniq, first = np.unique(fresh, return_index=True)
        appear = np.argsort(first, kind="stable")  # new nodes in order of first appearance
        uniq_local = np.empty(uniq.size, dtype=np.int64)
        uniq_local[appear] = total + np.arange(uniq.size, dtype=np.int64)
        frontier = uniq[appear]
        nodes.append(frontier)
        total += int(uniq.size)
        merged = np.concatenate([known, uniq])
        by_id = np.argsort(merged, kind="stable")
        known, known_local = merged[by_id], np.concatenate([known_local, uniq_local])[by_id]
        rows.append(known_local[np.searchsorted(known, src)])
        cols.append(known_local[np.searchsorted(known, dst)])
        edges.append(eid)
        num_nodes.append(int(uniq.size))
        num_edges.append(int(src.size))

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    return Hops(
        cat(nodes), cat(rows), cat(cols), cat(edges), cat(etypes) if hetero else None, num_nodes, num_edges
    )


def split_types(book: RangePartitionBook, hops: Hops) -> dict[str, Any]:
    """The per-type pieces of a heterogeneous sample (vectorised; loops over types only)."""
    nt, canon = len(book.ntypes), book.canonical_etypes
    types, per_type = book.map_to_per_ntype(hops.nodes)
    local, pos = _type_local(types, nt)
    hop_of_node = np.repeat(np.arange(len(hops.num_nodes)), hops.num_nodes)
    assert hops.etype is not None
    hop_of_edge = np.repeat(np.arange(len(hops.num_edges)), hops.num_edges)
    node, nsn, row, col, edge, nse = {}, {}, {}, {}, {}, {}
    for t, name in enumerate(book.ntypes):
        node[name] = per_type[pos[t]]
        nsn[name] = np.bincount(hop_of_node[pos[t]], minlength=len(hops.num_nodes)).tolist()
    for r, c in enumerate(canon):
        m = hops.etype == r
        row[c], col[c], edge[c] = local[hops.row[m]], local[hops.col[m]], hops.edge[m]
        nse[c] = np.bincount(hop_of_edge[m], minlength=len(hops.num_edges)).tolist()
    return {"node": node, "pos": pos, "row": row, "col": col, "edge": edge, "nsn": nsn, "nse": nse}


def seed_ids(aio: AsyncClient, seeds: Any, hetero: bool) -> np.ndarray:
    """Homogeneous IDs of ``seeds`` (IDs, or ``{node type: IDs}`` on a heterogeneous graph),
    range-checked before any request (``OutOfRangeError`` names the ID)."""
    book = aio.book
    if hetero:
        if not isinstance(seeds, Mapping):
            raise InvalidRequestError("seeds of a heterogeneous graph must be {node type: ids}")
        from asyncgraph.distributed.hetero import seeds_to_homo

        gids = seeds_to_homo(book, seeds)
    else:
        gids = as_id_array(seeds, "seeds")
    if gids.size:
        book.owner(gids, "node")
    return gids


def _stored_keys(aio: AsyncClient, name: str, types: list[str]) -> list[tuple[str, list[str]]]:
    """Where node tensor ``name`` of ``types`` is stored: ``[(key, types)]``, one tensor over
    every node, or one per type (``"paper/feat"``: a heterograph partitioned with per-type
    storage) for the types that have it."""
    merged = node_key(name)
    if aio.catalog.cached_meta(merged) is not None:
        return [(merged, types)]
    typed = [(node_key(typed_name(t, name)), [t]) for t in types]
    have = [(k, ts) for k, ts in typed if aio.catalog.cached_meta(k) is not None]
    return have or [(merged, types)]  # neither known: the pull names the missing tensor


async def sample_and_pull(
    aio: AsyncClient,
    seeds: Any,
    fanouts: Sequence[Any],
    replace: bool,
    attrs: Mapping[str, str],
    hetero: bool,
    batch_seed: int,
    stats: LoaderStats,
    allocate: Allocate | None = None,
    extra_bytes: int = 0,
) -> tuple[Hops, dict[str, Any] | None, dict[str, Any]]:
    """``(hops, per-type pieces or None, attributes)`` of a sample of ``seeds``: ``attrs`` maps
    a batch attribute to its node tensor; the attributes are ``{name: rows}`` (homogeneous) or
    ``{name: {ntype: rows}}`` (the types that have it). Seconds, bytes and rows go to ``stats``.

    ``allocate`` (a loader worker's slot) gives the arrays the rows are pulled into; the batch's
    structure is sized from the sample plus ``extra_bytes`` (what the caller adds to it).
    """
    book = aio.book
    gids = seed_ids(aio, seeds, hetero)
    t0 = time.perf_counter()
    hops = await sample_hops(aio, gids, fanouts, replace=replace, seed=batch_seed)
    t1 = time.perf_counter()
    parts: dict[str, Any] | None = None
    groups: list[tuple[str, str, list[str], np.ndarray]] = []  # (attribute, key, types, IDs)
    if hetero:
        parts = split_types(book, hops)
        pos = dict(zip(book.ntypes, parts["pos"], strict=True))
        for a, tensor in attrs.items():
            have = [nt for nt in book.ntypes if book.ntype_has(nt, tensor)]
            for key, types in _stored_keys(aio, tensor, have) if have else []:
                groups.append((a, key, types, hops.nodes[np.concatenate([pos[nt] for nt in types])]))
        num_tensors = 3 * len(book.ntypes) + 3 * len(book.canonical_etypes)
    else:
        groups = [(a, node_key(tensor), [], hops.nodes) for a, tensor in attrs.items()]
        num_tensors = 4
    traffic = Traffic()
    outs: list[np.ndarray | None] = [None] * len(groups)
    if allocate is not None:
        metas = [await aio.tensor_meta(key) for _, key, _, _ in groups]
        specs = [
            (key, (ids.size, *m.shape[1:]), np.dtype(m.dtype))
            for (_, key, _, ids), m in zip(groups, metas, strict=True)
        ]
        # the sample's structure, and what the caller adds (64-byte alignment per tensor)
        structure = [torch.from_numpy(a) for a in (hops.row, hops.col, hops.nodes, hops.edge)]
        structure.append(torch.empty(extra_bytes + 64 * (num_tensors + 4), dtype=torch.uint8))
        outs = list(allocate(specs, structure))  # type: ignore[arg-type]
    rows = await asyncio.gather(
        *(aio.pull_numpy(key, ids, traffic, out=o) for (_, key, _, ids), o in zip(groups, outs, strict=True))
    )
    t2 = time.perf_counter()
    feature_bytes = sum(int(r.nbytes) for r in rows)
    stats.feature_bytes += feature_bytes
    if allocate is None:  # each tensor's rows were gathered into an array of its own
        stats.host_copy_bytes += feature_bytes
    stats.host_copy_bytes += traffic.pulled_into_bytes
    stats.sample += t1 - t0
    stats.pull += t2 - t1
    stats.input_nodes += int(hops.nodes.size)
    stats.traffic.add(traffic)
    feats: dict[str, Any] = {}
    for (a, _, types, _), got in zip(groups, rows, strict=True):
        if parts is None:
            feats[a] = torch.from_numpy(got)
            continue
        bounds = np.cumsum([0, *(pos[nt].size for nt in types)])  # per-type slices: views
        for i, nt in enumerate(types):
            feats.setdefault(a, {})[nt] = torch.from_numpy(got[bounds[i] : bounds[i + 1]])
    return hops, parts, feats


def hops_payload(hops: Hops, parts: dict[str, Any] | None, feats: dict[str, Any]) -> dict[str, Any]:
    """A batch as dicts of tensors: homogeneous, the sample in PyG's layout and every node
    attribute; heterogeneous, ``{"nodes": {ntype: attrs}, "edges": {etype: attrs}}``."""
    t = torch.from_numpy
    if parts is None:
        return {
            "edge_index": torch.stack([t(hops.row), t(hops.col)]),
            **feats,
            "n_id": t(hops.nodes),
            "e_id": t(hops.edge),
            "num_sampled_nodes": list(hops.num_nodes),
            "num_sampled_edges": list(hops.num_edges),
        }
    nodes: dict[str, dict[str, Any]] = {
        nt: {"n_id": t(n), "num_sampled_nodes": parts["nsn"][nt]} for nt, n in parts["node"].items()
    }
    for name, per_type in feats.items():
        for nt, v in per_type.items():
            nodes[nt][name] = v
    edges = {
        c: {
            "edge_index": torch.stack([t(parts["row"][c]), t(parts["col"][c])]),
            "e_id": t(parts["edge"][c]),
            "num_sampled_edges": parts["nse"][c],
        }
        for c in parts["row"]
    }
    return {"nodes": nodes, "edges": edges}
