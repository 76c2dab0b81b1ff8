"""Read one partition written by ``partition_graph`` (memory-mapped by default)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from asyncgraph.errors import ForeignPartitionError, InvalidRequestError, OutOfRangeError
from asyncgraph.names import DEFAULT_ETYPE, DEFAULT_NTYPE, tensor_key
from asyncgraph.partition.book import IdArray, RangePartitionBook
from asyncgraph.partition.config import PartitionConfig, TensorSpec
from asyncgraph.partition.layout import PartFiles
from asyncgraph.partition.typed import typed_range


@dataclass
class Partition:
    """One partition: its in-edge CSC structure (global IDs) and owned node/edge tensors.

    Owned node ``node_range[0] + i`` has in-edges from ``indices[indptr[i]:indptr[i+1]]`` with
    global edge IDs ``eids[indptr[i]:indptr[i+1]]``.
    """

    config: PartitionConfig
    part_id: int
    book: RangePartitionBook
    node_range: tuple[int, int]
    edge_range: tuple[int, int]
    indptr: IdArray
    indices: IdArray
    eids: IdArray
    node_feats: dict[str, np.ndarray[Any, Any]]
    edge_feats: dict[str, np.ndarray[Any, Any]]

    @property
    def num_owned_nodes(self) -> int:
        """Number of nodes this partition owns."""
        return self.node_range[1] - self.node_range[0]

    @property
    def num_owned_edges(self) -> int:
        """Number of edges (in-edges of owned nodes) this partition owns."""
        return self.edge_range[1] - self.edge_range[0]

    def __iter__(self) -> Iterator[Any]:
        """Unpack like DGL's ``load_partition``: ``(graph, node_feats, edge_feats, gpb,
        graph_name, ntypes, etypes)``; ``graph`` is this partition (its CSC arrays)."""
        ntypes, etypes = homogeneous_types()
        return iter(
            (self, self.node_feats, self.edge_feats, self.book, self.config.graph_name, ntypes, etypes)
        )


def homogeneous_types() -> tuple[dict[str, int], dict[tuple[str, str, str], int]]:
    """DGL's type dictionaries of a homogeneous graph: ``{"_N": 0}`` and ``{("_N", "_E", "_N"): 0}``."""
    return {DEFAULT_NTYPE: 0}, {DEFAULT_ETYPE: 0}


def _read_config(cfg_path: Path) -> PartitionConfig:
    """The config at ``cfg_path``, or ``InvalidRequestError`` saying why it cannot be read."""
    if not cfg_path.is_file():
        raise InvalidRequestError(f"partition config {cfg_path} does not exist")
    try:
        return PartitionConfig.load(cfg_path)
    except ForeignPartitionError:
        raise
    except ValueError as exc:  # pydantic.ValidationError is a ValueError
        raise InvalidRequestError(f"partition config {cfg_path} is invalid: {exc}") from exc


def load_partition_book(
    part_config: str | os.PathLike[str], part_id: int = 0
) -> tuple[RangePartitionBook, str, dict[str, int], dict[tuple[str, str, str], int]]:
    """DGL's ``load_partition_book``: ``(gpb, graph_name, ntypes, etypes)`` from the config.

    The book covers the whole graph (it does not depend on ``part_id``, which is checked only).
    """
    cfg_path = Path(part_config)
    config = _read_config(cfg_path)
    if isinstance(part_id, bool) or not isinstance(part_id, (int, np.integer)):
        raise InvalidRequestError(f"part_id must be an int, got {type(part_id).__name__}")
    if not 0 <= int(part_id) < config.num_parts:
        raise OutOfRangeError(f"part_id {part_id} out of range [0, {config.num_parts}) for {cfg_path}")
    ntypes, etypes = homogeneous_types()
    return config.book(), config.graph_name, ntypes, etypes


def load_partition_feats(
    part_config: str | os.PathLike[str], part_id: int, load_nodes: bool = True, load_edges: bool = True
) -> tuple[dict[str, np.ndarray[Any, Any]] | None, dict[str, np.ndarray[Any, Any]] | None]:
    """DGL's ``load_partition_feats``: the owned rows of partition ``part_id``'s node and edge
    tensors (memory-mapped), ``None`` for a side not asked for."""
    part = load_partition(part_config, part_id)
    return (part.node_feats if load_nodes else None, part.edge_feats if load_edges else None)


CanonicalEType = tuple[str, str, str]


@overload
def load_orig_ids(
    part_config: str | os.PathLike[str], per_type: Literal[False] = False
) -> tuple[IdArray, IdArray]: ...


@overload
def load_orig_ids(
    part_config: str | os.PathLike[str], per_type: Literal[True]
) -> tuple[dict[str, IdArray], dict[CanonicalEType, IdArray]]: ...


