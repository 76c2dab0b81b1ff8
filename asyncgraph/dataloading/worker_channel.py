"""How a loader and its worker processes talk: framed messages, batch slots, batch layouts.

Each worker has two socketpairs with its loader: a stream for messages (an 8-byte length, then a
pickled tuple: a local channel between a process and the child it started, carrying small
records only; arrays travel as raw bytes or in shared memory) and a datagram socket that carries
the file descriptors of new batch slots (``SCM_RIGHTS``).

A **batch slot** is a memfd the worker creates and maps; the loader maps the same pages (and
pins them on a CUDA host), so a batch the worker builds there is read by the loader without a
copy, and its feature rows, gathered straight into the slot, are copied to the device from
where they landed. A batch's **layout** lists, in ``map_tensors`` order, where each of its
tensors lies in the slot; its **skeleton** is the batch with every tensor replaced by an empty
one of the same dtype, rebuilt on the loader's side over views of the slot.
"""

from __future__ import annotations

import array
import contextlib
import io
import math
import mmap
import os
import pickle
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncgraph.dataloading.device import map_tensors

__all__ = [
    "ALIGN",
    "BatchLayout",
    "Slot",
    "SlotMapping",
    "WorkerSlots",
    "aligned",
    "decode_frame",
    "encode_frame",
    "recv_slot_fd",
    "send_slot_fd",
    "unpack_batch",
]

ALIGN = 64  # every tensor of a slot starts on a 64-byte boundary
_HEADER = struct.Struct("<Q")
MAX_MESSAGE = 256 << 20  # a message larger than this is a broken channel, not a batch


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the slot alignment."""
    return -(-nbytes // ALIGN) * ALIGN


def encode_frame(msg: tuple[Any, ...]) -> bytes:
    """One message: its length, then the pickled tuple."""
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def decode_frame(buffer: bytearray) -> tuple[Any, ...] | None:
    """The first whole message of ``buffer`` (removed from it), or None if it is not all there."""
    if len(buffer) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(buffer)
    if size > MAX_MESSAGE:
        raise ConnectionError(f"loader worker channel: message of {size} bytes")
    end = _HEADER.size + size
    if len(buffer) < end:
        return None
    msg = pickle.loads(bytes(memoryview(buffer)[_HEADER.size : end]))
    del buffer[:end]
    if not isinstance(msg, tuple):
        raise ConnectionError("loader worker channel: a message is not a tuple")
    return msg


def send_slot_fd(sock: socket.socket, slot_id: int, nbytes: int, fd: int) -> None:
    """Hand the loader a new slot's memfd (blocking; one datagram)."""
    sock.sendmsg(
        [struct.pack("<qq", slot_id, nbytes)],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
    )


def recv_slot_fd(sock: socket.socket) -> tuple[int, int, int]:
    """``(slot_id, nbytes, fd)`` of the next slot a worker announced (blocking)."""
    msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 4)
    if len(msg) != 16 or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("loader worker channel: a slot announcement without its descriptor")
    slot_id, nbytes = struct.unpack("<qq", msg)
    return int(slot_id), int(nbytes), fds[0]


