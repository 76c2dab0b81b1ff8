"""DGL's *Chunked Graph Format*: read ``metadata.json`` and its chunks, one piece at a time.

The format (DGL's ``docs/source/guide/distributed-preprocessing.rst``) is a ``metadata.json``::

    {"graph_name": "g", "node_type": ["paper", ...], "num_nodes_per_chunk": [[n0, n1], ...],
     "edge_type": ["paper:cites:paper", ...], "num_edges_per_chunk": [[e0, e1], ...],
     "edges": {"paper:cites:paper": {"format": {"name": "csv", "delimiter": " "},
                                     "data": ["edges/cites-0.csv", ...]}},
     "node_data": {"paper": {"feat": {"format": {"name": "numpy"}, "data": [...]}}},
     "edge_data": {"paper:cites:paper": {"w": {"format": {"name": "numpy"}, "data": [...]}}}}

``num_nodes_per_type``/``num_edges_per_type`` (totals) are accepted in place of, or beside, the
per-chunk lists. Paths are relative to the folder of ``metadata.json`` (or absolute). Edge chunks
are ``csv`` (two per-type IDs a line), ``parquet`` (two integer columns; DGL's dispatcher reads
both) or ``numpy`` (an ``(E, 2)`` integer ``.npy``: asyncgraph's extension, not DGL's); data
chunks are ``numpy`` or ``parquet`` (:mod:`asyncgraph.partition.chunked_parquet`, which needs the
optional pyarrow). Node types are numbered in
sorted order and edge types in ``edge_type`` order, as :class:`~asyncgraph.partition.hetero_graph.HeteroGraph`
does, so homogeneous IDs are those of ``HeteroGraph.to_homogeneous``. Every problem raises
:class:`ChunkedFormatError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.partition.chunked_checks import (
    ChunkedFormatError,
    check_name,
    check_unique,
    native,
    reject_duplicate_keys,
)
from asyncgraph.partition.chunked_checks import fail as _fail
from asyncgraph.partition.chunked_csv import iter_csv
from asyncgraph.partition.chunked_parquet import parquet_header, parquet_rows
from asyncgraph.partition.config import dgl_partition_error
from asyncgraph.partition.graph import Graph
from asyncgraph.partition.hetero_graph import HeteroGraph

__all__ = ["ChunkFile", "ChunkedFormatError", "ChunkedGraph", "load_chunked", "read_metadata"]

FORMATS = ("csv", "numpy", "parquet")
DATA_FORMATS = ("numpy", "parquet")
#: The largest ``metadata.json`` read (it is parsed whole; ten thousand chunks take ~1 MiB).
MAX_METADATA_BYTES = 64 << 20


@dataclass(frozen=True)
class ChunkFile:
    """One chunk file: rows ``[start, start + rows)`` of its type (per-type IDs)."""

    path: Path
    fmt: str
    delimiter: str
    start: int
    rows: int
    dtype: str = "int64"
    row_shape: tuple[int, ...] = ()
    reader_bytes: int = 0  # parquet: what its reader holds besides the rows (memory planning)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class ChunkedGraph:
    """The validated description of a chunked graph (nothing but headers is read)."""

    meta_path: Path
    graph_name: str
    ntypes: list[str]  # sorted: homogeneous node IDs are type-major in this order
    num_nodes: dict[str, int]
    canonical_etypes: list[tuple[str, str, str]]
    edges: dict[tuple[str, str, str], list[ChunkFile]]
    node_data: dict[str, dict[str, list[ChunkFile]]] = field(default_factory=dict)
    edge_data: dict[tuple[str, str, str], dict[str, list[ChunkFile]]] = field(default_factory=dict)

    @property
    def is_homogeneous(self) -> bool:
        return len(self.ntypes) == 1 and len(self.canonical_etypes) == 1

    def node_offsets(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        out = np.zeros(len(self.ntypes) + 1, dtype=np.int64)
        np.cumsum([self.num_nodes[t] for t in self.ntypes], out=out[1:])
        return out

    def edge_offsets(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        out = np.zeros(len(self.canonical_etypes) + 1, dtype=np.int64)
        np.cumsum([sum(c.rows for c in self.edges[e]) for e in self.canonical_etypes], out=out[1:])
        return out

    def feature_specs(self, kind: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Stored name (``"<type>/<name>"``, ``"src:rel:dst/<name>"``) -> (dtype, row shape) of
        the per-type node (``"node"``) or edge tensors: each type's own, whatever the others'."""
        per_type: dict[Any, dict[str, list[ChunkFile]]] = dict(
            self.node_data.items() if kind == "node" else self.edge_data.items()
        )
        out: dict[str, tuple[str, tuple[int, ...]]] = {}
        for key, feats in per_type.items():
            type_key = key if isinstance(key, str) else ":".join(key)
            for name, chunks in feats.items():
                out[f"{type_key}/{name}"] = (chunks[0].dtype, chunks[0].row_shape)
        return dict(sorted(out.items()))


