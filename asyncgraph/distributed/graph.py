"""``DistGraph``: the user's view of a partitioned graph, DGL-like."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from asyncgraph.arrays import as_id_array, unique_sorted
from asyncgraph.client.sync_client import Client
from asyncgraph.errors import InvalidRequestError, OutOfRangeError, UnknownEdgeError, UnknownTensorError
from asyncgraph.names import is_state_key, split_typed, tensor_prefix
from asyncgraph.partition.added_ids import added_edges_to_homo
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.store import PartitionStore, TensorMeta

from .context import get_client, rank_world
from .edge_ids import attach_edge_ids
from .hetero import HeteroSample, NodeTypes, sample_etype_neighbors
from .hetero_edges import EdgeTypes, EdgeView, typed_endpoints
from .queries import ALL, EdgePartitionPolicy, NodePartitionPolicy, SampledSubgraph, relabel
from .tensor import DistTensor


class TensorView(MutableMapping[str, DistTensor]):
    """``g.ndata`` / ``g.edata``: name -> DistTensor for one partition policy."""

    def __init__(self, client: Client, policy: str) -> None:
        self._client = client
        self._policy = policy
        self._prefix = tensor_prefix(policy)
        self._aliases: dict[str, DistTensor] = {}

    @property
    def client(self) -> Client:
        return self._client

    def _stored(self) -> list[str]:
        """Stored names of this policy's user tensors (optimizer state ``name#state`` hidden)."""
        metas = self._client.refresh_tensors()
        return [
            m.name[len(self._prefix) :]
            for m in metas
            if m.name.startswith(self._prefix) and not is_state_key(m.name)
        ]

    def _names(self) -> list[str]:
        """User tensors of this policy; per-type ones (``"paper/feat"``) are listed by their
        type's view (``g.nodes[ntype].data``), not here."""
        names = [n for n in self._stored() if split_typed(n) is None]
        return sorted(set(names) | set(self._aliases))

    def typed_names(self, type_key: str) -> list[str]:
        """Names of the per-type tensors stored for node type / edge type key ``type_key``."""
        split = [split_typed(n) for n in self._stored()]
        return sorted(s[1] for s in split if s is not None and s[0] == type_key)

    def meta_of(self, name: str) -> TensorMeta | None:
        """The stored tensor ``name``'s meta (catalog cache, refreshed once when missing)."""
        key = self._prefix + name
        meta = self._client.cached_meta(key)
        if meta is None:
            self._client.refresh_tensors()
            meta = self._client.cached_meta(key)
        return meta

    def __getitem__(self, name: str) -> DistTensor:
        if name in self._aliases:
            return self._aliases[name]
        meta = self.meta_of(name)
        if meta is None:
            raise UnknownTensorError(f"no {self._policy} tensor {name!r}; known: {self._names()}")
        return DistTensor._attach(self._client, meta)

    def __setitem__(self, name: str, tensor: DistTensor) -> None:
        if not isinstance(tensor, DistTensor):
            raise InvalidRequestError(
                f"only a DistTensor can be added to {self._policy} data, got {type(tensor).__name__}"
            )
        if tensor.policy != self._policy:
            raise InvalidRequestError(f"{tensor!r} is sharded by {tensor.policy}s, not {self._policy}s")
        self._aliases[name] = tensor  # the view holds the handle, as DGL's ndata does

    def __delitem__(self, name: str) -> None:
        alias = self._aliases.pop(name, None)
        if alias is not None and alias.name != name:
            return  # only the alias goes; the tensor keeps its own name
        (alias if alias is not None else self[name]).delete()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._names()