class Slot:
    """One memfd-backed buffer of a worker, mapped read-write."""

    def __init__(self, slot_id: int, nbytes: int) -> None:
        self.slot_id = slot_id
        self.nbytes = nbytes
        fd = os.memfd_create(f"asyncgraph-batch-{slot_id}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            self.mm = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        self.fd: int | None = fd  # closed once handed to the loader
        self.array = np.frombuffer(self.mm, dtype=np.uint8)

    def view(self, offset: int, dtype: np.dtype[Any], shape: Sequence[int]) -> np.ndarray:
        """The slot's bytes from ``offset`` as a C-contiguous array."""
        count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
        return np.frombuffer(self.mm, dtype=dtype, count=count, offset=offset).reshape(tuple(shape))

    def close(self) -> None:
        self.array = np.empty(0, dtype=np.uint8)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(BufferError):  # a view still exists; the mapping goes with it
            self.mm.close()


class WorkerSlots:
    """A worker's slots: a free one big enough, else a new one announced to the loader.

    A slot is out from ``acquire`` until the loader says the batch in it is no longer used
    (``release``). Free slots too small for a new batch are retired (closed here, dropped by the
    loader when it reads the ``retired`` list of the next result).
    """

    def __init__(self, fd_sock: socket.socket) -> None:
        self._fd_sock = fd_sock
        self._slots: dict[int, Slot] = {}
        self._free: set[int] = set()
        self._next_id = 0
        self.retired: list[int] = []

    def acquire(self, nbytes: int) -> Slot:
        fits = [i for i in self._free if self._slots[i].nbytes >= nbytes]
        if fits:
            slot_id = min(fits, key=lambda i: self._slots[i].nbytes)
            self._free.discard(slot_id)
            return self._slots[slot_id]
        for i in list(self._free):  # too small for batches of this size: give their memory back
            self._free.discard(i)
            self._slots.pop(i).close()
            self.retired.append(i)
        size = max(1 << 20, -(-int(nbytes * 1.25) // (1 << 20)) * (1 << 20))
        slot = Slot(self._next_id, size)
        self._next_id += 1
        assert slot.fd is not None
        send_slot_fd(self._fd_sock, slot.slot_id, size, slot.fd)
        os.close(slot.fd)
        slot.fd = None
        self._slots[slot.slot_id] = slot
        return slot

    def release(self, slot_id: int) -> None:
        if slot_id in self._slots:
            self._free.add(slot_id)

    def take_retired(self) -> list[int]:
        out, self.retired = self.retired, []
        return out

    def close(self) -> None:
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()
        self._free.clear()


@dataclass
class BatchLayout:
    """Where a batch lies in a slot: ``(offset, dtype, shape)`` per tensor in ``map_tensors``
    order, the bytes used, and the batch's skeleton (pickled)."""

    slot_id: int
    nbytes: int
    tensors: list[tuple[int, str, tuple[int, ...]]]
    skeleton: bytes


def pack_batch(batch: Any, slot: Slot, used: int) -> tuple[BatchLayout, int]:
    """Lay ``batch`` out in ``slot``: tensors already in it keep their place, the others are
    copied after the first ``used`` bytes. Returns the layout and the bytes copied."""
    base = slot.array.ctypes.data
    tensors: list[torch.Tensor] = []
    map_tensors(batch, lambda t: tensors.append(t) or t)  # type: ignore[func-returns-value]
    layout: list[tuple[int, str, tuple[int, ...]]] = []
    cursor = aligned(used)
    copied = 0
    host = torch.from_numpy(slot.array)
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        ptr = t.data_ptr()
        dtype = str(t.dtype).removeprefix("torch.")
        if nbytes and base <= ptr and ptr + nbytes <= base + slot.nbytes and t.is_contiguous():
            layout.append((ptr - base, dtype, tuple(t.shape)))
            continue
        if cursor + nbytes > slot.nbytes:
            raise RuntimeError(f"batch slot of {slot.nbytes} bytes too small (need {cursor + nbytes})")
        if nbytes:
            host[cursor : cursor + nbytes].view(t.dtype).view(t.shape).copy_(t)
            copied += nbytes
        layout.append((cursor, dtype, tuple(t.shape)))
        cursor = aligned(cursor + nbytes)
    out = io.BytesIO()
    _SkeletonPickler(out, {id(t): i for i, t in enumerate(tensors)}).dump(batch)
    return BatchLayout(slot.slot_id, cursor, layout, out.getvalue()), copied


class _SkeletonPickler(pickle.Pickler):
    """Pickles a batch with each of its tensors as its position in the layout (a persistent ID),
    so the loader's unpickler puts the slot's view of that tensor in its place: no bytes, no
    rebuild. (torch's own tensor pickling costs ~0.3 ms a tensor.)"""

    def __init__(self, file: io.BytesIO, index: dict[int, int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._index = index

    def persistent_id(self, obj: Any) -> int | None:
        if isinstance(obj, torch.Tensor):
            return self._index.get(id(obj))
        return None


class _BatchUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, views: list[torch.Tensor]) -> None:
        super().__init__(io.BytesIO(data))
        self._views = views

    def persistent_load(self, pid: Any) -> torch.Tensor:
        return self._views[int(pid)]


def tensor_bytes(batch: Any) -> int:
    """The bytes of every dense tensor of ``batch`` (aligned as in a slot)."""
    total = 0

    def add(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += aligned(t.numel() * t.element_size())
        return t

    map_tensors(batch, add)
    return total


_ITEMSIZE: dict[str, tuple[torch.dtype, int]] = {}


def _dtype(name: str) -> tuple[torch.dtype, int]:
    found = _ITEMSIZE.get(name)
    if found is None:
        dtype = getattr(torch, name)
        found = _ITEMSIZE[name] = (dtype, torch.empty(0, dtype=dtype).element_size())
    return found


def unpack_batch(layout: BatchLayout, host: torch.Tensor) -> Any:
    """The batch over views of ``host`` (the slot's bytes as a uint8 tensor, or their copy on a
    device): each tensor of the skeleton is its view."""
    views = []
    for offset, dtype_name, shape in layout.tensors:
        dtype, itemsize = _dtype(dtype_name)
        nbytes = math.prod(shape) * itemsize
        if nbytes == 0:
            views.append(torch.empty(shape, dtype=dtype, device=host.device))
        else:
            views.append(host[offset : offset + nbytes].view(dtype).view(shape))
    return _BatchUnpickler(layout.skeleton, views).load()


class SlotMapping:
    """One worker slot as mapped in the loader (pinned on a CUDA host)."""

    def __init__(self, fd: int, nbytes: int, pin: bool) -> None:
        try:
            self.mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.nbytes = nbytes
        self.pinned = False
        if pin:
            ptr = np.frombuffer(self.mm, dtype=np.uint8).ctypes.data
            with contextlib.suppress(Exception):
                self.pinned = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0) == 0  # type: ignore[no-untyped-call]
            self.ptr = ptr

    def close(self) -> None:
        if self.pinned:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(self.ptr)  # type: ignore[no-untyped-call]
        with contextlib.suppress(BufferError):
            self.mm.close()
