"""Request handlers: turn a decoded request into a store operation and a result.

Handlers see only Python values and numpy arrays (never bytes or sockets). Each op validates its
arguments before touching the store, so a bad request raises a typed error and changes nothing.
Synchronous handlers run to completion on the event loop, which makes every request atomic with
respect to every other request of this server; the store's lock extends that to co-located
clients writing through shared memory.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from asyncgraph.errors import (
    BarrierTimeoutError,
    DTypeMismatchError,
    InvalidRequestError,
    UnknownOpError,
)
from asyncgraph.kernels.edges import find_edges_partition
from asyncgraph.kernels.partition_sampling import sample_partition
from asyncgraph.kernels.sparse_optim import apply_sparse_update
from asyncgraph.protocol import PROTOCOL_VERSION
from asyncgraph.storage.store import PartitionStore

Handler = Callable[[Mapping[str, Any]], Any]


def boot_id() -> str:
    """An identifier of this host's running kernel: equal boot IDs mean 'same machine'."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return socket.gethostname()


def _get(args: Mapping[str, Any], op: str, key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in args:
        raise InvalidRequestError(f"{op}: missing argument {key!r}")
    value = args[key]
    if kind is int and isinstance(value, bool):
        raise InvalidRequestError(f"{op}: argument {key!r} must be int, got bool")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidRequestError(f"{op}: argument {key!r} must be {names}, got {type(value).__name__}")
    return value


def _ids(args: Mapping[str, Any], op: str, key: str = "ids") -> np.ndarray:
    ids: np.ndarray = _get(args, op, key, np.ndarray)
    if ids.dtype.kind not in "iu":
        raise DTypeMismatchError(f"{op}: {key} must be an integer array, got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise DTypeMismatchError(f"{op}: {key} must be one-dimensional, got shape {ids.shape}")
    return ids


@dataclass
class _Barrier:
    generation: int = 0
    arrived: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)


class Barriers:
    """Named, reusable barriers released when ``num_clients`` clients have arrived."""

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self._barriers: dict[str, _Barrier] = {}

    async def wait(self, name: str, timeout: float) -> int:
        barrier = self._barriers.setdefault(name, _Barrier())
        barrier.arrived += 1
        generation = barrier.generation
        if barrier.arrived >= self.num_clients:
            self._release(name, barrier)
            return generation
        event = barrier.released
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            if not event.is_set():
                arrived = barrier.arrived
                barrier.arrived -= 1  # withdraw, so the next attempt counts correctly
                raise BarrierTimeoutError(
                    f"barrier {name!r} timed out after {timeout:g} s: "
                    f"{arrived} of {self.num_clients} clients arrived"
                ) from None
        return generation

    def _release(self, name: str, barrier: _Barrier) -> None:
        barrier.released.set()
        self._barriers[name] = _Barrier(generation=barrier.generation + 1)


class RequestHandlers:
    """All ops this server answers, by name."""

    def __init__(
        self,
        store: PartitionStore,
        *,
        num_clients: int,
        shm_address: str | None = None,
        shm_token: bytes | None = None,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.barriers = Barriers(num_clients)
        self.shm_address = shm_address
        self.shm_token = shm_token
        self.on_shutdown = on_shutdown
        self.started = time.time()
        self.requests_served = 0
        self.ops: dict[str, Callable[[Mapping[str, Any]], Any]] = {
            "info": self.info,
            "pull": self.pull,
            "push": self.push,
            "create_tensor": self.create_tensor,
            "delete_tensor": self.delete_tensor,
            "list_tensors": self.list_tensors,
            "barrier": self.barrier,
            "sample": self.sample,
            "find_edges": self.find_edges,
            "stats": self.stats,
            "ping": self.ping,
            "shutdown": self.shutdown,
            "sparse_update": self.sparse_update,
        }

    def lookup(self, op: str) -> Callable[[Mapping[str, Any]], Any]:
        handler = self.ops.get(op)
        if handler is None:
            raise UnknownOpError(f"unknown op {op!r}; this server knows {sorted(self.ops)}")
        return handler

    # --- metadata -----------------------------------------------------------------------
    def info(self, args: Mapping[str, Any]) -> dict[str, Any]:
        store = self.store
        return {
            "protocol_version": PROTOCOL_VERSION,
            "graph_name": store.graph_name,
            "part_id": store.part_id,
            "num_parts": store.book.num_partitions(),
            "num_nodes": store.book.num_nodes,
            "num_edges": store.book.num_edges,
            "book": store.book.to_dict(),
            "tensors": [meta.to_dict() for meta in store.list_tensors()],
            "num_clients": self.barriers.num_clients,
            "pid": os.getpid(),
            "boot_id": boot_id(),
            "shm": (
                {"address": self.shm_address, "token": self.shm_token}
                if self.shm_address is not None and self.shm_token is not None
                else None
            ),
        }

    def list_tensors(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [meta.to_dict() for meta in self.store.list_tensors()]

    def ping(self, args: Mapping[str, Any]) -> float:
        return time.time()

    def stats(self, args: Mapping[str, Any]) -> dict[str, Any]:
        import psutil

        proc = psutil.Process()
        cpu = proc.cpu_times()
        return {
            "rss": proc.memory_info().rss,
            "cpu_user": cpu.user,
            "cpu_system": cpu.system,
            "uptime": time.time() - self.started,
            "requests_served": self.requests_served,
        }

    # --- tensors ------------------------------------------------------------------------
    def pull(self, args: Mapping[str, Any]) -> np.ndarray:
        name = _get(args, "pull", "name", str)
        ids = _ids(args, "pull")
        return np.asarray(self.store.pull(name, ids))

    def push(self, args: Mapping[str, Any]) -> None:
        name = _get(args, "push", "name", str)
        ids = _ids(args, "push")
        values = _get(args, "push", "values", np.ndarray)
        op = _get(args, "push", "op", str) if "op" in args else "assign"
        self.store.push(name, ids, values, op)
        return None

    def create_tensor(self, args: Mapping[str, Any]) -> dict[str, Any]:
        name = _get(args, "create_tensor", "name", str)
        policy = _get(args, "create_tensor", "policy", str)
        shape = _get(args, "create_tensor", "shape", list)
        dtype = _get(args, "create_tensor", "dtype", str)
        init = args.get("init")
        if init is not None and not isinstance(init, dict):
            raise InvalidRequestError("create_tensor: argument 'init' must be a map or nil")
        if policy not in ("node", "edge"):
            raise InvalidRequestError(f"create_tensor: policy must be 'node' or 'edge', got {policy!r}")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise InvalidRequestError(f"create_tensor: shape must be a list of ints, got {shape!r}")
        meta = self.store.create_tensor(name, policy, shape, dtype, init)
        return meta.to_dict()

    def delete_tensor(self, args: Mapping[str, Any]) -> None:
        self.store.delete_tensor(_get(args, "delete_tensor", "name", str))
        return None

    # --- coordination -------------------------------------------------------------------
    def barrier(self, args: Mapping[str, Any]) -> Awaitable[int]:
        name = _get(args, "barrier", "name", str)
        timeout = float(_get(args, "barrier", "timeout", (int, float)))
        if not timeout > 0:
            raise InvalidRequestError(f"barrier: timeout must be positive, got {timeout}")
        return self.barriers.wait(name, timeout)

    def shutdown(self, args: Mapping[str, Any]) -> None:
        if self.on_shutdown is not None:
            asyncio.get_running_loop().call_soon(self.on_shutdown)
        return None

    # --- sampling -----------------------------------------------------------------------
    def sample(self, args: Mapping[str, Any]) -> dict[str, np.ndarray]:
        seeds = _ids(args, "sample", "seeds")
        fanout = _get(args, "sample", "fanout", int)
        replace = bool(_get(args, "sample", "replace", bool)) if "replace" in args else False
        seed = args.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise InvalidRequestError("sample: seed must be an int or nil")
        return sample_partition(self.store, seeds, fanout, replace, seed)

    def find_edges(self, args: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Global ``src``/``dst`` of edge IDs this partition owns (OutOfRangeError otherwise)."""
        eids = _ids(args, "find_edges", "eids")
        src, dst = find_edges_partition(self.store, eids)
        return {"src": src, "dst": dst}

    # --- sparse optimizers --------------------------------------------------------------
    def sparse_update(self, args: Mapping[str, Any]) -> None:
        """One Adagrad/Adam step on owned rows, applied here under the store's write lock."""
        name = _get(args, "sparse_update", "name", str)
        ids = _ids(args, "sparse_update")
        grads = _get(args, "sparse_update", "grads", np.ndarray)
        spec = _get(args, "sparse_update", "spec", dict)
        apply_sparse_update(self.store, name, ids, grads, spec)
        return None