def _counts(meta: dict[str, Any], names: list[str], kind: str, path: Path) -> list[list[int] | int]:
    """Per type: the per-chunk list (``num_<kind>_per_chunk``) or the total (``..._per_type``)."""
    chunk_key, type_key = f"num_{kind}_per_chunk", f"num_{kind}_per_type"
    per_chunk, per_type = meta.get(chunk_key), meta.get(type_key)
    if per_chunk is None and per_type is None:
        raise _fail(path, f"missing key {chunk_key!r} (or {type_key!r})")
    out: list[list[int] | int] = []
    for i, name in enumerate(names):
        total: int | None = None
        if per_type is not None:
            if not isinstance(per_type, list) or len(per_type) != len(names):
                raise _fail(path, f"{type_key!r} must list one count per type ({len(names)})")
            total = per_type[i]
            if not isinstance(total, int) or total < 0:
                raise _fail(path, f"{type_key!r}[{i}] ({name}) is not a count: {total!r}")
        if per_chunk is not None:
            if not isinstance(per_chunk, list) or len(per_chunk) != len(names):
                raise _fail(path, f"{chunk_key!r} must hold one list per type ({len(names)})")
            lst = per_chunk[i]
            if not isinstance(lst, list) or not all(isinstance(c, int) and c >= 0 for c in lst):
                raise _fail(path, f"{chunk_key!r}[{i}] ({name}) is not a list of counts: {lst!r}")
            if total is not None and sum(lst) != total:
                raise _fail(path, f"{name}: {chunk_key} sums to {sum(lst)} but {type_key} says {total}")
            out.append(list(lst))
        else:
            assert total is not None
            out.append(total)
    return out


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """Shape, dtype and data offset of an ``.npy`` file, checking the file holds all its bytes."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except (OSError, ValueError, EOFError) as exc:  # the message may quote the header: not shown
        raise _fail(path, f"not a readable .npy file ({type(exc).__name__} in its magic or header)") from None
    if fortran:
        raise _fail(path, "Fortran-ordered arrays are not supported; save it C-ordered")
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = path.stat().st_size
    if size < need:
        raise _fail(path, f"truncated: {size} bytes, its header needs {need} for shape {shape}")
    return tuple(int(s) for s in shape), dtype, offset


def _spec_files(spec: Any, where: str, path: Path, data: bool) -> tuple[str, str, list[Path]]:
    if not isinstance(spec, dict) or "format" not in spec or "data" not in spec:
        raise _fail(path, f"{where} must be {{'format': {{'name': ...}}, 'data': [paths]}}")
    fmt = spec["format"]
    name = fmt.get("name") if isinstance(fmt, dict) else None
    allowed = DATA_FORMATS if data else FORMATS
    if name not in allowed:
        raise _fail(path, f"{where}: unknown format {name!r}; expected one of {list(allowed)}")
    delim = fmt.get("delimiter", " ") if isinstance(fmt, dict) else " "
    files = spec["data"]
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise _fail(path, f"{where}: 'data' must be a non-empty list of file paths")
    resolved = [(path.parent / f) if not Path(f).is_absolute() else Path(f) for f in files]
    for f in resolved:
        if not f.is_file():
            raise _fail(f, f"missing chunk file ({where})")
    return str(name), str(delim), resolved


def _layout(files: list[Path], fmt: str, delim: str, counts: list[int] | int, where: str,
            data: bool) -> list[ChunkFile]:  # fmt: skip
    """Chunk files with their row ranges; numpy headers are checked against the counts."""
    if isinstance(counts, list) and len(counts) != len(files):
        raise _fail(files[0].parent, f"{where}: {len(files)} chunk files but {len(counts)} chunk counts")
    out: list[ChunkFile] = []
    start = 0
    for i, f in enumerate(files):
        dtype, row_shape, reader = "int64", tuple[int, ...](), 0
        if fmt == "numpy":
            shape, dt, _ = _npy_header(f)
            rows = shape[0] if shape else 0
            if not data and (len(shape) != 2 or shape[1] != 2 or dt.kind not in "iu"):
                raise _fail(f, f"edge chunk must be an (E, 2) integer array, got {shape} {dt}")
            if data and (not shape or dt.kind not in "biuf"):
                raise _fail(f, f"data chunk must be a numeric array with rows, got {shape} {dt}")
            dtype, row_shape = dt.name, shape[1:]
        elif fmt == "parquet":
            rows, dtype, row_shape, reader = parquet_header(f, data)
        if fmt != "csv":
            if isinstance(counts, list) and rows != counts[i]:
                raise _fail(f, f"holds {rows} rows but metadata.json says {counts[i]} ({where})")
        else:
            rows = counts[i] if isinstance(counts, list) else -1  # csv: counted while reading
        out.append(ChunkFile(f, fmt, delim, start, rows, dtype, row_shape, reader))
        start += max(rows, 0)
    return out


def read_metadata(meta_path: str | Path) -> ChunkedGraph:
    """Parse and check ``metadata.json`` and every chunk's header; reads no chunk body but csv."""
    path = Path(meta_path)
    if not path.is_file():
        raise _fail(path, "metadata file does not exist")
    size = path.stat().st_size
    if size > MAX_METADATA_BYTES:
        raise _fail(path, f"is {size} bytes, over the {MAX_METADATA_BYTES} read of a metadata.json")
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=reject_duplicate_keys)
    except OSError as exc:
        raise _fail(path, f"cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise _fail(path, f"not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:  # its message is a position, never the text
        raise _fail(path, f"not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:  # a repeated key (reject_duplicate_keys)
        raise _fail(path, f"not valid metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise _fail(path, "must hold a JSON object")
    foreign = dgl_partition_error(meta, path)  # DGL's partitions are a metadata.json too
    if foreign is not None:
        raise foreign
    for key in ("node_type", "edge_type", "edges"):
        if key not in meta:
            raise _fail(path, f"missing key {key!r}")
    ntypes = meta["node_type"]
    if not isinstance(ntypes, list) or not ntypes or not all(isinstance(t, str) and t for t in ntypes):
        raise _fail(path, "'node_type' must be a non-empty list of names")
    for t in ntypes:
        check_name(t, "node type", path, type_name=True)
    check_unique(ntypes, "node type", path)
    etypes_raw = meta["edge_type"]
    if not isinstance(etypes_raw, list) or not etypes_raw:
        raise _fail(path, "'edge_type' must be a non-empty list of 'src:rel:dst' names")
    canon: list[tuple[str, str, str]] = []
    for e in etypes_raw:
        parts = e.split(":") if isinstance(e, str) else []
        if len(parts) != 3 or not all(parts) or parts[0] not in ntypes or parts[2] not in ntypes:
            raise _fail(path, f"edge type {e!r} is not 'src_type:rel:dst_type' over node_type")
        check_name(parts[1], "relation", path, type_name=True)
        canon.append((parts[0], parts[1], parts[2]))
    check_unique(etypes_raw, "edge type", path)
    ncounts = _counts(meta, ntypes, "nodes", path)
    ecounts = _counts(meta, list(etypes_raw), "edges", path)
    num_nodes = {t: (sum(c) if isinstance(c, list) else c) for t, c in zip(ntypes, ncounts, strict=True)}
    edges: dict[tuple[str, str, str], list[ChunkFile]] = {}
    for e, c, cnt in zip(etypes_raw, canon, ecounts, strict=True):
        spec = meta["edges"].get(e) if isinstance(meta["edges"], dict) else None
        if spec is None:
            raise _fail(path, f"'edges' has no entry for edge type {e!r}")
        fmt, delim, files = _spec_files(spec, f"edges[{e!r}]", path, data=False)
        edges[c] = _layout(files, fmt, delim, cnt, f"edges of {e}", data=False)
        if fmt != "csv" and not isinstance(cnt, list) and sum(x.rows for x in edges[c]) != cnt:
            raise _fail(
                path, f"{e}: chunks hold {sum(x.rows for x in edges[c])} edges, num_edges_per_type says {cnt}"
            )
        if fmt == "csv" and not isinstance(cnt, list):
            raise _fail(path, f"{e}: csv edge chunks need 'num_edges_per_chunk' (rows of each file)")
    g = ChunkedGraph(path, str(meta.get("graph_name") or path.parent.name), sorted(ntypes), num_nodes,
                     canon, edges)  # fmt: skip
    for kind, section in (("node", "node_data"), ("edge", "edge_data")):
        block = meta.get(section) or {}
        if not isinstance(block, dict):
            raise _fail(path, f"{section!r} must be an object")
        for tkey, feats in block.items():
            tkey = str(tkey)
            dkey: Any = tkey
            if kind == "node":
                if tkey not in num_nodes:
                    raise _fail(path, f"{section}: unknown node type {tkey!r}")
                rows = num_nodes[tkey]
            else:
                if tkey not in etypes_raw:
                    raise _fail(path, f"{section}: unknown edge type {tkey!r}")
                dkey = canon[etypes_raw.index(tkey)]
                rows = sum(x.rows for x in edges[dkey])
            if not isinstance(feats, dict):
                raise _fail(path, f"{section}[{tkey!r}] must map tensor names to chunk specs")
            out: dict[str, list[ChunkFile]] = {}
            for name, spec in feats.items():
                check_name(name, f"{section}[{tkey!a}] tensor name", path)
                fmt, delim, files = _spec_files(spec, f"{section}[{tkey!r}][{name!r}]", path, data=True)
                chunks = _layout(files, fmt, delim, rows, f"{section} {tkey}/{name}", data=True)
                have = sum(x.rows for x in chunks)
                if have != rows:
                    raise _fail(
                        files[-1], f"{section} {tkey}/{name}: chunks hold {have} rows, the type has {rows}"
                    )
                if len({(x.dtype, x.row_shape) for x in chunks}) != 1:
                    raise _fail(files[0], f"{section} {tkey}/{name}: chunks disagree in dtype or row shape")
                out[name] = chunks
            (g.node_data if kind == "node" else g.edge_data)[dkey] = out
    g.feature_specs("node")
    g.feature_specs("edge")
    return g


# --- reading ---------------------------------------------------------------------------------------
def iter_edges(
    chunk: ChunkFile, lo: int, hi: int, block_rows: int, where: str
) -> Iterator[tuple[int, np.ndarray[Any, np.dtype[np.int64]]]]:
    """Rows ``[lo, hi)`` of an edge chunk as ``(first row, (k, 2) int64 block)`` pairs.

    A numpy chunk is sliced through a memory map; a parquet chunk is decoded record batch by
    record batch; a csv chunk is parsed block by block (whole
    lines of about ``block_rows`` rows), so memory stays bounded whatever the file's size; a csv
    chunk is always read whole (``lo == 0``, ``hi == rows``) and its line count checked.
    """
    if chunk.fmt == "numpy":
        arr = np.load(chunk.path, mmap_mode="r")
        for a in range(lo, hi, block_rows):
            yield a, np.ascontiguousarray(arr[a : min(hi, a + block_rows)], dtype=np.int64)
        return
    if chunk.fmt == "parquet":
        for a, block in parquet_rows(chunk.path, lo, hi, chunk.dtype, chunk.row_shape, block_rows):
            yield a, block.astype(np.int64, copy=False)
        return
    yield from iter_csv(chunk.path, chunk.delimiter, chunk.rows, block_rows, where)


def read_rows(chunk: ChunkFile, lo: int, hi: int) -> np.ndarray[Any, Any]:
    """Rows ``[lo, hi)`` of a data chunk (a copy of just those rows, in native byte order)."""
    if chunk.fmt == "parquet":
        out = np.empty((hi - lo, *chunk.row_shape), dtype=chunk.dtype)
        for a, block in parquet_rows(chunk.path, lo, hi, chunk.dtype, chunk.row_shape, max(1, hi - lo)):
            out[a - lo : a - lo + block.shape[0]] = block
        return out
    arr = np.load(chunk.path, mmap_mode="r")
    return native(np.array(arr[lo:hi]))


def check_ids(ids: np.ndarray[Any, Any], limit: int, chunk: ChunkFile, what: str) -> None:
    """Raise if any ID is outside ``[0, limit)`` (naming the file and the first bad ID)."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise _fail(chunk.path, f"{what} ID {bad} is outside [0, {limit})")


def load_chunked(meta_path: str | Path) -> Graph | HeteroGraph:
    """The whole chunked graph in memory (small graphs; the in-memory reference of the pipeline)."""
    g = read_metadata(meta_path)
    pairs: dict[tuple[str, str, str], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
    for c in g.canonical_etypes:
        parts = [b for x in g.edges[c] for _, b in iter_edges(x, 0, x.rows, 1 << 20, str(c))]
        both = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
        check_ids(both[:, 0], g.num_nodes[c[0]], g.edges[c][0], f"source ({c[0]})")
        check_ids(both[:, 1], g.num_nodes[c[2]], g.edges[c][0], f"destination ({c[2]})")
        pairs[c] = (both[:, 0].copy(), both[:, 1].copy())
    ndata = {t: {k: np.concatenate([read_rows(x, 0, x.rows) for x in v]) for k, v in d.items()}
             for t, d in g.node_data.items()}  # fmt: skip
    edata = {c: {k: np.concatenate([read_rows(x, 0, x.rows) for x in v]) for k, v in d.items()}
             for c, d in g.edge_data.items()}  # fmt: skip
    if g.is_homogeneous:
        (t,), (c,) = g.ntypes, g.canonical_etypes
        return Graph(g.num_nodes[t], pairs[c][0], pairs[c][1], ndata.get(t), edata.get(c))
    hg = HeteroGraph(pairs, g.num_nodes)
    for t, d in ndata.items():
        hg.nodes[t].data.update(d)
    for c, d in edata.items():
        hg.edges[c].data.update(d)
    return hg