class AttrScheme(NamedTuple):
    """One tensor's row shape and dtype (DGL's ``Scheme``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class DistGraph:
    """A partitioned graph served by asyncgraph servers, or held in-process when standalone."""

    def __init__(
        self, graph_name: str, part_config: str | Path | None = None, *, client: Client | None = None
    ) -> None:
        self._client = client if client is not None else get_client(graph_name, part_config)
        if self._client.graph_name != graph_name:
            raise InvalidRequestError(
                f"the servers hold graph {self._client.graph_name!r}, not {graph_name!r}"
            )
        self.graph_name = graph_name
        self.ndata = TensorView(self._client, "node")
        self.edata = TensorView(self._client, "edge")
        self.nodes = NodeTypes(self.ndata, self._client.book)
        attach_edge_ids(self._client)  # the book maps per-type edge IDs through this client
        self.edges_by_type = EdgeTypes(
            self.edata, self._client.book, self._client, self.get_edge_partition_policy
        )
        #: ``g.edges(form=, order=, etype=)`` and ``g.edges[etype].data[name]``, as DGL's
        self.edges = EdgeView(self.edges_by_type, self._list_edges)

    @property
    def client(self) -> Client:
        return self._client

    def num_nodes(self, ntype: str | None = None) -> int:
        """Nodes of the graph, or of node type ``ntype``."""
        if ntype is None:
            return self._client.book.num_nodes
        return self._client.book.num_nodes_of(ntype)

    def num_edges(self, etype: Any = None) -> int:
        """Edges of the graph, or of edge type ``etype`` (relation name or canonical triple)."""
        if etype is None:
            return self._client.book.num_edges
        return self._client.book.num_edges_of(etype)

    # --- node and edge types ------------------------------------------------------------------
    @property
    def ntypes(self) -> list[str]:
        return self._client.book.ntypes

    @property
    def etypes(self) -> list[str]:
        return self._client.book.etypes

    @property
    def canonical_etypes(self) -> list[tuple[str, str, str]]:
        return self._client.book.canonical_etypes

    def to_canonical_etype(self, etype: Any) -> tuple[str, str, str]:
        book = self._client.book
        return book.canonical_etypes[book.etype_id(etype)]

    def sample_etype_neighbors(self, seeds: Any, fanout: Any, *, seed: int | None = None) -> HeteroSample:
        """In-edges of ``{ntype: ids}`` with a fanout per edge type (int or dict by edge type)."""
        return sample_etype_neighbors(self, seeds, fanout, seed=seed)

    def number_of_nodes(self) -> int:
        return self.num_nodes()

    def number_of_edges(self) -> int:
        return self.num_edges()

    def get_partition_book(self) -> RangePartitionBook:
        """The partition book; its ``partid`` is this process's home partition (DGL's)."""
        book = self._client.book
        book.partid = self._home_partition()
        return book

    def _attr_schemes(self, view: TensorView) -> dict[str, AttrScheme]:
        out: dict[str, AttrScheme] = {}
        for name in view:
            t = view[name]
            out[name] = AttrScheme(tuple(t.shape[1:]), t.dtype)
        return out

    def node_attr_schemes(self) -> dict[str, AttrScheme]:
        """``{name: AttrScheme(row shape, dtype)}`` of the node tensors (DGL's)."""
        return self._attr_schemes(self.ndata)

    def edge_attr_schemes(self) -> dict[str, AttrScheme]:
        """``{name: AttrScheme(row shape, dtype)}`` of the edge tensors (DGL's)."""
        return self._attr_schemes(self.edata)

    def get_ntype_id(self, ntype: str | None) -> int:
        """Index of ``ntype`` in ``ntypes``."""
        return self._client.book.ntype_id(ntype)

    def get_etype_id(self, etype: Any) -> int:
        """Index of an edge type (name or canonical triple) in ``canonical_etypes``."""
        return self._client.book.etype_id(etype)

    @property
    def local_partition(self) -> PartitionStore | None:
        """The store of a partition this process reads through shared memory (or in-process)."""
        for part in self._client.partitions:
            if part.store is not None:
                return part.store
        return None

    @property
    def local_partition_ids(self) -> list[int]:
        return self._client.local_partitions()

    def sample_neighbors(
        self,
        seeds: Any,
        fanout: int,
        edge_dir: str = "in",
        prob: str | None = None,
        exclude: Any = None,
        replace: bool = False,
        *,
        seed: int | None = None,
        output: str = "graph",
    ) -> SampledSubgraph | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sampled edges of ``seeds`` (see ``asyncgraph.sample_neighbors``): a ``SampledSubgraph``
        that unpacks as ``(src, dst, eid)``, or that tuple with ``output="tuple"``."""
        if isinstance(seeds, dict) or isinstance(fanout, dict):
            if edge_dir != "in" or exclude is not None or replace:
                raise InvalidRequestError(
                    "typed sampling (dict seeds or fanouts) supports edge_dir='in', no exclude= and "
                    "replace=False only"
                )
            return sample_etype_neighbors(self, seeds, fanout, seed=seed, prob=prob)  # type: ignore[return-value]
        if output not in ("graph", "tuple"):
            raise InvalidRequestError(f"output must be 'graph' or 'tuple', got {output!r}")
        if edge_dir == "in" and prob is None and exclude is None:
            src, dst, eids = self._client.sample_neighbors(seeds, fanout, replace=replace, seed=seed)
        else:
            opts = {"edge_dir": edge_dir, "replace": replace, "seed": seed, "prob": prob, "exclude": exclude}
            src, dst, eids = self._client.sample_edges(seeds, fanout, **opts)
        num = self.num_nodes()
        if src.size and max(int(src.max()), int(dst.max())) >= num:  # added nodes (issue 35)
            num = max(int(src.max()), int(dst.max())) + 1
        sub = SampledSubgraph(src, dst, eids, num)
        return sub.to_tuple() if output == "tuple" else sub

    # --- structure queries --------------------------------------------------------------------
    def _degrees(self, ids: Any, edge_dir: str) -> torch.Tensor | int:
        if ids is None or (isinstance(ids, slice) and ids == ALL):
            return torch.from_numpy(self._client.degrees(None, edge_dir))
        scalar = isinstance(ids, int | np.integer) or (isinstance(ids, torch.Tensor) and ids.dim() == 0)
        out = torch.from_numpy(self._client.degrees(ids, edge_dir))
        return int(out[0]) if scalar else out

    def in_degrees(self, v: Any = ALL) -> torch.Tensor | int:
        """In-degrees (int64) of nodes ``v`` (every node by default); an int for one node."""
        return self._degrees(v, "in")

    def out_degrees(self, u: Any = ALL) -> torch.Tensor | int:
        """Out-degrees of nodes ``u``: every partition counts its edges from them."""
        return self._degrees(u, "out")

    def _list_edges(
        self, form: str = "uv", order: str = "eid", etype: Any = None
    ) -> tuple[torch.Tensor, ...]:
        """Every edge's global ``(src, dst)`` in edge-ID order (``form="all"`` adds the IDs);
        with ``etype`` (heterogeneous), that type's edges in per-type IDs and per-type node IDs."""
        book = self._client.book
        if etype is None or not book.is_hetero:
            live = self._client.live_edges()  # a live graph's (issue 35): base + added - removed
            if live is not None:
                return SampledSubgraph(*live, self.num_nodes()).edges(form)
            eids = np.arange(self.num_edges(), dtype=np.int64)
            src, dst = self._client.find_edges(eids)
            return SampledSubgraph(src, dst, eids, self.num_nodes()).edges(form)
        tids = np.arange(self.num_edges(etype), dtype=np.int64)
        s, d = self.find_edges(tids, etype=etype)
        return SampledSubgraph(s.numpy(), d.numpy(), tids, self.num_nodes()).edges(form)

    def in_subgraph(self, nodes: Any, relabel_nodes: bool = False) -> SampledSubgraph:
        """Every in-edge of ``nodes`` (global IDs; ``relabel_nodes`` compacts the node set)."""
        seeds = unique_sorted(as_id_array(nodes, "nodes"))
        src, dst, eids = self._client.sample_neighbors(seeds, -1)
        if relabel_nodes:
            nids, lsrc, ldst = relabel(src, dst)
            return SampledSubgraph(lsrc, ldst, eids, nids.size, nids)
        return SampledSubgraph(src, dst, eids, self.num_nodes())

    def edge_subgraph(self, edges: Any, relabel_nodes: bool = True) -> SampledSubgraph:
        """The edges ``edges`` (global IDs) and, relabelled, their endpoints as ``ndata[NID]``."""
        eids = as_id_array(edges, "edges")
        src, dst = self._client.find_edges(eids)
        if relabel_nodes:
            nids, lsrc, ldst = relabel(src, dst)
            return SampledSubgraph(lsrc, ldst, eids, nids.size, nids)
        return SampledSubgraph(src, dst, eids, self.num_nodes())

    # --- job and partition metadata ---------------------------------------------------------
    def rank(self) -> int:
        """This trainer's rank (torch.distributed, else $RANK, else 0)."""
        return rank_world()[0]

    def get_num_clients(self) -> int:
        """Trainers the servers expect (1 standalone)."""
        return self._client.num_clients

    @property
    def num_clients(self) -> int:
        return self._client.num_clients

    def _home_partition(self) -> int:
        """The one partition read locally, else this rank's share (all co-located on one host)."""
        local = self.local_partition_ids
        if len(local) == 1:
            return local[0]
        rank, world = rank_world()
        return rank * self._client.book.num_partitions() // world

    def get_node_partition_policy(self, ntype: str | None = None) -> NodePartitionPolicy:
        """The node policy (of node type ``ntype``: tensors made with it hold that type's rows)."""
        if ntype is not None:
            self._client.book.ntype_id(ntype)  # UnknownTypeError for an unknown type
        return NodePartitionPolicy(self._client.book, self._home_partition(), ntype)

    def get_edge_partition_policy(self, etype: Any = None) -> EdgePartitionPolicy:
        """The edge policy (of edge type ``etype``: tensors made with it hold that type's rows)."""
        return EdgePartitionPolicy(self._client.book, self._home_partition(), etype=etype)

    @property
    def idtype(self) -> torch.dtype:
        return torch.int64

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def barrier(self, name: str = "default", timeout: float = 300.0) -> None:
        self._client.barrier(name, timeout)

    def find_edges(self, eids: Any, etype: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Global int64 ``(src, dst)`` endpoints of edge IDs ``eids`` (DGL's ``find_edges``); with
        ``etype`` (heterogeneous), ``eids`` are that type's per-type IDs and the endpoints are
        per-type node IDs of its source and destination types, as DGL returns them."""
        book = self._client.book
        if etype is None or not book.is_hetero:
            if etype is not None:
                book.etype_id(etype)  # UnknownTypeError for an unknown type
            src, dst = self._client.find_edges(eids)
            return torch.from_numpy(src), torch.from_numpy(dst)
        kind = book.canonical_etypes[book.etype_id(etype)]
        try:
            homo = added_edges_to_homo(book, as_id_array(eids, "eids"), etype)  # added edges too
            src, dst = self._client.find_edges(homo)
        except OutOfRangeError as err:  # say which type's IDs
            raise type(err)(f"{kind} edge IDs: {err}") from err
        return typed_endpoints(book, src, dst)

    def add_edges(self, u: Any, v: Any, etype: Any = None, data: Any = None) -> torch.Tensor:
        """Add the edges ``u[i] -> v[i]`` while others sample (DGL's ``add_edges``); returns
        their new edge IDs (IDs of existing edges never change). Each destination's owner
        stores its share atomically, with its rows of ``data`` (``{name: rows}`` of edge data,
        a row per edge; data not named reads zeros, as in DGL): see the README's "Live graph".
        A heterogeneous graph takes per-type node IDs of ``etype``'s end types and answers
        per-type edge IDs (``E_etype + p + k * P``)."""
        return torch.from_numpy(self._client.add_edges(u, v, data, etype))

    def add_nodes(
        self, num: int, ntype: Any = None, data: Any = None, part: int | None = None
    ) -> torch.Tensor:
        """Add ``num`` nodes (DGL's ``add_nodes``) owned by partition ``part`` (None: the one
        with the fewest nodes); returns their IDs, ``num_nodes() + part + k * num_parts``
        (of type ``ntype``: per-type IDs ``num_nodes(ntype) + part + k * num_parts``).
        They take edges at once; ``num_nodes()`` stays the base's. ``data`` (``{name: rows}``
        of node data, a row per node) is stored with them; data not named reads zeros (DGL's
        default), and ``g.ndata[name][ids]`` reads and writes their rows."""
        return torch.from_numpy(self._client.add_nodes(num, part, data, ntype))

    def remove_edges(self, eids: Any, etype: Any = None) -> None:
        """Remove edges ``eids`` (DGL's ``remove_edges``; the other edges keep their IDs; with
        ``etype``, that type's per-type IDs). ``UnknownEdgeError``, with nothing removed, for
        an ID that is not a live edge (of ``etype``)."""
        book = self._client.book
        ids = as_id_array(eids, "eids")
        if etype is not None and book.is_hetero:
            r = book.etype_id(etype)  # UnknownTypeError
            kind, per_type = book.canonical_etypes[r], ids
            try:
                ids = added_edges_to_homo(book, per_type, etype)
                types, _ = book.map_to_per_etype(ids)  # the owners' rows (new edges' too)
            except OutOfRangeError as err:
                raise type(err)(f"{kind} edge IDs: {err}") from err
            if types.size and bool((types != r).any()):
                bad = int(per_type[types != r][0])
                raise UnknownEdgeError(f"remove_edges: {bad} is not an edge of type {kind}")
        elif etype is not None:
            book.etype_id(etype)  # UnknownTypeError for an unknown type
        self._client.remove_edges(ids)

    def compact(self) -> list[dict[str, float]]:
        """Fold every partition's added and removed edges into a new CSC while others read and
        write (issue 35); IDs do not change. Per partition: edges folded, seconds, bytes."""
        return self._client.compact()

    def __repr__(self) -> str:
        mode = "standalone" if self._client.is_standalone else "distributed"
        if not self._client.is_standalone:  # which path each partition's data takes, as found
            local = set(self._client.local_partitions())
            parts = range(self._client.book.num_partitions())
            shm = [p for p in parts if p in local]
            tcp = [p for p in parts if p not in local]
            mode += f"; partitions via shared memory {shm}, via the socket {tcp}"
        return (
            f"DistGraph({self.graph_name!r}, num_nodes={self.num_nodes()}, num_edges={self.num_edges()}, "
            f"num_parts={self._client.book.num_partitions()}, {mode})"
        )