def load_orig_ids(part_config: str | os.PathLike[str], per_type: bool = False) -> Any:
    """The ``(orig_nids, orig_eids)`` mapping written beside the config (``orig_nids[new] == old``).

    Node and edge IDs here are homogeneous: for a heterogeneous graph, node types take
    consecutive ID ranges in ``config.ntypes`` order (sorted by name, as DGL's chunked format
    and ``HeteroGraph`` number them) and edge types in ``config.canonical_etypes`` order (the
    input's ``edge_type`` order), each type's IDs in its input order.

    ``per_type=True`` gives DGL's per-type dictionaries instead, ``({ntype: ids},
    {(src, rel, dst): ids})`` with ``ids[new per-type ID] == input per-type ID``; the new
    per-type IDs are the ones a ``DistGraph`` serves (a type's nodes, or edges, in new-ID order:
    by partition, then by input ID within the partition). A homogeneous graph gives
    ``{"_N": orig_nids}`` and ``{("_N", "_E", "_N"): orig_eids}``.
    """
    nids, eids = _load_orig_ids(Path(part_config))
    if not per_type:
        return nids, eids
    config = _read_config(Path(part_config))
    if config.ntypes is None or config.canonical_etypes is None:
        return {DEFAULT_NTYPE: nids}, {DEFAULT_ETYPE: eids}
    nsizes = np.asarray(config.ntype_counts, dtype=np.int64).sum(axis=0)
    esizes = np.asarray(config.etype_counts, dtype=np.int64).sum(axis=0)
    return (_split_by_type(nids, list(config.ntypes), nsizes),
            _split_by_type(eids, [tuple(c) for c in config.canonical_etypes], esizes))  # fmt: skip


def _split_by_type(ids: IdArray, keys: list[Any], sizes: IdArray) -> dict[Any, IdArray]:
    """``{key: per-type IDs}`` of homogeneous ``ids`` whose types take ranges of ``sizes`` in order."""
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    types = np.searchsorted(offsets, ids, side="right") - 1
    out: dict[Any, IdArray] = {}
    for i, key in enumerate(keys):
        mine = ids[types == i]
        mine -= offsets[i]
        out[key] = mine
    return out


def _load_orig_ids(cfg_path: Path) -> tuple[IdArray, IdArray]:
    config = _read_config(cfg_path)
    if config.orig_nids is None or config.orig_eids is None:
        raise InvalidRequestError(f"{cfg_path} names no ID mapping (partitioned by an older asyncgraph)")
    nids = _load(cfg_path.parent / config.orig_nids, mmap=False)
    eids = _load(cfg_path.parent / config.orig_eids, mmap=False)
    _check(cfg_path.parent / config.orig_nids, nids, "int64", (config.num_nodes,))
    _check(cfg_path.parent / config.orig_eids, eids, "int64", (config.num_edges,))
    return nids, eids


def _load(path: Path, mmap: bool) -> np.ndarray[Any, Any]:
    """Load an ``.npy`` file (read-only memory map when ``mmap``), naming it when missing."""
    if not path.is_file():
        raise InvalidRequestError(f"partition file {path} is missing")
    try:
        arr: np.ndarray[Any, Any] = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as exc:
        raise InvalidRequestError(f"partition file {path} is not a valid .npy file: {exc}") from exc
    return arr


def _check(path: Path, arr: np.ndarray[Any, Any], dtype: str, shape: tuple[int, ...]) -> None:
    """Raise if ``arr`` (loaded from ``path``) does not have the dtype and shape the config implies."""
    if arr.dtype != np.dtype(dtype) or tuple(arr.shape) != shape:
        raise InvalidRequestError(
            f"{path} does not match the partition config: expected {dtype} {shape}, "
            f"found {arr.dtype} {tuple(arr.shape)}"
        )


def _tensors(
    path_of: Callable[[str], Path], specs: dict[str, TensorSpec], rows: int, mmap: bool,
    typed_rows: Callable[[str], tuple[int, int] | None],
) -> dict[str, np.ndarray[Any, Any]]:  # fmt: skip
    """Load and check every tensor listed in ``specs`` from the file ``path_of(name)``: ``rows``
    rows, or a per-type tensor's (``typed_rows(name)``: the part's nodes or edges of its type)."""
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, spec in specs.items():
        path = path_of(name)
        arr = _load(path, mmap)
        typed = typed_rows(name)
        _check(path, arr, spec.dtype, (rows if typed is None else typed[1] - typed[0], *spec.row_shape))
        out[name] = arr
    return out


