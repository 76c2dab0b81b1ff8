"""Moving prepared batches to the trainer's device without stalling the training loop.

A batch (blocks, features, labels: any nest of dataclasses, lists, tuples and dicts of tensors)
is packed into one host staging buffer taken from a :class:`StagingPool`, copied to the device
in one ``copy_(..., non_blocking=True)`` on a side CUDA stream, and unpacked as views of that
one device buffer. On the loader's worker thread an event is recorded after the copy; when the
training loop receives the batch its current stream waits on that event (no host sync), and the
device buffer is ``record_stream``-ed on that stream, so the caching allocator does not hand
its memory out again before the training loop's kernels using it have run.

Staging buffers are pinned when the target is a CUDA device (so the copy is a true asynchronous DMA;
never on a CPU-only machine) and reused: the pool keeps ``slots`` of them (the loader's prefetch
depth + 1), grows a buffer when a batch is larger, and adds a slot when every one is in use. A slot
goes back to the pool once its copy has been queued; the next user waits on the copy's event before
overwriting it. Tensors are packed into the slot with one ``memcpy`` each (the pulls still land in
their own numpy buffers).

With ``device="cpu"`` the same pack → copy → unpack runs with no stream, no event and no pinning
(the result never aliases the staging buffer). ``overlap=False`` copies synchronously on the
training loop's thread instead (``Tensor.to(device)``, pageable memory), the baseline the overlap
is measured against.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DeviceCopier", "StagingPool", "StagingSlot", "as_device", "map_tensors"]

_ALIGN = 64  # every tensor starts on a 64-byte boundary of the staging buffer


def as_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device`` (``None`` stays ``None``); ``cuda`` means the current GPU."""
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every dense tensor, in a fixed traversal order.

    Walks dataclasses (a ``Block`` keeps only its cached CSR), lists, tuples and dicts, and objects
    with a ``map_tensors(mapper)`` method (``HeteroBlock``, ``HeteroPairGraph``); anything else
    (numbers, strings, sparse tensors, numpy arrays) is returned as it is.
    """
    from asyncgraph.dataloading.block import Block

    if isinstance(obj, torch.Tensor):
        return fn(obj) if obj.layout == torch.strided else obj
    hook = getattr(obj, "map_tensors", None)
    if callable(hook) and not isinstance(obj, type):  # typed blocks and pair graphs rebuild themselves
        return hook(lambda v: map_tensors(v, fn))
    if isinstance(obj, Block):
        out = Block(
            srcnodes=fn(obj.srcnodes),
            dstnodes=fn(obj.dstnodes),
            edge_index=fn(obj.edge_index),
            eids=fn(obj.eids),
            srcdata={k: map_tensors(v, fn) for k, v in obj.srcdata.items()},
            dstdata={k: map_tensors(v, fn) for k, v in obj.dstdata.items()},
            edata={k: map_tensors(v, fn) for k, v in obj.edata.items()},
        )
        csr = obj._cache.get("csr")
        if csr is not None:
            out._cache["csr"] = tuple(fn(t) for t in csr)
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = {f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return type(obj)(**values)
    if isinstance(obj, list):
        return [map_tensors(v, fn) for v in obj]
    if isinstance(obj, tuple):
        items = [map_tensors(v, fn) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


class StagingSlot:
    """One reusable host buffer and the event of the last copy out of it (``None``: none queued)."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.event: Any = None  # torch.cuda.Event on CUDA

    @property
    def nbytes(self) -> int:
        return int(self.buffer.numel())


