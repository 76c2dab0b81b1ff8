"""The async client: one view over all partitions, whether served remotely or held locally.

Every partition is a ``Partition``: a ``RemotePartition`` over a connection, or a
``LocalPartition`` over an in-process store (a co-located server's memory, or, standalone, the
partition itself). A call that spans partitions is validated, split by owner through the
partition book and handed to ``scatter``, which reassembles it in the caller's order. Standalone
is simply "every partition is local", so standalone results equal served results.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array, check_rows
from asyncgraph.env import ENV_MALLOC_TUNING, ENV_RECONNECT_WINDOW
from asyncgraph.errors import (
    AsyncGraphError,
    DTypeMismatchError,
    InvalidRequestError,
)
from asyncgraph.kernels.sparse_optim import check_finite_grads, validate_spec
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.protocol.ops import BarrierArgs, Op, ReleaseTensorsArgs, SnapshotArgs
from asyncgraph.service import LocalPartition, Partition, PartitionService
from asyncgraph.storage.malloc import retain_large_allocations
from asyncgraph.storage.store import PartitionStore, TensorMeta

from .cache import FeatureCache
from .connection import Connection
from .partitions import open_partitions
from .reads import TensorReads
from .scatter import broadcast, scatter, take
from .structure import StructureQueries

log = logging.getLogger("asyncgraph.client")

DEFAULT_CALL_TIMEOUT = 60.0


class AsyncClient(StructureQueries, TensorReads):
    """Typed async access to a partitioned graph's tensors, structure and barriers.

    Tensor metadata and life cycle come from ``TensorCatalog``, sampling and structure queries
    from ``StructureQueries``, pulls and feature caches from ``TensorReads``; this class adds
    connecting, writes, optimizer steps and coordination.
    """

    def __init__(
        self,
        graph_name: str,
        book: RangePartitionBook,
        partitions: Sequence[Partition],
        *,
        connections: Sequence[Connection] = (),
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        num_clients: int = 1,
    ) -> None:
        self.graph_name = graph_name
        self.book = book
        self.partitions = list(partitions)
        self.connections = list(connections)
        self.call_timeout = call_timeout
        self.num_clients = num_clients
        self._metas: dict[str, TensorMeta] = {}
        self._caches: dict[str, FeatureCache] = {}
        #: Who holds this client's references to non-persistent tensors on the servers.
        self.holder = uuid.uuid4().hex
        self._rebinds: set[asyncio.Task[Any]] = set()
        for conn in self.connections:  # issue 22: keep the server's lease on our references
            conn.on_reconnect.append(functools.partial(self._rebind, conn))

    def _rebind(self, conn: Connection) -> None:
        """After a reconnect, present this client's holder on the new connection (an empty
        ``release_tensors`` drops nothing) so a server's ``--holder-lease`` keeps its references."""
        if not self.holding:
            return
        args = ReleaseTensorsArgs(self.holder, [], False).encode()
        task = asyncio.ensure_future(conn.call(Op.RELEASE_TENSORS, args, self.call_timeout))
        self._rebinds.add(task)
        task.add_done_callback(self._rebound)

    def _rebound(self, task: asyncio.Task[Any]) -> None:
        self._rebinds.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("binding holder after a reconnect failed: %s", task.exception())

    # --- construction -----------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        servers: Sequence[tuple[str, int]],
        *,
        graph_name: str | None = None,
        secret: bytes | None = None,
        connect_timeout: float = 30.0,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        use_shared_memory: bool = True,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_inflight: int = 32,
        local_partitions: Sequence[int] | None = None,
        reconnect_window: float | None = None,
        use_replicas: bool = True,
    ) -> AsyncClient:
        """Connect to every server (one per partition, in partition order) concurrently.

        A partition served by several processes (replicas of its server, ``--replica-of``) is
        found through its server: with ``use_replicas`` reads and pushes of partitions not
        mapped through shared memory take turns over all of them.

        With ``use_shared_memory`` (the default), partitions whose server runs on this host are
        read and written through shared memory instead of the socket. ``local_partitions``
        restricts that to the listed partition IDs (e.g. a trainer's own partition, as DGL
        does); ``None`` attaches every co-located partition, ``[]`` none. Partition IDs outside
        ``[0, num_partitions)`` raise ``InvalidRequestError``.

        ``reconnect_window`` (default ``$ASYNCGRAPH_RECONNECT_WINDOW``, else 0): for that many
        seconds a lost server is reconnected (jittered backoff) and reads and writes are resent
        (writes carry request ids the server applies once); shared memory is re-attached when
        the server restarted. 0 fails calls at once with ``ServerUnavailableError``.

        Connecting also tunes glibc malloc to recycle large buffers (``retain_large_allocations``:
        big pulls otherwise pay a page fault per 4 KiB of every result); set the environment
        variable ``ASYNCGRAPH_MALLOC_TUNING=0`` to leave malloc alone.
        """
        if reconnect_window is None:
            reconnect_window = float(os.environ.get(ENV_RECONNECT_WINDOW) or 0.0)
        if os.environ.get(ENV_MALLOC_TUNING, "1") != "0":
            retain_large_allocations()
        served = await open_partitions(
            servers,
            graph_name=graph_name,
            secret=secret,
            connect_timeout=connect_timeout,
            call_timeout=call_timeout,
            use_shared_memory=use_shared_memory,
            max_frame_size=max_frame_size,
            max_inflight=max_inflight,
            local_partitions=local_partitions,
            reconnect_window=reconnect_window,
            use_replicas=use_replicas,
        )
        client = cls(
            served.graph_name,
            served.book,
            served.partitions,
            connections=served.connections,
            call_timeout=call_timeout,
            num_clients=served.num_clients,
        )
        client._remember(served.tensors)
        return client

    @classmethod
    def standalone(cls, part_config: str | Path) -> AsyncClient:
        """Every partition of ``part_config`` held in this process: no server, same API."""
        from asyncgraph.partition import PartitionConfig, load_partition

        config = PartitionConfig.load(part_config)
        services = [
            PartitionService(PartitionStore.from_partition(load_partition(part_config, p), shared=False))
            for p in range(config.num_parts)
        ]
        client = cls(config.graph_name, config.book(), [LocalPartition(s) for s in services])
        client._remember(services[0].list_tensors())
        return client

    # --- metadata ---------------------------------------------------------------------------
    @property
    def is_standalone(self) -> bool:
        """True when no server is involved: every partition is held in this process."""
        return not self.connections

    def local_partitions(self) -> list[int]:
        return [p.part_id for p in self.partitions if p.store is not None]

    async def info(self, part_id: int = 0) -> dict[str, Any]:
        """Partition ``part_id``'s description, as its server (or, standalone, its store) gives it."""
        return await self.partitions[part_id].info()

    # --- tensors (pulls: TensorReads) ----------------------------------------------------------
    async def push(self, name: str, ids: Any, values: Any, op: str = "assign") -> None:
        """Write rows: ``op="assign"`` replaces, ``"add"`` accumulates (duplicates add up).

        Everything is validated before any partition is written, so a bad push changes nothing.
        """
        if op not in ("assign", "add"):
            raise InvalidRequestError(f"push: op must be 'assign' or 'add', got {op!r}")
        self._caches.pop(name, None)
        meta = await self.tensor_meta(name)
        gids = as_id_array(ids)
        _, vals = check_rows(f"push to {name!r}", gids, values, dtype=meta.dtype, row_shape=meta.row_shape)
        parts = self.book.positions(gids, meta.policy)
        await scatter(
            self.partitions, parts, Op.PUSH, lambda p, pos: p.push(name, take(gids, pos), take(vals, pos), op)
        )

    # --- sparse optimizers --------------------------------------------------------------------
    async def sparse_update(self, name: str, ids: Any, grads: Any, spec: Mapping[str, Any]) -> None:
        """One sparse optimizer step on rows ``ids`` of float tensor ``name``, run on the owners.

        ``spec`` is ``{"kind": "adagrad", "lr": ..., "eps": ...}`` or ``{"kind": "adam", "lr": ...,
        "betas": [b1, b2], "eps": ...}`` (see ``asyncgraph.kernels.sparse_optim``); ``grads`` has the
        tensor's dtype and shape ``(len(ids), *row_shape)``; duplicate IDs' gradients are summed.
        Each owner reads, updates and writes its rows and their optimizer state under its write
        lock: one round trip per server, and concurrent trainers never lose an update. A
        co-located partition is updated through its server (an attached store cannot create the
        state tensors). Everything is validated before any partition is touched.
        """
        self._caches.pop(name, None)
        opts = validate_spec(spec)
        meta = await self.tensor_meta(name)
        if np.dtype(meta.dtype).kind != "f":
            raise DTypeMismatchError(
                f"sparse_update {name!r}: the tensor is {meta.dtype}; optimizers need a floating-point tensor"
            )
        gids = as_id_array(ids)
        what, row_shape = f"sparse_update {name!r}", meta.row_shape
        _, grad = check_rows(what, gids, grads, dtype=meta.dtype, row_shape=row_shape, values_name="grads")
        check_finite_grads(what, gids, grad)  # issue 22: refused before any partition applies it
        parts = self.book.positions(gids, meta.policy)
        await scatter(
            self.partitions,
            parts,
            Op.SPARSE_UPDATE,
            lambda p, pos: p.sparse_update(name, take(gids, pos), take(grad, pos), opts),
        )

    # --- coordination -------------------------------------------------------------------------
    async def barrier(self, name: str = "default", timeout: float = 300.0) -> None:
        """Wait until every client of the job reaches this barrier (held by server 0)."""
        if self.connections:
            args = BarrierArgs(name, float(timeout), self.holder).encode()
            await self.connections[0].call(Op.BARRIER, args, timeout + 10.0)

    async def snapshot(self) -> int:
        """Snapshot every server's state (servers need ``--state-dir``) as one new epoch.

        The epoch is one more than the newest any server has; every server writes its rows
        under that number, so a restore finds a consistent set. Call it while no client writes
        (e.g. between barriers, as ``asyncgraph.distributed.snapshot`` does). Returns the epoch.
        """
        if not self.connections:
            raise InvalidRequestError("snapshot: a standalone client has no server to snapshot")
        infos = await broadcast(self.connections, lambda c: c.call(Op.INFO, {}, self.call_timeout))
        epoch = max(int(i.get("epoch", 0)) for i in infos) + 1
        args = SnapshotArgs(epoch).encode()
        await broadcast(self.connections, lambda c: c.call(Op.SNAPSHOT, args, self.call_timeout))
        return epoch

    def retries(self) -> int:
        """Requests resent after a reconnect, over all connections."""
        return sum(c.retries for c in self.connections)

    async def server_stats(self) -> list[dict[str, Any]]:
        return await broadcast(self.connections, lambda c: c.call(Op.STATS, {}, self.call_timeout))

    async def shutdown_servers(self) -> None:
        """Ask every server to stop (after answering)."""
        calls = [c.call(Op.SHUTDOWN, {}, self.call_timeout) for c in self.connections]
        await asyncio.gather(*calls, return_exceptions=True)

    async def close(self) -> None:
        """Release this client's non-persistent tensor references (issue 22: as the sync
        ``Client.close`` does), then disconnect."""
        if self.holding:
            self.holding = False
            try:
                await asyncio.wait_for(self.release_tensors([], every=True), 10.0)
            except (AsyncGraphError, OSError, TimeoutError) as exc:  # servers already gone
                log.debug("releasing tensors at close failed: %s", exc)
        for part in self.partitions:
            part.close()
