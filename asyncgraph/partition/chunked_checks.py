"""Checks of untrusted chunked input that would otherwise reach the file system (issue 32).

``metadata.json`` names become paths (``node_feat/<name>.npy``, ``<ntype>.txt``) and server
keys, so a name is refused unless it is a plain, printable file name that collides with nothing
the partitioner writes itself; duplicated types or JSON keys are refused rather than silently
merged; chunk values are read in native byte order; and a parse error names the file and the
line, never the bytes it found there (the chunk may be any file the caller can read).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.names import ETYPE, NTYPE, TYPE_EID, TYPE_ORDER

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_NAME_BYTES",
    "RESERVED_NAMES",
    "ChunkedFormatError",
    "check_name",
    "check_unique",
    "fail",
    "native",
    "reject_duplicate_keys",
]

#: Longest tensor or type name (UTF-8 bytes): a file name, and a server key with room for its
#: policy prefix and optimizer-state suffix within the protocol's name limit.
MAX_NAME_BYTES = 200
#: Longest line of a csv edge chunk (two integer IDs): a longer one is refused, not buffered.
MAX_LINE_BYTES = 4096
#: Names the partitioner writes itself (structure files, the type tensors): never a user tensor's.
RESERVED_NAMES = frozenset(
    n.lower() for n in ("indptr", "indices", "eids", "orig_nids", "orig_eids", "node_feat", "edge_feat",
                        NTYPE, ETYPE, TYPE_EID, TYPE_ORDER)
)  # fmt: skip
_FORBIDDEN = re.compile(r"[/\\#:\x00]")


class ChunkedFormatError(InvalidRequestError):
    """The chunked input is malformed: the message names the file and what is wrong."""


def fail(where: Path | str, what: str) -> ChunkedFormatError:
    """The error for ``where`` (a file) and ``what`` is wrong with it."""
    return ChunkedFormatError(f"{where}: {what}")


def check_name(name: object, what: str, path: Path, *, type_name: bool = False) -> str:
    """``name`` if it is a safe file name for ``what``, else an error naming the file.

    Refused: not a string, empty, longer than ``MAX_NAME_BYTES``, not printable, ``/``, ``\\``,
    ``#``, ``:`` or NUL in it, a leading dot (``.``, ``..``, hidden files), and (tensors) the
    reserved names of the partition's own files, case-insensitively.
    """
    if not isinstance(name, str) or not name:
        raise fail(path, f"{what} must be a non-empty name")
    shown = ascii(name[:64]) + ("..." if len(name) > 64 else "")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise fail(path, f"{what} {shown} is longer than {MAX_NAME_BYTES} bytes")
    if not name.isprintable() or _FORBIDDEN.search(name) or name.startswith("."):
        raise fail(
            path, f"{what} {shown} is not a safe file name (printable, no '/', '\\', '#', ':', NUL, "
            "no leading '.')"
        )
    if not type_name and name.lower() in RESERVED_NAMES:
        raise fail(path, f"{what} {shown} is reserved for the partition's own files")
    return name


def check_unique(names: Iterable[str], what: str, path: Path) -> None:
    """Refuse a list that names one type twice (it would count the type's nodes or edges twice)."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise fail(path, f"{what} {n[:64]!a} is listed twice")
        seen.add(n)


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: an object with a repeated key is refused (JSON would keep the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:64]!a} appears twice in one object")
        out[key] = value
    return out


def native(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``arr`` in native byte order with the same values (a big-endian ``.npy`` is converted)."""
    if arr.dtype.byteorder in ("=", "|") or arr.dtype.isnative:
        return arr
    return arr.astype(arr.dtype.newbyteorder("="))
