"""Parquet chunks of DGL's chunked graph format (``"format": {"name": "parquet"}``), streamed.

DGL's tools (``chunk_graph``, the dispatcher's array parser) and GraphStorm's ``gconstruct``
write an array as a table: one column per element of a row (a pandas ``DataFrame`` of the array,
reshaped to ``(rows, -1)`` when it has more than two dimensions) with the array's shape in the
schema metadata (``b"shape": b"(rows, d1, d2)"``), or a single column of lists, one vector a row
(Spark's features). An edge chunk is two integer columns (source, destination per-type IDs). Without
``shape`` metadata a table of ``C`` columns has row shape ``(C,)``, as DGL reads it.

Rows are read as record batches of a bounded size (``BATCH_BYTES``) from the row groups that
overlap the rows asked for, through a buffered stream (column chunks are not loaded whole); the
reader also holds the current data page of every column (pyarrow writes pages of ~1 MiB), which
``--memory-limit``'s plan does not count yet. A range starting inside a row group decodes that
row group from its start (write row groups no larger than a task's share of the limit). pyarrow
is an optional dependency (``pip install 'asyncgraph[parquet]'``); without it a parquet chunk is
one error naming the file and the extra.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.partition.chunked_checks import fail

__all__ = ["BATCH_BYTES", "STREAM_BUFFER", "parquet_header", "parquet_rows", "reader_bytes"]

BATCH_BYTES = 8 << 20  # decoded bytes per record batch (a batch is at least one row)
STREAM_BUFFER = 64 << 10  # read buffer per column: column chunks are not loaded whole
PAGES_BYTES = 3 << 20  # a column's data and dictionary pages and decoding space, at most
_INDEX = re.compile(r"^__index_level_\d+__$")  # a pandas index stored as a column: not data


def _pq(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise fail(path, "format 'parquet' needs pyarrow: pip install 'asyncgraph[parquet]'") from None
    return pq


def _columns(schema: Any) -> list[str]:
    return [n for n in schema.names if not _INDEX.match(n)]


def parquet_header(path: Path, data: bool) -> tuple[int, str, tuple[int, ...], int]:
    """``(rows, dtype, row shape, reader bytes)`` of a parquet chunk, from its footer (no row is
    read); reader bytes: see :func:`reader_bytes`."""
    pq = _pq(path)
    import pyarrow as pa

    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (OSError, ValueError, pa.ArrowException) as exc:  # its message may quote the file: not shown
        raise fail(path, f"not a readable parquet file ({type(exc).__name__} in its footer)") from None
    cols = _columns(schema)
    if not cols:
        raise fail(path, "parquet chunk has no column")
    types = [schema.field(c).type for c in cols]
    if len(cols) == 1 and (pa.types.is_list(types[0]) or pa.types.is_large_list(types[0])
                           or pa.types.is_fixed_size_list(types[0])):  # fmt: skip
        value, width = types[0].value_type, _list_width(path, pq, types[0], cols[0], meta.num_rows)
    else:
        if len(set(types)) != 1:
            raise fail(path, f"parquet columns have different types ({sorted({str(t) for t in types})}); "
                             "one type for every column is needed")  # fmt: skip
        value, width = types[0], len(cols)
    if not (pa.types.is_integer(value) or pa.types.is_floating(value) or pa.types.is_boolean(value)):
        raise fail(path, f"parquet column type {value} is not numeric")
    dtype = np.dtype(value.to_pandas_dtype())
    row_shape: tuple[int, ...] = (width,)
    shape = (schema.metadata or {}).get(b"shape")
    if shape is not None:
        row_shape = _shape(path, shape, meta.num_rows, width)
    if not data and (row_shape != (2,) or dtype.kind not in "iu"):
        raise fail(path, f"edge chunk must hold two integer columns, got row shape {row_shape} {dtype}")
    per_column = dtype.itemsize * (width if len(cols) == 1 else 1)
    return int(meta.num_rows), dtype.name, row_shape, reader_bytes(meta, len(cols), per_column)


def reader_bytes(meta: Any, columns: int, value_bytes: int) -> int:
    """What reading a chunk holds besides its batch: per column, its read buffer and its current
    data and dictionary pages (1 MiB each at pyarrow's defaults, less in a smaller row group).
    Measured: 92 MiB for 32 float32 columns of 1M-row row groups (this estimate: 98 MiB)."""
    rows = max((meta.row_group(i).num_rows for i in range(meta.num_row_groups)), default=0)
    return columns * (STREAM_BUFFER + min(PAGES_BYTES, 2 * rows * value_bytes))


def _list_width(path: Path, pq: Any, typ: Any, col: str, rows: int) -> int:
    """The length of every vector of a list column (fixed-size, or read from the first row)."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(typ):
        return int(typ.list_size)
    if rows == 0:
        return 0
    first = next(pq.ParquetFile(path).iter_batches(batch_size=1, columns=[col]))
    return len(first.column(0)[0].values)


def _shape(path: Path, text: bytes, rows: int, width: int) -> tuple[int, ...]:
    """The row shape from DGL's ``shape`` metadata (a tuple literal), checked against the table."""
    try:
        shape = ast.literal_eval(text.decode("ascii"))
        ok = isinstance(shape, tuple) and shape and all(type(s) is int and s >= 0 for s in shape)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        ok = False
    if not ok:
        raise fail(path, "parquet 'shape' metadata is not a tuple of sizes such as (1000, 16)")
    if shape[0] != rows or int(np.prod(shape[1:], dtype=np.int64)) != width:
        raise fail(path, f"parquet 'shape' metadata {shape} does not match the table ({rows} rows of "
                         f"{width} values)")  # fmt: skip
    return tuple(shape[1:])


def parquet_rows(
    path: Path, lo: int, hi: int, dtype: str, row_shape: tuple[int, ...], block_rows: int
) -> Iterator[tuple[int, np.ndarray[Any, Any]]]:
    """Rows ``[lo, hi)`` as ``(first row, block)`` pairs of at most ``block_rows`` rows each."""
    pq = _pq(path)
    pf = pq.ParquetFile(path, buffer_size=STREAM_BUFFER, pre_buffer=False)  # pages read as needed
    cols = _columns(pf.schema_arrow)
    width = int(np.prod(row_shape, dtype=np.int64))
    row_bytes = max(1, width * np.dtype(dtype).itemsize)
    batch = max(1, min(block_rows, BATCH_BYTES // row_bytes))
    start = 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if start + n <= lo or start >= hi:
            start += n
            continue
        at = start
        for rb in pf.iter_batches(batch_size=batch, row_groups=[g], columns=cols, use_threads=False):
            k = rb.num_rows
            a, b = max(lo, at), min(hi, at + k)
            if a < b:
                yield a, _to_numpy(path, rb.slice(a - at, b - a), dtype, row_shape, width)
            at += k
            if at >= hi:
                return
        start += n


def _to_numpy(
    path: Path, rb: Any, dtype: str, row_shape: tuple[int, ...], width: int
) -> np.ndarray[Any, Any]:
    """A record batch as a ``(rows, *row_shape)`` array of ``dtype`` (nulls refused)."""
    k = rb.num_rows
    out = np.empty((k, width), dtype=dtype)
    if rb.num_columns == 1 and width and hasattr(rb.column(0), "flatten"):  # one vector a row
        col = rb.column(0)
        if col.null_count or col.flatten().null_count:
            raise fail(path, "parquet chunk has null values")
        values = col.flatten().to_numpy(zero_copy_only=False)
        if values.size != k * width:
            raise fail(path, f"parquet vectors are not all of length {width}")
        out[:] = values.reshape(k, width)
    else:
        for i in range(rb.num_columns):
            col = rb.column(i)
            if col.null_count:
                raise fail(path, "parquet chunk has null values")
            out[:, i] = col.to_numpy(zero_copy_only=False)
    return out.reshape((k, *row_shape))
