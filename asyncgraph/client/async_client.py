"""The async client: one view over all partitions, whether served remotely or held locally.

Every partition is a ``Partition``: a ``RemotePartition`` over a connection, or a
``LocalPartition`` over an in-process store (a co-located server's memory, or, standalone, the
partition itself). A call that spans partitions is validated, split by owner through the
partition book and handed to ``scatter``, which reassembles it in the caller's order. Standalone
is simply "every partition is local", so standalone results equal served results.

``AsyncClient`` is composed of small parts sharing one ``ClientState``: ``catalog``
(``TensorCatalog``: tensor metadata and life cycle), ``reads`` (``TensorReads``: pulls, feature
caches), ``writes`` (``TensorWrites``: pushes, sparse optimizer steps) and ``structure``
(``StructureQueries``: sampling, degrees, edges). Their public methods are offered here by
``forward``; connecting, coordination (barriers, snapshots) and server administration live here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncgraph.env import ENV_MALLOC_TUNING, ENV_RECONNECT_WINDOW, ENV_WRITABLE_PARTITION_DATA
from asyncgraph.errors import AsyncGraphError, InvalidRequestError
from asyncgraph.net.connection import Connection
from asyncgraph.net.tls import TlsConfig
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.protocol.ops import BarrierArgs, Op, SnapshotArgs
from asyncgraph.service import Partition, PartitionService
from asyncgraph.storage.malloc import retain_large_allocations
from asyncgraph.storage.store import PartitionStore

from .catalog import TensorCatalog
from .forward import forward
from .live import LiveUpdates
from .local import LocalPartition
from .partitions import open_partitions
from .reads import TensorReads
from .scatter import broadcast
from .state import ClientState
from .structure import StructureQueries
from .writes import TensorWrites

log = logging.getLogger("asyncgraph.client")

DEFAULT_CALL_TIMEOUT = 60.0


class AsyncClient:
    """Typed async access to a partitioned graph's tensors, structure and barriers.

    Tensor metadata and life cycle are answered by ``catalog``, pulls and feature caches by
    ``reads``, pushes and optimizer steps by ``writes``, sampling and structure queries by
    ``structure`` (all over one ``state``); this class adds connecting and coordination.
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
        holder: str | None = None,
    ) -> None:
        self.state = ClientState(
            graph_name, book, list(partitions), list(connections), call_timeout, num_clients
        )
        if holder is not None:  # the one its connections already named to the servers
            self.state.holder = holder
        self.catalog = TensorCatalog(self.state)
        self.reads = TensorReads(self.state, self.catalog)
        self.writes = TensorWrites(self.state, self.catalog)
        self.structure = StructureQueries(self.state, self.catalog)
        self.live = LiveUpdates(self.state, self.structure, self.catalog)

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
        tls: TlsConfig | None = None,
        holder: str | None = None,
        holder_key: bytes | None = None,
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

        ``tls``: TLS with this client's certificate (default ``$ASYNCGRAPH_TLS_*``, else off;
        ``asyncgraph.net.tls``), for servers started with ``--tls-*``.

        ``holder`` (default: a fresh random name) names this client to the servers. Instead of
        the cluster ``secret`` a client may be given only ``holder_key``, its holder's own key
        (``protocol.handshake.holder_key``; the launcher's trainers are): it then connects as
        that holder and no other (issue 32). A loader's worker processes connect as it does.
        """
        if holder_key is not None and (holder is None or secret is not None):
            raise InvalidRequestError("holder_key needs the holder it belongs to, and replaces the secret")
        if reconnect_window is None:
            reconnect_window = float(os.environ.get(ENV_RECONNECT_WINDOW) or 0.0)
        if os.environ.get(ENV_MALLOC_TUNING, "1") != "0":
            retain_large_allocations()
        named = holder
        if holder is None:
            holder = uuid.uuid4().hex  # named in each connection's hello (per-holder connection cap)
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
            holder=holder,
            tls=tls,
            holder_key=holder_key,
        )
        client = cls(
            served.graph_name,
            served.book,
            served.partitions,
            connections=served.connections,
            call_timeout=call_timeout,
            num_clients=served.num_clients,
            holder=holder,
        )
        client.catalog.remember(served.tensors)
        client.state.origin = {
            "kind": "servers",
            "servers": [(str(h), int(p)) for h, p in servers],
            "graph_name": graph_name,
            "secret": secret,
            "connect_timeout": connect_timeout,
            "call_timeout": call_timeout,
            "use_shared_memory": use_shared_memory,
            "max_frame_size": max_frame_size,
            "max_inflight": max_inflight,
            "local_partitions": None if local_partitions is None else [int(p) for p in local_partitions],
            "reconnect_window": reconnect_window,
            "use_replicas": use_replicas,
            "holder": named,  # a named holder (a holder key's) is its workers' too
            "holder_key": holder_key,
        }
        return client

    @classmethod
    def standalone(cls, part_config: str | Path) -> AsyncClient:
        """Every partition of ``part_config`` held in this process: no server, same API (its own
        tensors read-only, as a server's, unless ``$ASYNCGRAPH_WRITABLE_PARTITION_DATA``)."""
        from asyncgraph.partition import PartitionConfig, load_partition

        config = PartitionConfig.load(part_config)
        # in memfds, so a loader's worker processes can map them (``dataloading/workers.py``)
        services = [
            PartitionService(PartitionStore.from_partition(load_partition(part_config, p), shared=True))
            for p in range(config.num_parts)
        ]
        # the partition's own tensors are read-only, as a server keeps them (issue 33), unless
        # $ASYNCGRAPH_WRITABLE_PARTITION_DATA (the server's --writable-partition-data)
        writable = os.environ.get(ENV_WRITABLE_PARTITION_DATA, "0") not in ("", "0")
        for service in services:
            service.store.protect(writable_base=writable)
        client = cls(config.graph_name, config.book(), [LocalPartition(s) for s in services])
        client.catalog.remember(services[0].list_tensors())
        client.state.origin = {"kind": "standalone", "part_config": str(part_config)}
        return client

    @classmethod
    def attached(cls, part_config: str | Path, exports: Sequence[tuple[str, bytes]]) -> AsyncClient:
        """Standalone partitions held by another process of this host, mapped through the fd
        exporters it started (``(address, token)`` per partition): a loader worker's client."""
        from asyncgraph.partition import PartitionConfig
        from asyncgraph.storage.fdpass import attach_store

        config = PartitionConfig.load(part_config)
        services = [PartitionService(attach_store(address, token)) for address, token in exports]
        client = cls(config.graph_name, config.book(), [LocalPartition(s) for s in services])
        client.catalog.remember(services[0].list_tensors())
        return client

    # --- the shared state -------------------------------------------------------------------
    @property
    def graph_name(self) -> str:
        return self.state.graph_name

    @property
    def book(self) -> RangePartitionBook:
        return self.state.book

    @property
    def partitions(self) -> list[Partition]:
        """One ``Partition`` per partition ID, in order."""
        return self.state.partitions

    @property
    def connections(self) -> list[Connection]:
        """The connections to the servers (empty when standalone)."""
        return self.state.connections

    @property
    def call_timeout(self) -> float:
        return self.state.call_timeout

    @property
    def num_clients(self) -> int:
        """Clients the servers expect (their ``--num-clients``)."""
        return self.state.num_clients

    @property
    def holder(self) -> str:
        """Who holds this client's references to non-persistent tensors on the servers."""
        return self.state.holder

    @property
    def num_partitions(self) -> int:
        return self.state.num_partitions

    @property
    def is_standalone(self) -> bool:
        """True when no server is involved: every partition is held in this process."""
        return not self.state.connections

    def local_partitions(self) -> list[int]:
        """IDs of the partitions read in this process (standalone, or mapped shared memory)."""
        return [p.part_id for p in self.state.partitions if p.store is not None]

    async def info(self, part_id: int = 0) -> dict[str, Any]:
        """Partition ``part_id``'s description, as its server (or, standalone, its store) gives it:
        the wire map of :class:`~asyncgraph.protocol.info.ServerInfo`."""
        return (await self.state.partitions[part_id].info()).to_wire()

    # --- tensor catalog ---------------------------------------------------------------------
    tensor_names = forward("catalog", TensorCatalog.tensor_names)
    cached_meta = forward("catalog", TensorCatalog.cached_meta)
    tensor_meta = forward("catalog", TensorCatalog.tensor_meta)
    refresh_tensors = forward("catalog", TensorCatalog.refresh_tensors)
    create_tensor = forward("catalog", TensorCatalog.create_tensor)
    create_tensor_parts = forward("catalog", TensorCatalog.create_tensor_parts)
    delete_tensor = forward("catalog", TensorCatalog.delete_tensor)
    release_tensors = forward("catalog", TensorCatalog.release_tensors)

    # --- reads and writes of rows -------------------------------------------------------------
    pull = forward("reads", TensorReads.pull)
    pull_numpy = forward("reads", TensorReads.pull_numpy)
    pull_here = forward("reads", TensorReads.pull_here)
    remote_ids = forward("reads", TensorReads.remote_ids)
    build_cache = forward("reads", TensorReads.build_cache)
    feature_cache = forward("reads", TensorReads.feature_cache)
    drop_cache = forward("reads", TensorReads.drop_cache)
    push = forward("writes", TensorWrites.push)
    sparse_update = forward("writes", TensorWrites.sparse_update)

    # --- structure ----------------------------------------------------------------------------
    sample_neighbors = forward("structure", StructureQueries.sample_neighbors)
    sample_with_features = forward("structure", StructureQueries.sample_with_features)
    sample_edges = forward("structure", StructureQueries.sample_edges)
    sample_etypes = forward("structure", StructureQueries.sample_etypes)
    degrees = forward("structure", StructureQueries.degrees)
    find_edges = forward("structure", StructureQueries.find_edges)
    live_edges = forward("structure", StructureQueries.live_edges)
    added_nodes = forward("structure", StructureQueries.added_nodes)
    add_edges = forward("live", LiveUpdates.add_edges)
    remove_edges = forward("live", LiveUpdates.remove_edges)
    add_nodes = forward("live", LiveUpdates.add_nodes)

    # --- coordination -------------------------------------------------------------------------
    async def barrier(self, name: str = "default", timeout: float = 300.0) -> None:
        """Wait until every client of the job reaches this barrier (held by server 0)."""
        if self.state.connections:
            args = BarrierArgs(name, float(timeout), self.state.holder).encode()
            await self.state.connections[0].call(Op.BARRIER, args, timeout + 10.0)

    async def snapshot(self) -> int:
        """Snapshot every server's state (servers need ``--state-dir``) as one new epoch.

        The epoch is one more than the newest any server has; every server writes its rows
        under that number, so a restore finds a consistent set. Call it while no client writes
        (e.g. between barriers, as ``asyncgraph.distributed.snapshot`` does). Returns the epoch.
        """
        conns, timeout = self.state.connections, self.state.call_timeout
        if not conns:
            raise InvalidRequestError("snapshot: a standalone client has no server to snapshot")
        infos = await broadcast(conns, lambda c: c.call(Op.INFO, {}, timeout))
        epoch = max(int(i.get("epoch", 0)) for i in infos) + 1
        args = SnapshotArgs(epoch).encode()
        await broadcast(conns, lambda c: c.call(Op.SNAPSHOT, args, timeout))
        return epoch

    async def compact(self) -> list[dict[str, float]]:
        """Fold each partition's live overlay (added and removed edges) into a new CSC, on its
        owner while reads and updates go on; edge IDs do not change. Per partition, what it did
        (``folded_edges``, ``seconds``, ``bytes``, ``compactions``)."""
        return list(await asyncio.gather(*(p.compact() for p in self.state.partitions)))

    def retries(self) -> int:
        """Requests resent after a reconnect, over all connections."""
        return sum(c.retries for c in self.state.connections)

    async def server_stats(self) -> list[dict[str, Any]]:
        """Every server's ``stats`` (requests, bytes, timings), in partition order."""
        timeout = self.state.call_timeout
        return await broadcast(self.state.connections, lambda c: c.call(Op.STATS, {}, timeout))

    async def shutdown_servers(self) -> None:
        """Ask every server to stop (after answering)."""
        timeout = self.state.call_timeout
        calls = [c.call(Op.SHUTDOWN, {}, timeout) for c in self.state.connections]
        await asyncio.gather(*calls, return_exceptions=True)

    async def close(self) -> None:
        """Release this client's non-persistent tensor references (as the sync ``Client.close``
        does), then close every partition: connections closed, attached memory unmapped."""
        if self.state.holding:
            self.state.holding = False
            try:
                await asyncio.wait_for(self.catalog.release_tensors([], every=True), 10.0)
            except (AsyncGraphError, OSError, TimeoutError) as exc:  # servers already gone
                log.debug("releasing tensors at close failed: %s", exc)
        for part in self.state.partitions:
            part.close()
