"""Partition files served in place: an ``.npy`` file's data mapped read-only (issue 34).

A server used to copy every partition file into memfds at start (15-16 s per partition at 2^24
nodes, and the bytes twice in memory: the copy and the page cache). A ``FileArray`` maps the
file itself, ``MAP_SHARED`` and read-only, after checking its header against what the config
says (dtype, shape, C order, native byte order) and its size (exactly header + data): start-up
reads the headers only. It holds one ``O_RDONLY`` descriptor, which is what co-located
processes are sent (with the data's offset), so every process maps the same page-cache pages:
the memory is counted once, and through that descriptor nobody can write (``mmap`` with
``PROT_WRITE`` is refused, ``write(2)`` fails). The kernel may drop the pages under memory
pressure and read them again from the file: they are file-backed, not part of any budget.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import PartitionFileError
from asyncgraph.storage.memfd import SharedArray

__all__ = ["FileArray", "is_file_backed", "npy_layout"]


def npy_layout(fh: Any, path: str | Path) -> tuple[int, tuple[int, ...], np.dtype[Any]]:
    """``(data offset, shape, dtype)`` from the ``.npy`` header at the start of ``fh``.

    Refuses (``PartitionFileError``) what cannot be mapped as rows: not an ``.npy`` file,
    Fortran order with more than one dimension, a non-native byte order, object or structured
    dtypes."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, OSError) as exc:
        raise PartitionFileError(f"partition file {path} is not a valid .npy file: {exc}") from None
    dt = np.dtype(dtype)
    if fortran and len(shape) > 1:
        raise PartitionFileError(
            f"partition file {path} is stored in Fortran order: its rows cannot be mapped; rewrite "
            "it C-ordered (np.save(path, np.ascontiguousarray(a))) or start the server with "
            "--copy-partition-data"
        )
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise PartitionFileError(f"partition file {path} holds dtype {dt}: not a numeric array")
    if not dt.isnative:
        raise PartitionFileError(
            f"partition file {path} is in foreign byte order ({dt.str}): it cannot be served in place; "
            "rewrite it in this machine's byte order or start the server with --copy-partition-data"
        )
    return int(fh.tell()), tuple(int(d) for d in shape), dt


class FileArray(SharedArray):
    """A read-only array over an ``.npy`` file's data, shared by its ``O_RDONLY`` descriptor.

    ``seal`` is a no-op (the descriptor cannot write) and ``write_sealed`` is true."""

    file_backed = True

    @classmethod
    def open_npy(cls, path: str | Path, dtype: Any, shape: tuple[int, ...]) -> FileArray:
        """Map ``path``'s data, checking that it holds exactly ``dtype`` ``shape`` (its header
        and its size); ``PartitionFileError`` says what disagrees."""
        want = np.dtype(dtype)
        with open(path, "rb") as fh:
            offset, have_shape, have = npy_layout(fh, path)
            if have != want or have_shape != tuple(shape):
                raise PartitionFileError(
                    f"{path} does not match the partition config: expected {want} {tuple(shape)}, "
                    f"found {have} {have_shape}"
                )
            size = os.fstat(fh.fileno()).st_size
            need = offset + int(np.prod(have_shape, dtype=np.int64)) * have.itemsize
            if size != need:
                raise PartitionFileError(
                    f"partition file {path} holds {size} bytes, its header describes {need} "
                    "(truncated, or bytes appended)"
                )
            fd = os.dup(fh.fileno())  # O_RDONLY, close-on-exec (dup of an inheritable=False fd is too)
        os.set_inheritable(fd, False)
        arr = cls._map(fd, have_shape, have, writable=False, offset=offset, huge=False)
        arr.offset = offset
        return arr  # type: ignore[return-value]  # _map builds a cls

    def seal(self, *, read_only: bool) -> None:
        """Nothing to seal: the descriptor is read-only."""

    @property
    def write_sealed(self) -> bool:
        return True

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"fd={self._fd}"
        return f"FileArray(shape={self.shape}, dtype={self.dtype}, offset={self.offset}, {state})"


def is_file_backed(data: Any) -> bool:
    """Whether ``data`` (a store's rows) is a file's page cache, not memory of its own: a
    ``FileArray`` or a read-only ``np.memmap`` (stores without shared memory)."""
    return bool(getattr(data, "file_backed", False)) or isinstance(data, np.memmap)