class StagingPool:
    """``slots`` reusable host buffers (pinned when ``pin``); ``acquire`` hands out a free one.

    ``acquire(nbytes)`` never returns a slot that is out (no two in-flight batches share a
    buffer); when all are out it adds one. A buffer smaller than ``nbytes`` is replaced by one
    of ``max(nbytes, 2 * old)`` bytes. Before returning a slot whose last copy may still be
    running, it waits for that copy's event (on the caller's thread, a loader worker).
    """

    def __init__(self, slots: int, pin: bool) -> None:
        if slots < 1:
            raise ValueError(f"a staging pool needs at least 1 slot, got {slots}")
        self.pin = pin
        self._lock = threading.Lock()
        self._free = [StagingSlot(0, pin) for _ in range(slots)]
        self.created = slots  # slots made so far (grows only when all are out at once)
        self.grown = 0  # buffers replaced by larger ones

    def acquire(self, nbytes: int) -> StagingSlot:
        """A free slot of at least ``nbytes`` bytes whose previous copy has finished."""
        with self._lock:
            if self._free:
                slot = self._free.pop()
            else:
                slot = StagingSlot(0, self.pin)
                self.created += 1
        if slot.event is not None:
            slot.event.synchronize()  # the previous batch's copy out of this buffer is done
            slot.event = None
        if slot.nbytes < nbytes:
            slot.buffer = torch.empty(max(nbytes, 2 * slot.nbytes), dtype=torch.uint8, pin_memory=self.pin)
            with self._lock:
                self.grown += 1
        return slot

    def release(self, slot: StagingSlot) -> None:
        """Give ``slot`` back (its ``event``, if set, guards the next reuse)."""
        with self._lock:
            self._free.append(slot)

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)


@dataclasses.dataclass
class _Pending:
    """A batch whose device copy is queued: what the consumer must wait on before use."""

    batch: Any
    event: Any = None  # torch.cuda.Event recorded after the copy on the side stream
    buffer: torch.Tensor | None = None  # the device buffer every tensor of the batch views
    packed: int = 0  # host bytes copied into the staging buffer


class DeviceCopier:
    """Moves batches to ``device``: ``stage`` on a loader worker, ``deliver`` in the training loop.

    ``overlap=True`` (default): ``stage`` packs and queues the copy (see the module docstring) and
    ``deliver`` makes the caller's current stream wait for it. ``overlap=False``: ``stage`` does
    nothing and ``deliver`` copies synchronously with ``Tensor.to(device)``.
    """

    def __init__(self, device: str | torch.device, slots: int, overlap: bool = True) -> None:
        dev = as_device(device)
        assert dev is not None
        self.device = dev
        self.overlap = overlap
        self.cuda = dev.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise RuntimeError(f"device {dev} requested but CUDA is not available")
        self.pool = StagingPool(max(1, slots), pin=self.cuda)  # pinned only for a CUDA target
        self._stream: Any = None
        self._stream_lock = threading.Lock()

    def _side_stream(self) -> Any:
        with self._stream_lock:
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            return self._stream

    def stage(self, batch: Any) -> Any:
        """Pack ``batch`` into a staging buffer and queue its copy to the device (worker thread)."""
        if not self.overlap:
            return _Pending(batch)
        tensors: list[torch.Tensor] = []
        map_tensors(batch, lambda t: tensors.append(t) or t)  # type: ignore[func-returns-value]
        offsets: list[int] = []
        total = 0
        for t in tensors:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        slot = self.pool.acquire(total)
        try:
            host = slot.buffer
            for t, off in zip(tensors, offsets, strict=True):
                if t.numel():
                    _view(host, off, t).copy_(t)
            if self.cuda:
                stream = self._side_stream()
                with torch.cuda.device(self.device), torch.cuda.stream(stream):
                    device_buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
                    device_buffer.copy_(host[:total], non_blocking=True)
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(stream)
                slot.event = event
            else:
                device_buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
                device_buffer.copy_(host[:total])
                event = None
        finally:
            self.pool.release(slot)
        views = iter([_view(device_buffer, off, t) for t, off in zip(tensors, offsets, strict=True)])
        packed = sum(t.numel() * t.element_size() for t in tensors)
        return _Pending(map_tensors(batch, lambda _t: next(views)), event, device_buffer, packed)

    def deliver(self, staged: Any) -> Any:
        """The batch on the device, safe to use on the caller's current stream (training thread)."""
        assert isinstance(staged, _Pending)
        if not self.overlap:
            dev = self.device
            return map_tensors(staged.batch, lambda t: t.to(dev))
        if staged.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(staged.event)  # GPU-side wait: the host does not block
            if staged.buffer is not None:
                staged.buffer.record_stream(stream)
        return staged.batch


def _view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """The bytes of ``buffer`` from ``offset`` seen as a contiguous tensor shaped like ``like``."""
    nbytes = like.numel() * like.element_size()
    if nbytes == 0:
        return torch.empty(like.shape, dtype=like.dtype, device=buffer.device)
    return buffer[offset : offset + nbytes].view(like.dtype).view(like.shape)
