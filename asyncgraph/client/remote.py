"""``Partition`` over a connection to the partition's server: each method is one request."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncgraph.protocol.ops import (
    CreateTensorArgs,
    DegreesArgs,
    DeleteTensorArgs,
    FindEdgesArgs,
    Op,
    PullArgs,
    PushArgs,
    ReleaseTensorsArgs,
    SampleArgs,
    SampleEdgesArgs,
    SparseUpdateArgs,
)
from asyncgraph.storage.store import TensorMeta

from .connection import Connection


class RemotePartition:
    """One partition served over ``conn``; every call waits at most ``timeout`` seconds."""

    store = None

    def __init__(self, part_id: int, conn: Connection, timeout: float) -> None:
        self.part_id = part_id
        self.conn = conn
        self.timeout = timeout
        self._rid_prefix = uuid.uuid4().hex
        self._rids = itertools.count()

    def _rid(self) -> str:
        """A fresh request id: the server applies a write with a given id at most once."""
        return f"{self._rid_prefix}:{next(self._rids)}"

    @property
    def name(self) -> str:
        return self.conn.name

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def runs_here(self, op: Op) -> bool:
        return False

    async def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        rows = await self.conn.call(Op.PULL, PullArgs(name, ids).encode(), self.timeout)
        return np.asarray(rows)

    async def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str) -> None:
        args = PushArgs(name, ids, values, op).encode()
        args["rid"] = self._rid()
        await self.conn.call(Op.PUSH, args, self.timeout)

    async def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        args = SampleArgs(seeds, fanout, replace, seed).encode()
        out = await self.conn.call(Op.SAMPLE, args, self.timeout)
        return np.asarray(out["src"]), np.asarray(out["dst"]), np.asarray(out["eids"])

    async def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = await self.conn.call(Op.FIND_EDGES, FindEdgesArgs(eids).encode(), self.timeout)
        return np.asarray(out["src"]), np.asarray(out["dst"])

    async def degrees(self, ids: np.ndarray | None, edge_dir: str) -> np.ndarray:
        out = await self.conn.call(Op.DEGREES, DegreesArgs(ids, edge_dir).encode(), self.timeout)
        return np.asarray(out)

    async def sample_edges(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        out = await self.conn.call(Op.SAMPLE_EDGES, args.encode(), self.timeout)
        return {k: np.asarray(v) for k, v in out.items()}

    async def sparse_update(
        self, name: str, ids: np.ndarray, grads: np.ndarray, spec: Mapping[str, Any]
    ) -> None:
        args = SparseUpdateArgs(name, ids, grads, dict(spec)).encode()
        args["rid"] = self._rid()
        await self.conn.call(Op.SPARSE_UPDATE, args, self.timeout)

    async def create_tensor(
        self,
        name: str,
        policy: str,
        shape: list[int],
        dtype: str,
        init: dict[str, Any] | None,
        holder: str | None = None,
    ) -> tuple[TensorMeta, bool]:
        args = CreateTensorArgs(name, policy, shape, dtype, init, holder).encode()
        out = await self.conn.call(Op.CREATE_TENSOR, args, self.timeout)
        return TensorMeta.from_dict(out), bool(out.get("created", False))

    async def delete_tensor(self, name: str) -> None:
        args = DeleteTensorArgs(name).encode()
        args["rid"] = self._rid()
        await self.conn.call(Op.DELETE_TENSOR, args, self.timeout)

    async def release_tensors(self, holder: str, names: list[str], every: bool = False) -> list[str]:
        args = ReleaseTensorsArgs(holder, names, every).encode()
        deleted: list[str] = await self.conn.call(Op.RELEASE_TENSORS, args, self.timeout)
        return deleted

    async def list_tensors(self) -> list[TensorMeta]:
        metas = await self.conn.call(Op.LIST_TENSORS, {}, self.timeout)
        return [TensorMeta.from_dict(m) for m in metas]

    async def info(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.conn.call(Op.INFO, {}, self.timeout)
        return result

    def close(self) -> None:
        self.conn.close()