def load_partition(part_config: str | os.PathLike[str], part_id: int, mmap: bool = True) -> Partition:
    """Load partition ``part_id`` of the graph described by the JSON file ``part_config``.

    Arrays are read-only memory maps when ``mmap`` (the default), so several processes share
    the page cache. The result also unpacks like DGL's ``load_partition``: ``graph, node_feats,
    edge_feats, gpb, graph_name, ntypes, etypes = load_partition(part_config, part_id)`` (tensor
    dictionaries keyed by plain names, ``"feat"``, where DGL writes ``"_N/feat"``). Raises ``OutOfRangeError``
    for a bad ``part_id`` and ``InvalidRequestError`` when a file is missing or disagrees with
    the config.
    """
    cfg_path = Path(part_config)
    config = _read_config(cfg_path)
    if isinstance(part_id, bool) or not isinstance(part_id, (int, np.integer)):
        raise InvalidRequestError(f"part_id must be an int, got {type(part_id).__name__}")
    part_id = int(part_id)
    if not 0 <= part_id < config.num_parts or len(config.parts) != config.num_parts:
        raise OutOfRangeError(f"part_id {part_id} out of range [0, {config.num_parts}) for {cfg_path}")
    spec = config.parts[part_id]
    if spec.part_id != part_id:
        raise InvalidRequestError(f"{cfg_path}: parts[{part_id}] describes partition {spec.part_id}")
    book = config.book()
    if book.num_nodes != config.num_nodes or book.num_edges != config.num_edges:
        raise InvalidRequestError(
            f"{cfg_path}: partition ranges cover {book.num_nodes} nodes / {book.num_edges} edges, "
            f"config says {config.num_nodes} / {config.num_edges}"
        )
    files = PartFiles(config.part_dir(cfg_path, part_id))
    n0, n1 = book.node_range(part_id)
    e0, e1 = book.edge_range(part_id)
    indptr = _load(files.indptr, mmap)
    indices = _load(files.indices, mmap)
    eids = _load(files.eids, mmap)
    _check(files.indptr, indptr, "int64", (n1 - n0 + 1,))
    _check(files.indices, indices, "int64", (e1 - e0,))
    _check(files.eids, eids, "int64", (e1 - e0,))
    if int(indptr[0]) != 0 or int(indptr[-1]) != e1 - e0:
        raise InvalidRequestError(
            f"{files.indptr} must run from 0 to {e1 - e0}, runs from {int(indptr[0])} to {int(indptr[-1])}"
        )
    if e1 > e0 and (int(eids[0]) != e0 or int(eids[-1]) != e1 - 1):
        raise InvalidRequestError(f"{files.eids} does not cover the edge range [{e0}, {e1})")
    return Partition(
        config=config,
        part_id=part_id,
        book=book,
        node_range=(n0, n1),
        edge_range=(e0, e1),
        indptr=indptr,
        indices=indices,
        eids=eids,
        node_feats=_tensors(files.node_feat, config.node_feats, n1 - n0, mmap,
                            lambda name: typed_range(book, part_id, tensor_key("node", name))),
        edge_feats=_tensors(files.edge_feat, config.edge_feats, e1 - e0, mmap,
                            lambda name: typed_range(book, part_id, tensor_key("edge", name))),
    )


def summarize_partitions(part_config: str | os.PathLike[str]) -> list[dict[str, int]]:
    """Per-partition statistics: owned nodes, in-edges, train nodes and cut (remote-source) edges.

    ``train_nodes`` counts the ``train_mask`` node tensor when the graph has one (else 0);
    ``remote_src_edges`` counts owned edges whose source is owned by another partition.
    """
    config = PartitionConfig.load(Path(part_config))
    return [summarize_part(part_config, p) for p in range(config.num_parts)]


def summarize_part(part_config: str | os.PathLike[str], p: int) -> dict[str, int]:
    """Partition ``p``'s row of :func:`summarize_partitions` (a task on the host that holds the
    part's files when they are on its local disk: ``--part-worker``)."""
    part = load_partition(part_config, p)
    n0, n1 = part.node_range
    remote = int(np.count_nonzero((part.indices < n0) | (part.indices >= n1)))
    train = part.node_feats.get("train_mask")
    return {
        "part_id": p,
        "owned_nodes": part.num_owned_nodes,
        "in_edges": part.num_owned_edges,
        "train_nodes": int(np.count_nonzero(train)) if train is not None else 0,
        "remote_src_edges": remote,
    }


def format_summary(rows: list[dict[str, int]]) -> str:
    """The summary table printed at the end: one line per part plus totals and the cut fraction."""
    head = f"{'part':>5} {'nodes':>12} {'in-edges':>14} {'train':>10} {'cut edges':>14}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['part_id']:>5} {r['owned_nodes']:>12,} {r['in_edges']:>14,} {r['train_nodes']:>10,} "
            f"{r['remote_src_edges']:>14,}"
        )
    tn = sum(r["owned_nodes"] for r in rows)
    te = sum(r["in_edges"] for r in rows)
    tt = sum(r["train_nodes"] for r in rows)
    tc = sum(r["remote_src_edges"] for r in rows)
    lines.append("-" * len(head))
    lines.append(f"{'total':>5} {tn:>12,} {te:>14,} {tt:>10,} {tc:>14,}")
    frac = tc / te if te else 0.0
    lines.append(f"edge cut: {tc:,} of {te:,} edges have a remote source ({frac:.2%})")
    return "\n".join(lines)
