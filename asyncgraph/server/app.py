"""The graph server: map one partition's files (memory of its own for what is written) and serve
it over TCP and to co-located processes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from asyncgraph.errors import AsyncGraphError
from asyncgraph.kernels import compiled, overlay_index
from asyncgraph.launch.processes import process_alive
from asyncgraph.partition import load_partition
from asyncgraph.partition.fingerprint import verify_partition
from asyncgraph.server.admission import Admission
from asyncgraph.server.budget import (
    ConnectionCap,
    ReplyBudget,
    default_max_tensors,
    memory_budget,
    raise_fd_limit,
)
from asyncgraph.server.durable import DurableState
from asyncgraph.server.handlers import RequestHandlers
from asyncgraph.server.leases import HolderLeases
from asyncgraph.server.options import ServerOptions
from asyncgraph.server.replica_check import ReplicaCheck, fingerprint_of
from asyncgraph.server.transport import ServerConnection
from asyncgraph.service.limits import WorkLimits
from asyncgraph.storage.fdpass import FdExporter
from asyncgraph.storage.malloc import release_free_memory, retain_large_allocations
from asyncgraph.storage.store import PartitionStore

if TYPE_CHECKING:
    from asyncgraph.net.connection import Connection
    from asyncgraph.server.metrics import ServerMetrics

log = logging.getLogger("asyncgraph.server")

#: A replica waits this long for its primary to accept a connection (it may start at once).
REPLICA_CONNECT_TIMEOUT = 60.0
REPLICA_CALL_TIMEOUT = 10.0
#: How often a replica checks that its primary still answers.
REPLICA_WATCH_INTERVAL = 1.0
#: Freed heap memory goes back to the OS after this many seconds without a request (issue 22).
IDLE_TRIM_INTERVAL = 2.0


class ReplicaError(AsyncGraphError):
    """A replica server cannot serve its primary's partition (start-up error, status 1)."""


