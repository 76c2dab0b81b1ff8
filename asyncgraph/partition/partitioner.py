"""Offline partitioning: split a :class:`~asyncgraph.partition.graph.Graph` into range-owned partitions.

Pipeline (all vectorised numpy, no Python loop over nodes or edges):

1. assign every node a partition (``asyncgraph.partition.assign``: METIS on the symmetrised
   graph, or a balanced random split);
2. relabel nodes so partition ``p`` owns the contiguous new IDs ``[start_p, end_p)`` (stable by
   original ID inside a part);
3. give every edge to the partition of its destination and relabel edges in CSC order (by new
   destination, then new source), so partition ``p`` owns a contiguous edge-ID range and its
   ``eids`` are ``edge_start + arange``;
4. write ``<graph_name>.json`` plus ``part<p>/`` folders (``asyncgraph.partition.layout``)
   into a temporary sibling folder that is renamed into place only when everything is written.
   The folder's name carries the writer's pid and host; a run removes the temporary folders
   that killed runs on this host left behind (their pid is gone), and the CLI turns SIGTERM
   into an exception so its own temporary folder is removed on the way out.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.kernels.unique_edges import check_simple
from asyncgraph.names import ETYPE, NTYPE, TYPE_EID
from asyncgraph.partition.assign import METHODS, assign_parts, balance_categories
from asyncgraph.partition.book import IdArray
from asyncgraph.partition.config import PartitionConfig, PartSpec, TensorSpec
from asyncgraph.partition.fingerprint import partition_fingerprint, stamp_fingerprints
from asyncgraph.partition.from_pyg import from_pyg, is_pyg_data
from asyncgraph.partition.graph import Graph
from asyncgraph.partition.hetero_graph import HeteroGraph
from asyncgraph.partition.layout import ORIG_EIDS_FILE, ORIG_NIDS_FILE, PartFiles, config_file, part_dir_name
from asyncgraph.partition.output import check_out_path, commit, remove_stale_temp, temp_name
from asyncgraph.partition.typed import check_typed_names, typed_specs, write_typed_part

__all__ = ["METHODS", "partition_graph"]

logger = logging.getLogger("asyncgraph.partition")

# Rows gathered per write when copying tensors into partition files (bounds the extra memory).
_CHUNK_BYTES = 64 << 20


class _Stages:
    """Times named stages; logs each (``extra={"stage", "seconds"}``) and prints if asked."""

    def __init__(self, progress: bool) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.progress:
            print(f"{name}…", end="", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        self.timings[name] = self.timings.get(name, 0.0) + dt
        if self.progress:
            print(f" {dt:.2f} s", file=sys.stderr, flush=True)
        logger.info("%s: %.3f s", name, dt, extra={"stage": name, "seconds": dt})


# --- edge order ----------------------------------------------------------------------------------
def _csc_order(num_nodes: int, new_dst: IdArray, new_src: IdArray) -> tuple[IdArray, IdArray]:
    """Edge order by (new dst, new src, original edge ID): returns (orig_eids, sorted new src).

    When ``dst | src | eid`` fit in 64 bits they are packed into one uint64 and value-sorted,
    which is several times faster than a stable ``argsort`` and needs no gather afterwards.
    """
    num_edges = int(new_dst.size)
    bits_n = max(1, (num_nodes - 1).bit_length())
    bits_e = max(1, (num_edges - 1).bit_length())
    if 2 * bits_n + bits_e <= 64:
        packed = new_dst.astype(np.uint64)
        packed <<= np.uint64(bits_n)
        packed |= new_src.astype(np.uint64, copy=False)
        packed <<= np.uint64(bits_e)
        packed |= np.arange(num_edges, dtype=np.uint64)
        packed.sort()
        orig_eids = (packed & np.uint64((1 << bits_e) - 1)).view(np.int64)
        packed >>= np.uint64(bits_e)
        packed &= np.uint64((1 << bits_n) - 1)
        return orig_eids, packed.view(np.int64)
    key = new_dst * np.int64(num_nodes)
    key += new_src
    orig = np.argsort(key, kind="stable").astype(np.int64, copy=False)
    key = key[orig]
    np.remainder(key, np.int64(num_nodes), out=key)
    return orig, key


# --- writing -------------------------------------------------------------------------------------
def _write_rows(path: Path, source: np.ndarray[Any, Any], rows: IdArray) -> None:
    """Write ``source[rows]`` to an ``.npy`` file in bounded chunks (never the whole gather)."""
    shape = (int(rows.size), *source.shape[1:])
    row_bytes = max(1, int(np.prod(source.shape[1:], dtype=np.int64)) * source.dtype.itemsize)
    chunk = max(1, _CHUNK_BYTES // row_bytes)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(source.dtype), "fortran_order": False, "shape": shape}
        )
        buf = np.empty((min(chunk, max(1, rows.size)), *source.shape[1:]), dtype=source.dtype)
        for start in range(0, rows.size, chunk):
            idx = rows[start : start + chunk]
            out = buf[: idx.size]
            np.take(source, idx, axis=0, out=out, mode="clip")  # idx validated: clip avoids buffering
            out.tofile(f)  # buf is C-contiguous, so this writes the rows in order


def _spec(arr: np.ndarray[Any, Any]) -> TensorSpec:
    """The config entry of a tensor: dtype name and row shape."""
    return TensorSpec(dtype=np.dtype(arr.dtype).name, row_shape=[int(x) for x in arr.shape[1:]])


@overload
def partition_graph(
    graph: Graph | HeteroGraph | str | os.PathLike[str],
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = ...,
    balance_ntypes: Any = ...,
    balance_edges: bool = ...,
    return_mapping: Literal[False] = ...,
    seed: int = ...,
    overwrite: bool = ...,
    progress: bool = ...,
    num_hops: int = ...,
    num_trainers_per_machine: int = ...,
    use_graphbolt: bool = ...,
    multigraph: bool = ...,
) -> None: ...


@overload
def partition_graph(
    graph: Graph | HeteroGraph | str | os.PathLike[str],
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = ...,
    balance_ntypes: Any = ...,
    balance_edges: bool = ...,
    *,
    return_mapping: Literal[True],
    seed: int = ...,
    overwrite: bool = ...,
    progress: bool = ...,
    num_hops: int = ...,
    num_trainers_per_machine: int = ...,
    use_graphbolt: bool = ...,
    multigraph: bool = ...,
) -> tuple[IdArray, IdArray]: ...


@overload
def partition_graph(
    graph: Graph | HeteroGraph | str | os.PathLike[str],
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = ...,
    balance_ntypes: Any = ...,
    balance_edges: bool = ...,
    return_mapping: bool = ...,
    seed: int = ...,
    overwrite: bool = ...,
    progress: bool = ...,
    num_hops: int = ...,
    num_trainers_per_machine: int = ...,
    use_graphbolt: bool = ...,
    multigraph: bool = ...,
) -> tuple[IdArray, IdArray] | None: ...


def partition_graph(
    graph: Graph | HeteroGraph | str | os.PathLike[str],
    graph_name: str,
    num_parts: int,
    out_path: str | os.PathLike[str],
    part_method: str = "metis",
    balance_ntypes: Any = None,
    balance_edges: bool = False,
    return_mapping: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = False,
    num_hops: int = 1,
    num_trainers_per_machine: int = 1,
    use_graphbolt: bool = False,
    multigraph: bool = True,
) -> tuple[IdArray, IdArray] | None:
    """Partition ``graph`` into ``num_parts`` range-owned partitions written under ``out_path``.

    ``part_method`` is ``"metis"`` (min edge cut, node counts within 3% of the mean;
    ``balance_ntypes`` categories evened to within one node per part, ``balance_edges`` in-edges
    per part to within 5% of the mean, both by repair passes after METIS) or ``"random"``
    (seeded balanced split). Each edge belongs to its destination's partition. With
    ``return_mapping`` returns ``(orig_nids, orig_eids)`` (numpy int64): ``orig_nids[new] == old``;
    the same arrays are always written as ``orig_nids.npy``/``orig_eids.npy`` beside the config
    (named in it as ``orig_nids``/``orig_eids``), so CLI users can map results back too.

    ``num_hops`` is DGL's halo depth: a partition here always holds every in-edge of its nodes
    (sources as global IDs), which is DGL's 1 hop, and deeper layers are sampled from their owners,
    so only ``num_hops=1`` is accepted. ``num_trainers_per_machine=T > 1`` (DGL's meaning) first
    splits the graph into ``num_parts * T`` parts, then coalesces each run of ``T`` into one
    partition, so each partition's IDs are ``T`` contiguous sub-ranges, one per trainer; the
    sub-part of every node is stored as node tensor ``trainer_id`` (``part * T + local``, and of
    every edge's destination as edge tensor ``trainer_id``), which ``node_split(...,
    node_trainer_ids=g.ndata["trainer_id"])`` uses to give each trainer its own sub-range.
    ``use_graphbolt`` (DGL's partition scripts pass it) is accepted either way: partitions are
    CSC arrays already, the form DGL converts to for GraphBolt. ``multigraph=False`` declares a
    graph without parallel edges (of one relation): checked here, and a live graph's
    ``add_edges`` then refuses an edge that exists (``DuplicateEdgeError``).
    Invalid arguments raise ``InvalidRequestError`` (a ``ValueError``) before anything is written;
    a failed run leaves ``out_path`` as it was.

    ``graph`` may also be PyG's ``Data`` / ``HeteroData`` (``from_pyg.py``), or the path of a
    DGL chunked-format ``metadata.json``: the graph is then
    partitioned out of core by :func:`asyncgraph.partition.stream.partition_chunked` (default
    memory limit and workers; call it directly for those, ``balance_train`` or ``fennel``).
    """
    if is_pyg_data(graph):  # PyG's Data / HeteroData, tensors under PyG's names
        graph = from_pyg(graph)
    if isinstance(graph, (str, os.PathLike)):
        if not multigraph:
            raise InvalidRequestError("multigraph=False is checked on an in-memory graph, not a chunked one")
        return _partition_path(graph, graph_name, num_parts, out_path, part_method, balance_ntypes,
                               balance_edges, return_mapping, seed, overwrite, progress,
                               num_trainers_per_machine)  # fmt: skip
    # ---- validate everything before touching the disk ----
    hetero: HeteroGraph | None = None
    ntype = etype = None
    if isinstance(graph, HeteroGraph):
        hetero = graph
        check_typed_names(hetero)
        graph, ntype, etype = hetero.to_homogeneous(with_data=False)  # tensors stay per type
    if not isinstance(graph, Graph):
        raise InvalidRequestError(f"graph must be an asyncgraph.Graph, got {type(graph).__name__}")
    if not isinstance(graph_name, str) or not graph_name or "/" in graph_name or graph_name.startswith("."):
        raise InvalidRequestError(
            f"graph_name {graph_name!r} is not valid: it must be a non-empty file name "
            "(no '/', no leading '.')"
        )
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise InvalidRequestError(f"num_parts must be an int, got {type(num_parts).__name__}")
    num_parts = int(num_parts)
    n = graph.num_nodes
    if num_parts < 1 or num_parts > n:
        raise InvalidRequestError(f"num_parts must be in [1, num_nodes={n}], got {num_parts}")
    if part_method not in METHODS:
        raise InvalidRequestError(f"unknown part_method {part_method!r}; expected one of {list(METHODS)}")
    if isinstance(num_hops, bool) or not isinstance(num_hops, (int, np.integer)) or num_hops < 1:
        raise InvalidRequestError(f"num_hops must be a positive int, got {num_hops!r}")
    if num_hops != 1:
        raise InvalidRequestError(
            f"num_hops={num_hops} is not supported: an asyncgraph partition keeps every in-edge of "
            "its nodes (DGL's num_hops=1) and deeper layers are sampled from the nodes' owners at "
            "training time, so no deeper halo is needed; pass num_hops=1 (the default)"
        )
    if not multigraph:
        check_simple(graph.src, graph.dst, etype)
    tpm = num_trainers_per_machine
    if isinstance(tpm, bool) or not isinstance(tpm, (int, np.integer)) or tpm < 1:
        raise InvalidRequestError(f"num_trainers_per_machine must be an int >= 1, got {tpm!r}")
    tpm = int(tpm)
    if num_parts * tpm > n:
        raise InvalidRequestError(
            f"num_parts * num_trainers_per_machine = {num_parts * tpm} exceeds num_nodes={n}"
        )
    reserved = [k for k in ("trainer_id",) if tpm > 1 and (k in graph.ndata or k in graph.edata)]
    if reserved:
        raise InvalidRequestError(
            "num_trainers_per_machine > 1 writes the tensor 'trainer_id'; the graph already has one"
        )
    if hetero is not None and int(num_trainers_per_machine) > 1:
        raise InvalidRequestError(
            "num_trainers_per_machine > 1 is not supported for heterogeneous graphs yet: "
            "partition with 1 and use node_split(..., ntype=) per trainer"
        )
    if ntype is not None and balance_ntypes is None:
        balance_ntypes = ntype  # even every node type across partitions
    categories = balance_categories(balance_ntypes, n)
    out = Path(out_path)
    check_out_path(out, overwrite)

    stage = _Stages(progress)
    # ---- 1. node -> partition ----
    sub_parts = assign_parts(graph, num_parts * tpm, part_method, categories, balance_edges, seed, stage)
    ndata = dict(graph.ndata)
    edata = dict(graph.edata)
    if tpm > 1:  # relabelling by sub-part keeps each partition's trainers' ranges contiguous
        ndata["trainer_id"] = sub_parts
        edata["trainer_id"] = sub_parts[graph.dst]
    parts = sub_parts

    # ---- 2./3. relabel nodes and edges ----
    with stage("relabelling"):
        small = parts.astype(np.int16 if num_parts * tpm < 2**15 else np.int64)
        del parts
        node_bounds = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(np.bincount(small // tpm, minlength=num_parts), out=node_bounds[1:])
        num_t = 1 if hetero is None else len(hetero.ntypes)
        if ntype is not None:  # nodes of one type contiguous inside each partition: sort by (part, type)
            small = small.astype(np.int64) * num_t + ntype  # (tpm == 1 for heterogeneous graphs)
        orig_nids = np.argsort(small, kind="stable").astype(np.int64, copy=False)  # radix for int16
        type_counts = (
            np.bincount(small, minlength=num_parts * num_t).reshape(num_parts, num_t)
            if ntype is not None
            else None
        )
        del small
        new_id = np.empty(n, dtype=np.int64)
        new_id[orig_nids] = np.arange(n, dtype=np.int64)
        new_dst = new_id[graph.dst]
        in_deg = np.bincount(new_dst, minlength=n)
        orig_eids, new_src = _csc_order(n, new_dst, new_id[graph.src])
        del new_id, new_dst
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(in_deg, out=indptr[1:])
        del in_deg
        edge_bounds = indptr[node_bounds]
    etype_counts = None
    if hetero is not None and ntype is not None and etype is not None:
        num_r = len(hetero.canonical_etypes)
        et_new = etype[orig_eids]
        edge_part = np.repeat(np.arange(num_parts, dtype=np.int64), np.diff(edge_bounds))
        etype_counts = np.bincount(edge_part * num_r + et_new, minlength=num_parts * num_r).reshape(
            num_parts, num_r
        )
        # per-type edge ID of every edge (new order), stored in old-ID order like any edge tensor
        first = np.zeros(num_r + 1, dtype=np.int64)
        order = np.argsort(et_new, kind="stable")
        np.cumsum(np.bincount(et_new, minlength=num_r), out=first[1:])
        rank = np.empty(orig_eids.size, dtype=np.int64)
        rank[order] = np.arange(orig_eids.size, dtype=np.int64) - first[et_new[order]]
        type_eid = np.empty(orig_eids.size, dtype=np.int64)
        type_eid[orig_eids] = rank
        ndata[NTYPE] = ntype
        edata[ETYPE] = etype
        edata[TYPE_EID] = type_eid

    # ---- 4. write into a temporary sibling, then rename into place ----
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp(out)
    tmp = out.parent / temp_name(out, "tmp")
    try:
        tmp.mkdir()
        specs: list[PartSpec] = []
        for p in range(num_parts):
            n0, n1 = int(node_bounds[p]), int(node_bounds[p + 1])
            e0, e1 = int(edge_bounds[p]), int(edge_bounds[p + 1])
            with stage(f"writing part {p}"):
                files = PartFiles(tmp / part_dir_name(p))
                files.node_feat_dir.mkdir(parents=True)
                files.edge_feat_dir.mkdir()
                np.save(files.indptr, indptr[n0 : n1 + 1] - e0)
                np.save(files.indices, new_src[e0:e1])
                np.save(files.eids, np.arange(e0, e1, dtype=np.int64))
                for name, arr in ndata.items():
                    _write_rows(files.node_feat(name), arr, orig_nids[n0:n1])
                for name, arr in edata.items():
                    _write_rows(files.edge_feat(name), arr, orig_eids[e0:e1])
                if hetero is not None and ntype is not None and etype is not None:
                    write_typed_part(hetero, _write_rows, files.node_feat, files.edge_feat,
                                     orig_nids[n0:n1], orig_eids[e0:e1], ntype, etype)  # fmt: skip
            specs.append(PartSpec(part_id=p, node_range=(n0, n1), edge_range=(e0, e1), path=part_dir_name(p)))
        del new_src, indptr
        config = PartitionConfig(
            graph_name=graph_name,
            num_nodes=n,
            num_edges=graph.num_edges,
            num_parts=num_parts,
            part_method=part_method,
            parts=specs,
            node_feats={k: _spec(v) for k, v in ndata.items()},
            edge_feats={k: _spec(v) for k, v in edata.items()},
            orig_nids=ORIG_NIDS_FILE,
            orig_eids=ORIG_EIDS_FILE,
            num_trainers_per_machine=tpm,
            multigraph=bool(multigraph),
        )
        np.save(tmp / ORIG_NIDS_FILE, orig_nids)
        np.save(tmp / ORIG_EIDS_FILE, orig_eids)
        if hetero is not None and etype_counts is not None and type_counts is not None:
            config.ntypes = hetero.ntypes
            config.canonical_etypes = hetero.canonical_etypes
            config.ntype_counts = type_counts.tolist()
            config.etype_counts = etype_counts.tolist()
            config.ntype_feats = hetero.ntype_data_names()
            config.etype_feats = hetero.etype_data_names()
            typed_nodes, typed_edges = typed_specs(hetero)  # stored as "<type>/<name>", listed first
            config.node_feats = {**{k: _spec(v) for k, v in typed_nodes.items()}, **config.node_feats}
            config.edge_feats = {**{k: _spec(v) for k, v in typed_edges.items()}, **config.edge_feats}
        cfg_path = config_file(tmp, graph_name)
        cfg_path.write_text(config.model_dump_json(indent=2))
        with stage("fingerprinting"):  # issue 34: servers trust it instead of hashing at start
            stamp_fingerprints(cfg_path, [partition_fingerprint(cfg_path, p) for p in range(num_parts)])
        with stage("committing"):
            commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if return_mapping and hetero is not None and ntype is not None and etype is not None:
        noff, eoff = hetero.node_offsets(), hetero.edge_offsets()
        nt_new, et_new = ntype[orig_nids], etype[orig_eids]
        nmap = {t: orig_nids[nt_new == i] - noff[i] for i, t in enumerate(hetero.ntypes)}
        emap = {c: orig_eids[et_new == i] - eoff[i] for i, c in enumerate(hetero.canonical_etypes)}
        return nmap, emap  # type: ignore[return-value]
    if return_mapping:
        return orig_nids, orig_eids
    return None


def _partition_path(
    meta: str | os.PathLike[str], graph_name: str, num_parts: int, out_path: str | os.PathLike[str],
    part_method: str, balance_ntypes: Any, balance_edges: bool, return_mapping: bool, seed: int,
    overwrite: bool, progress: bool, tpm: int,
) -> tuple[IdArray, IdArray] | None:  # fmt: skip
    """``partition_graph`` of a chunked-format ``metadata.json`` (out of core)."""
    from asyncgraph.partition.stream import partition_chunked

    if balance_ntypes is not None:
        raise InvalidRequestError(
            "balance_ntypes cannot be given with chunked input: use "
            "asyncgraph.partition.stream.partition_chunked(..., balance_train=True)"
        )
    if tpm != 1:
        raise InvalidRequestError("num_trainers_per_machine > 1 is not supported with chunked input yet")
    partition_chunked(
        meta, num_parts, out_path, graph_name=graph_name, part_method=part_method,
        balance_edges=balance_edges, seed=seed, overwrite=overwrite, progress=progress,
    )  # fmt: skip
    if not return_mapping:
        return None
    out = Path(out_path)
    return np.load(out / ORIG_NIDS_FILE), np.load(out / ORIG_EIDS_FILE)


