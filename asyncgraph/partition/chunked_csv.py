"""Reading a csv edge chunk (two integer IDs a line) in bounded memory, whatever the file holds.

The file is read in blocks of whole lines; a line longer than ``MAX_LINE_BYTES`` is refused
as soon as it is seen (before: a chunk with a 1 GiB line was buffered whole and took the run
past 6 GiB at a 512 MiB limit). A line that is not two integer IDs is reported by its line
number and column, never by its text: the chunk may be any file the caller can read.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.partition.chunked_checks import MAX_LINE_BYTES, fail

__all__ = ["iter_csv"]

IdBlock = np.ndarray[Any, np.dtype[np.int64]]
_INT64 = (-(2**63), 2**63 - 1)
#: The most bytes read at once (~350k lines): with ``MAX_LINE_BYTES``, what a chunk can make the
#: reader hold, whatever the file holds.
BLOCK_BYTES = 4 << 20


def _bad_line(data: bytes, delim: bytes | None, first_line: int) -> str:
    """Line (and column) of the first line of ``data`` that is not two int64 IDs (error path)."""
    for i, raw in enumerate(data.split(b"\n")):
        line = raw.split(b"#", 1)[0].strip()
        if not line:
            continue
        fields = line.split(delim) if delim is not None else line.split()
        if len(fields) != 2:
            return f"line {first_line + i}: expected two IDs, found {len(fields)} fields"
        for col, text in enumerate(fields, 1):
            try:
                value = int(text.strip())
            except ValueError:
                return f"line {first_line + i}, column {col}: not an integer ID"
            if not _INT64[0] <= value <= _INT64[1]:
                return f"line {first_line + i}, column {col}: ID does not fit in 64 bits"
    last = first_line + data.count(b"\n")
    return f"lines {first_line}-{last}: not two integer IDs a line"


def iter_csv(
    path: Path, delimiter: str, rows: int, block_rows: int, where: str
) -> Iterator[tuple[int, IdBlock]]:
    """``(first row, (k, 2) int64 block)`` pairs of a whole csv chunk; its line count is checked
    against ``rows`` (what ``metadata.json`` says)."""
    delim = None if delimiter.strip() == "" else delimiter
    bdelim = delim.encode() if delim is not None else None
    block_bytes = min(BLOCK_BYTES, max(1 << 16, block_rows * 24))
    row = 0
    line = 1  # the file's line number of the first line of the next block
    tail = b""
    try:
        f = open(path, "rb")  # noqa: SIM115 (a generator: closed in finally)
    except OSError as exc:
        raise fail(path, f"cannot read ({exc.strerror})") from None
    try:
        while True:
            buf = f.read(block_bytes)
            data = tail + buf
            if not buf:
                tail = b""
            else:
                cut = data.rfind(b"\n") + 1
                data, tail = data[:cut], data[cut:]
                if len(tail) > MAX_LINE_BYTES:
                    at = line + data.count(b"\n")
                    raise fail(path, f"line {at} is longer than {MAX_LINE_BYTES} bytes; a line holds two IDs")
            if data.strip():
                try:
                    arr = np.loadtxt(io.BytesIO(data), dtype=np.int64, delimiter=delim, ndmin=2)
                except ValueError:
                    raise fail(path, _bad_line(data, bdelim, line)) from None
                if arr.shape[1:] != (2,):
                    raise fail(path, _bad_line(data, bdelim, line))
                if row + arr.shape[0] > rows:
                    raise fail(path, f"holds more than the {rows} lines metadata.json says ({where})")
                yield row, arr
                row += arr.shape[0]
            line += data.count(b"\n")
            if not buf:
                break
    finally:
        f.close()
    if row != rows:
        raise fail(path, f"holds {row} lines but metadata.json says {rows} ({where}); truncated?")
