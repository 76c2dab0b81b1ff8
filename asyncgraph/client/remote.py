"""``Partition`` over a connection to the partition's server: each method is one request,
except large pulls and pushes, which go as several pipelined requests.

A pull from another host whose rows take more than twice ``PULL_CHUNK_BYTES`` is split into
row chunks of that size, all requested at once on the same connection: the server gathers chunk
k+1 while chunk k is on the wire, and each chunk is copied into the caller's output as it
arrives, so the wire is not idle while a 100 MB reply is gathered and then assembled (issue 24;
``benchmarks/README.md`` §14). Over loopback (``Connection.same_host``) a pull is not chunked:
there the CPU is the limit, and chunks would cost one more copy of the rows.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncgraph.net.connection import Connection
from asyncgraph.protocol.framing import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.protocol.info import ServerInfo
from asyncgraph.protocol.ops import (
    AddEdgesArgs,
    AddNodesArgs,
    CompactArgs,
    CreateTensorArgs,
    DegreesArgs,
    DeleteTensorArgs,
    FindEdgesArgs,
    Op,
    PullArgs,
    PushArgs,
    ReleaseTensorsArgs,
    RemoveEdgesArgs,
    SampleArgs,
    SampleEdgesArgs,
    SparseUpdateArgs,
)
from asyncgraph.service.base import SampledRows
from asyncgraph.service.limits import REPLY_OVERHEAD
from asyncgraph.storage.store import TensorMeta

PULL_CHUNK_BYTES = 4 << 20
"""Bytes of rows per request of a large pull from another host (chosen by measurement:
``benchmarks/link_bench.py --chunk-mb 0 1 4 16``, ``benchmarks/README.md`` §14a)."""


def row_chunks(num_rows: int, row_bytes: int, budget: int) -> list[slice]:
    """Slices of ``range(num_rows)`` whose rows take at most ``budget`` bytes (one row at least)."""
    per = max(1, budget // max(row_bytes, 1))
    return [slice(i, min(i + per, num_rows)) for i in range(0, num_rows, per)]


async def _all(calls: Iterable[Awaitable[None]]) -> None:
    """Await ``calls`` concurrently; on the first failure cancel the others (a failed pull
    leaves no chunk writing into the caller's output later) and raise it."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class RemotePartition:
    """One partition served over ``conn``; every call waits at most ``timeout`` seconds.

    ``max_frame_size`` is the smaller of both sides' frame limits: a pull whose rows, or a push
    whose IDs and values, exceed it (less ``REPLY_OVERHEAD`` for the envelope) is sent as several
    requests, all written before the first reply is awaited.
    """

    store = None
    chunk_bytes: int = PULL_CHUNK_BYTES  # a pull above twice this goes as chunks of this size
    # Only across hosts: over loopback the CPU, not the wire, is the limit, and a chunked pull
    # costs one more copy of its rows (a one-request reply is returned as received).
    chunk_on_same_host: bool = False

    def __init__(
        self, part_id: int, conn: Connection, timeout: float, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    ) -> None:
        self.part_id = part_id
        self.conn = conn
        self.timeout = timeout
        self.budget = max(1, max_frame_size - REPLY_OVERHEAD)
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

    async def pull(
        self,
        name: str,
        ids: np.ndarray,
        row_bytes: int = 0,
        *,
        out: np.ndarray | None = None,
        where: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows ``ids``; with ``out``, written to ``out[where]`` (``where`` None: ``out[:n]``) and
        ``out`` returned. Over ``2 * chunk_bytes`` (when ``row_bytes`` is known) a pull from
        another host goes as pipelined chunks, each copied to its place as it arrives."""
        n = int(ids.shape[0]) if ids.ndim else 0
        per_row = max(row_bytes, ids.itemsize)
        chunk = min(self.chunk_bytes, self.budget)
        if row_bytes > 0 and n * per_row > 2 * chunk and (self.chunk_on_same_host or not self.conn.same_host):
            return await self._chunked(name, ids, row_chunks(n, per_row, chunk), out, where)
        if n * per_row > self.budget:  # over one frame
            return await self._chunked(name, ids, row_chunks(n, per_row, self.budget), out, where)
        rows = await self._pull(name, ids)
        if out is None:
            return rows
        out[slice(0, n) if where is None else where] = rows
        return out

    async def _chunked(
        self,
        name: str,
        ids: np.ndarray,
        chunks: list[slice],
        out: np.ndarray | None,
        where: np.ndarray | None,
    ) -> np.ndarray:
        """Every chunk requested at once; each reply copied to its place as it arrives
        (``out[where[s]]``, or ``out[s]``; ``out`` made from the first reply when not given)."""
        made: list[np.ndarray] = [] if out is None else [out]

        async def one(s: slice) -> None:
            rows = await self._pull(name, ids[s])
            if not made:  # the first reply: its dtype and row shape are the tensor's
                made.append(np.empty((int(ids.shape[0]), *rows.shape[1:]), dtype=rows.dtype))
            made[0][s if where is None else where[s]] = rows

        await _all(one(s) for s in chunks)
        return made[0] if made else await self._pull(name, ids)

    async def _pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        rows = await self.conn.call(Op.PULL, PullArgs(name, ids).encode(), self.timeout)
        return np.asarray(rows)

    async def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str) -> None:
        n = int(ids.shape[0]) if ids.ndim else 0
        if n < 2 or ids.nbytes + values.nbytes <= self.budget:
            args = PushArgs(name, ids, values, op).encode()
            args["rid"] = self._rid()
            await self.conn.call(Op.PUSH, args, self.timeout)
            return
        per_row = (ids.nbytes + values.nbytes) // n
        chunks = []
        for s in row_chunks(n, per_row, self.budget):
            args = PushArgs(name, ids[s], values[s], op).encode()
            args["rid"] = self._rid()  # each chunk is its own write, applied once
            chunks.append(self.conn.call(Op.PUSH, args, self.timeout))
        await asyncio.gather(*chunks)

    async def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        args = SampleArgs(seeds, fanout, replace, seed).encode()
        out = await self.conn.call(Op.SAMPLE, args, self.timeout)
        return np.asarray(out["src"]), np.asarray(out["dst"]), np.asarray(out["eids"])

    async def sample_with_features(
        self,
        seeds: np.ndarray,
        fanout: int,
        replace: bool,
        seed: int | None,
        features: Sequence[str],
        extra: np.ndarray | None = None,
    ) -> SampledRows:
        args = SampleArgs(seeds, fanout, replace, seed, tuple(features), extra).encode()
        out = await self.conn.call(Op.SAMPLE, args, self.timeout)
        rows = [np.asarray(r) for r in out["rows"]]
        src, dst, eids, ids = (np.asarray(out[k]) for k in ("src", "dst", "eids", "ids"))
        return SampledRows(src, dst, eids, ids, rows)

    async def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = await self.conn.call(Op.FIND_EDGES, FindEdgesArgs(eids).encode(), self.timeout)
        return np.asarray(out["src"]), np.asarray(out["dst"])

    async def add_edges(
        self, src: np.ndarray, dst: np.ndarray, data: Mapping[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """One write per frame-sized chunk, each with its own request id (applied once)."""
        n = int(src.size)
        rows = dict(data or {})
        per_edge = 16 + sum(v.nbytes // max(n, 1) for v in rows.values())
        calls = []
        for s in row_chunks(n, per_edge, self.budget) if n else [slice(0, 0)]:
            args = AddEdgesArgs(src[s], dst[s], data={k: v[s] for k, v in rows.items()}).encode()
            args["rid"] = self._rid()
            calls.append(self.conn.call(Op.ADD_EDGES, args, self.timeout))
        out = await asyncio.gather(*calls)
        return np.concatenate([np.asarray(o, dtype=np.int64) for o in out])

    async def add_nodes(self, num: int, data: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        args = AddNodesArgs(num, data=dict(data or {})).encode()
        args["rid"] = self._rid()
        return np.asarray(await self.conn.call(Op.ADD_NODES, args, self.timeout), dtype=np.int64)

    async def compact(self) -> dict[str, float]:
        """Fold the server's live overlay into a new CSC (a logged write; reads go on)."""
        args = CompactArgs().encode()
        args["rid"] = self._rid()
        out = await self.conn.call(Op.COMPACT, args, max(self.timeout, 600.0))
        return dict(out) if out else {}

    async def remove_edges(self, eids: np.ndarray) -> None:
        n = int(eids.size)
        calls = []
        for s in row_chunks(n, 8, self.budget) if n else [slice(0, 0)]:
            args = RemoveEdgesArgs(eids[s]).encode()
            args["rid"] = self._rid()
            calls.append(self.conn.call(Op.REMOVE_EDGES, args, self.timeout))
        await asyncio.gather(*calls)

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
        args["rid"] = self._rid()  # a resent create takes no second reference
        out = await self.conn.call(Op.CREATE_TENSOR, args, self.timeout)
        return TensorMeta.from_dict(out), bool(out.get("created", False))

    async def delete_tensor(self, name: str) -> None:
        args = DeleteTensorArgs(name).encode()
        args["rid"] = self._rid()
        await self.conn.call(Op.DELETE_TENSOR, args, self.timeout)

    async def release_tensors(self, holder: str, names: list[str], every: bool = False) -> list[str]:
        args = ReleaseTensorsArgs(holder, names, every).encode()
        args["rid"] = self._rid()
        deleted: list[str] = await self.conn.call(Op.RELEASE_TENSORS, args, self.timeout)
        return deleted

    async def list_tensors(self) -> list[TensorMeta]:
        metas = await self.conn.call(Op.LIST_TENSORS, {}, self.timeout)
        return [TensorMeta.from_dict(m) for m in metas]

    async def info(self) -> ServerInfo:
        return ServerInfo.from_wire(await self.conn.call(Op.INFO, {}, self.timeout))

    def close(self) -> None:
        self.conn.close()