class GraphServer:
    """One partition's server: store, fd exporter for co-located clients, TCP listener."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.store: PartitionStore | None = None
        self.exporter: FdExporter | None = None
        self.handlers: RequestHandlers | None = None
        self.durable: DurableState | None = None
        self._syncer: asyncio.Task[None] | None = None
        self._trimmer: asyncio.Task[None] | None = None
        self._snapshotter: asyncio.Task[None] | None = None
        self._server: asyncio.base_events.Server | None = None
        self._stopped = asyncio.Event()
        self.address: tuple[str, int] | None = None
        self.metrics: ServerMetrics | None = None
        self.connections: set[ServerConnection] = set()
        self.primary: Connection | None = None  # a replica's connection to its primary
        self._watcher: asyncio.Task[None] | None = None
        #: Why the server stopped on its own (its primary went away): exit status 1.
        self.failure: str | None = None

    async def start(self) -> tuple[str, int]:
        opts = self.options
        t0 = time.perf_counter()
        # Request bodies and gathered replies are large and short-lived: recycle their memory
        # instead of page-faulting fresh mmaps for every request.
        retain_large_allocations()
        if opts.replica_of is not None:
            return await self._start_replica(opts.replica_of, t0)
        part = load_partition(opts.part_config, opts.part_id)  # headers only: files memory-mapped
        if opts.verify:  # rehash every structure byte (not by default: issue 34)
            await asyncio.to_thread(verify_partition, opts.part_config, opts.part_id)
        self.store = PartitionStore.from_partition(
            part, shared=opts.shared_memory, copy=opts.copy_partition_data
        )
        del part
        fd_limit = raise_fd_limit()  # issue 22: tensors hold descriptors; cap them (server/budget.py)
        self.store.rules.max_tensors = opts.max_tensors or default_max_tensors(fd_limit)
        self.store.rules.memory_budget = opts.memory_budget or memory_budget()
        graph_name = self.store.graph_name
        shm_address: str | None = None
        shm_token: bytes | None = None
        if opts.shared_memory:
            self.exporter = FdExporter(self.store, label=f"{graph_name}.p{opts.part_id}")
            await self.exporter.start()
            shm_address, shm_token = self.exporter.address, self.exporter.token
        fingerprint = fingerprint_of(opts.part_config, opts.part_id)  # hashed once, when first needed
        if opts.state_dir is not None:
            self.durable = DurableState(
                opts.state_dir,
                opts.part_id,
                wal=opts.wal,
                fsync=opts.wal_fsync,
                fsync_interval=opts.wal_fsync_interval,
                recover=opts.wal_recover,
                fingerprint=fingerprint(),
                part_config=str(opts.part_config),
            )
        if opts.metrics_port is not None:
            self._make_metrics()
        metrics = self.metrics
        self.handlers = RequestHandlers(
            self.store,
            num_clients=opts.num_clients,
            shm_address=shm_address,
            shm_token=shm_token,
            on_shutdown=self.stop,
            limits=self._limits(),
            max_frame_size=opts.max_frame_size,
            metrics=metrics,
            durable=self.durable,
        )
        handlers = self.handlers
        if opts.holder_lease > 0:
            handlers.leases = HolderLeases(opts.holder_lease, handlers.release_holder)
        handlers.replica_check = ReplicaCheck(  # issues 22, 32: only proven replicas register
            part_id=opts.part_id, instance=handlers.instance, fingerprint=fingerprint, secret=opts.secret,
            store=self.store, tls=opts.tls,
        )  # fmt: skip
        if self.durable is not None:
            partition = handlers.partition
            base, replayed = self.durable.restore(self.store, handlers.replay, partition.load_references)
            log.info(
                "state %s: restored snapshot epoch %d, replayed %d logged writes (WAL %s)",
                self.durable.dir.path,
                base,
                replayed,
                f"on, fsync {opts.wal_fsync}" if opts.wal else "off",
            )
            if handlers.partition.shm is not None and opts.wal:
                # Writes through shared memory would bypass the log: co-located clients must
                # send them to the server (reads still go through shared memory).
                handlers.partition.shm = dataclasses.replace(handlers.partition.shm, writes_via_server=True)
            if opts.snapshot_interval > 0:
                self._snapshotter = asyncio.ensure_future(self._snapshot_periodically(opts.snapshot_interval))
            if opts.wal and opts.wal_fsync == "interval":
                self._syncer = asyncio.ensure_future(self._sync_periodically(opts.wal_fsync_interval))
        # issue 22: the partition's own tensors are read-only (after the replay: older logs may
        # hold writes to them) unless --writable-partition-data
        self.store.protect(writable_base=opts.writable_partition_data)
        handlers.compactor.fraction = opts.compact_fraction  # after the replay, which folds where logged
        await self._listen(handlers, graph_name)
        assert self.address is not None
        log.info(
            "serving graph %r partition %d on %s:%d (loaded in %.2f s, %d clients expected)",
            graph_name,
            opts.part_id,
            self.address[0],
            self.address[1],
            time.perf_counter() - t0,
            opts.num_clients,
        )
        return await self._announce()

    def _make_metrics(self) -> None:
        from asyncgraph.server.metrics import ServerMetrics

        self.metrics = ServerMetrics(part_id=self.options.part_id, store=lambda: self.store)
        live = self.connections
        self.metrics.watch(
            inflight=lambda: sum(c.inflight for c in list(live)),
            paused=lambda: sum(c.read_paused for c in list(live)),
        )

    def _limits(self) -> WorkLimits:
        opts = self.options
        return WorkLimits.for_frame_size(
            opts.max_frame_size,
            max_sampled_edges=opts.max_sampled_edges,
            max_tensor_bytes=opts.max_tensor_bytes,
        )

    async def _listen(self, handlers: RequestHandlers, graph_name: str) -> None:
        opts = self.options
        metrics, connections = self.metrics, self.connections
        admission = Admission(
            handshake_timeout=opts.handshake_timeout, max_pending=opts.max_pending_connections
        )
        cap = ConnectionCap(opts.max_connections, opts.max_connections_per_holder)
        replies = ReplyBudget(opts.max_queued_reply_bytes)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(
                handlers,
                graph_name=graph_name, part_id=opts.part_id,
                secret=opts.secret,
                require_holder_keys=opts.require_holder_keys,
                role="primary" if opts.replica_of is None else "replica",
                max_frame_size=opts.max_frame_size,
                max_inflight=opts.max_inflight,
                metrics=metrics,
                live=connections,
                admission=admission,
                cap=cap,
                replies=replies,
            ),
            host=opts.host,
            port=opts.port,
            reuse_address=True,
            ssl=opts.tls.server_context() if opts.tls is not None else None,
        )
        sockname = self._server.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))

    async def _announce(self) -> tuple[str, int]:
        """Start metrics, write the ready file, warm the sampler: the server is ready."""
        opts, metrics = self.options, self.metrics
        assert self.address is not None
        metrics_port = None
        if metrics is not None and opts.metrics_port is not None:
            metrics_host = opts.metrics_host if opts.metrics_host is not None else opts.host
            metrics_port = await metrics.start_http(metrics_host, opts.metrics_port, opts.metrics_token)
            log.info("metrics on http://%s:%d/metrics", metrics_host, metrics_port)
        if opts.ready_file is not None:
            write_ready_file(
                opts.ready_file, self.address[0], self.address[1], opts.part_id, metrics_port=metrics_port
            )
        compiled.warm_up()  # the compiled sampling kernel loads in the background (~1.5 s)
        overlay_index.INDEX.warm_up()  # and the live graph's index update (applied under the lock)
        self._trimmer = asyncio.ensure_future(self._trim_when_idle())
        return self.address

    async def _start_replica(self, primary: tuple[str, int], t0: float) -> tuple[str, int]:
        """Map the primary's memory, serve the ops a replica may, announce this server to it."""
        from asyncgraph.net.dial import open_retrying
        from asyncgraph.protocol.info import ServerInfo
        from asyncgraph.protocol.ops import AddReplicaArgs, Op
        from asyncgraph.server.replica import ReplicaHandlers
        from asyncgraph.service.local import boot_id
        from asyncgraph.storage.fdpass import attach_store, fetch_catalog

        opts = self.options
        where = f"{primary[0]}:{primary[1]}"
        self.primary = await open_retrying(
            opts.part_id,
            primary[0],
            primary[1],
            time.monotonic() + REPLICA_CONNECT_TIMEOUT,
            graph_name=None,
            secret=opts.secret,
            max_frame_size=opts.max_frame_size,
            max_inflight=opts.max_inflight,
            tls=opts.tls,
        )
        info = ServerInfo.from_wire(await self.primary.call(Op.INFO, {}, REPLICA_CALL_TIMEOUT))
        if info.part_id != opts.part_id:
            raise ReplicaError(f"primary {where} serves partition {info.part_id}, not {opts.part_id}")
        if info.role != "primary":
            raise ReplicaError(f"{where} is itself a replica (of {info.primary}); name the primary")
        if info.shm is None or info.boot_id != boot_id():
            raise ReplicaError(
                f"primary {where} shares no memory with this host (a replica must run on its primary's "
                "host, and the primary with shared memory)"
            )
        address, token = info.shm.address, info.shm.token
        self.store = await asyncio.to_thread(attach_store, address, token, timeout=REPLICA_CALL_TIMEOUT)
        if opts.metrics_port is not None:
            self._make_metrics()
        self.handlers = ReplicaHandlers(
            self.store,
            primary=where,
            primary_info=info,
            fetch_catalog=lambda: fetch_catalog(address, token, REPLICA_CALL_TIMEOUT),
            on_shutdown=self.stop,
            limits=self._limits(),
            max_frame_size=opts.max_frame_size,
            metrics=self.metrics,
        )
        primary_pid = info.pid
        primary_conn = self.primary
        # issue 22 item 7: a push is acknowledged only while the primary lives
        self.handlers.primary_alive = lambda: not primary_conn.closed and process_alive(primary_pid)
        await self._listen(self.handlers, self.store.graph_name)
        assert self.address is not None
        fingerprint = await asyncio.to_thread(fingerprint_of(opts.part_config, opts.part_id))
        args = AddReplicaArgs(self.address[1], os.getpid(), fingerprint).encode()
        await self.primary.call(Op.ADD_REPLICA, args, REPLICA_CALL_TIMEOUT)
        self._watcher = asyncio.ensure_future(self._watch_primary(where))
        log.info(
            "replica of %s serving graph %r partition %d on %s:%d (attached in %.2f s)",
            where,
            self.store.graph_name,
            opts.part_id,
            self.address[0],
            self.address[1],
            time.perf_counter() - t0,
        )
        return await self._announce()

    async def _watch_primary(self, where: str) -> None:
        """Stop (status 1) once the primary stops answering: its memory is no longer served."""
        from asyncgraph.protocol.ops import Op

        conn = self.primary
        misses = 0
        while conn is not None and not self._stopped.is_set():
            await asyncio.sleep(REPLICA_WATCH_INTERVAL)
            try:
                await conn.call(Op.PING, {}, REPLICA_CALL_TIMEOUT)
                misses = 0
            except AsyncGraphError as exc:
                misses += 1
                if conn.closed or misses >= 3:
                    self.failure = f"primary {where} went away ({exc}); a replica cannot serve without it"
                    log.error("%s", self.failure)
                    self.stop()
                    return

    def stop(self) -> None:
        self._stopped.set()

    async def _snapshot_periodically(self, interval: float) -> None:
        """``--snapshot-interval``: this server alone snapshots as its next epoch when written to.

        Bounds the log's length and restart time; epochs taken this way are per server, so a
        job-wide consistent point still comes from ``snapshot()`` (every server, one epoch).
        """
        served = -1
        while self.durable is not None and self.store is not None and self.handlers is not None:
            await asyncio.sleep(interval)
            writes = self.handlers.writes
            if self.durable is None or self.store is None or writes == served:
                continue
            try:
                path = await self.durable.snapshot_async(self.store, self.durable.epoch + 1)
            except (OSError, AsyncGraphError) as exc:
                log.error("periodic snapshot failed (the log still holds every write): %s", exc)
                continue
            served = writes
            log.info("periodic snapshot %s", path)

    async def _trim_when_idle(self, interval: float = IDLE_TRIM_INTERVAL) -> None:
        """Return freed heap memory to the OS once no request came for ``interval`` seconds."""
        served, trimmed = -1, True
        while self.handlers is not None:
            await asyncio.sleep(interval)
            now = self.handlers.requests_served if self.handlers is not None else 0
            if now != served:
                served, trimmed = now, False
            elif not trimmed:
                release_free_memory()
                trimmed = True

    async def _sync_periodically(self, interval: float) -> None:
        """``--wal-fsync interval``: fsync the log at least every ``interval`` seconds."""
        while self.durable is not None:
            await asyncio.sleep(interval)
            if self.durable is not None:
                self.durable.sync()

    async def serve_until_stopped(self) -> None:
        await self._stopped.wait()
        await self.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if self.primary is not None:
            self.primary.close()
            self.primary = None
        if self.metrics is not None:
            self.metrics.stop_http()
        for task in (self._syncer, self._snapshotter, self._trimmer):
            if task is not None:
                task.cancel()
        self._syncer = self._snapshotter = self._trimmer = None
        if self.durable is not None:
            self.durable.close()
            self.durable = None
        if self.exporter is not None:
            await self.exporter.close()
            self.exporter = None
        if self.store is not None:
            self.store.close()
            self.store = None
        log.info("server stopped")


def write_ready_file(
    path: Path, host: str, port: int, part_id: int, *, metrics_port: int | None = None
) -> None:
    """Atomically publish the bound address (and metrics port), for launchers and tests."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    info: dict[str, object] = {"host": host, "port": port, "part_id": part_id, "pid": os.getpid()}
    if metrics_port is not None:
        info["metrics_port"] = metrics_port
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)


async def serve(options: ServerOptions) -> None:
    """Run a server until SIGTERM, SIGINT or a ``shutdown`` request."""
    server = GraphServer(options)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop)
    await server.start()
    await server.serve_until_stopped()
    if server.failure is not None:
        raise ReplicaError(server.failure)
