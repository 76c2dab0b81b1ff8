"""A client's partitions from its servers: connect, check they serve one graph in partition
order, and map co-located partitions' memory (``LocalPartition``) instead of using the socket."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from asyncgraph.errors import (
    AsyncGraphError,
    InvalidRequestError,
    ServersMissingError,
)
from asyncgraph.net import ATTEMPT_TIMEOUT, Connection, open_retrying
from asyncgraph.net.tls import TlsConfig
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol.info import ServerInfo, SharedMemoryInfo
from asyncgraph.protocol.ops import Op
from asyncgraph.service import Partition, PartitionService, boot_id
from asyncgraph.service.limits import REPLY_OVERHEAD
from asyncgraph.storage.store import PartitionStore, TensorMeta

from .local import LocalPartition
from .remote import RemotePartition
from .replicated import ReplicatedPartition

log = logging.getLogger("asyncgraph.client")


@dataclass
class ServedGraph:
    """What connecting found: the graph, one ``Partition`` per server, and the connections."""

    graph_name: str
    book: RangePartitionBook
    partitions: list[Partition]
    connections: list[Connection]
    num_clients: int
    tensors: list[TensorMeta]


def _wanted(local_partitions: Sequence[int] | None, num_servers: int) -> frozenset[int] | None:
    if local_partitions is None:
        return None
    if isinstance(local_partitions, (str, bytes)) or not all(
        isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in local_partitions
    ):
        raise InvalidRequestError(
            f"local_partitions must be a sequence of partition IDs, got {local_partitions!r}"
        )
    wanted = frozenset(int(p) for p in local_partitions)
    bad = sorted(p for p in wanted if not 0 <= p < num_servers)
    if bad:
        raise InvalidRequestError(
            f"local_partitions {bad} out of range [0, {num_servers}) for {num_servers} servers"
        )
    return wanted


def _is_final(exc: BaseException | None) -> bool:
    """A failure retrying cannot cure (anything but a server still missing at the deadline)."""
    return exc is not None and not isinstance(exc, ServersMissingError)


async def open_partitions(
    servers: Sequence[tuple[str, int]],
    *,
    graph_name: str | None,
    secret: bytes | None,
    connect_timeout: float,
    call_timeout: float,
    use_shared_memory: bool,
    max_frame_size: int,
    max_inflight: int,
    local_partitions: Sequence[int] | None,
    reconnect_window: float = 0.0,
    use_replicas: bool = True,
    holder: str | None = None,
    tls: TlsConfig | None = None,
    holder_key: bytes | None = None,
) -> ServedGraph:
    """Connect to every server concurrently (see ``AsyncClient.connect``); all or nothing.

    Every connection names ``holder`` (the client's) in its hello, proved by ``holder_key``
    when the client was given that instead of the secret.

    Each server is retried until ``connect_timeout`` seconds have passed; then one
    ``ServersMissingError`` lists every server still missing.
    """
    if not servers:
        raise InvalidRequestError("no servers given")
    wanted = _wanted(local_partitions, len(servers))
    deadline = time.monotonic() + connect_timeout
    tasks = [
        asyncio.ensure_future(
            open_retrying(
                part_id,
                host,
                port,
                deadline,
                graph_name=graph_name,
                secret=secret,
                max_frame_size=max_frame_size,
                max_inflight=max_inflight,
                reconnect_window=reconnect_window,
                holder=holder,
                tls=tls,
                holder_key=holder_key,
            )
        )
        for part_id, (host, port) in enumerate(servers)
    ]
    try:
        # A final failure (wrong secret, another graph) ends the wait at once; servers not up
        # yet are retried until the deadline.
        pending: set[asyncio.Future[Connection]] = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            final = next(
                (t for t in tasks if t.done() and not t.cancelled() and _is_final(t.exception())), None
            )
            if final is not None:
                raise cast(BaseException, final.exception())
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is None:
                t.result().close()
        raise
    missing = [m for t in tasks if isinstance(t.exception(), ServersMissingError)
               for m in cast(ServersMissingError, t.exception()).missing]  # fmt: skip
    if missing:
        for t in tasks:
            if t.exception() is None:
                t.result().close()
        names = ", ".join(f"partition {p} at {where}" for p, where, _ in missing)
        raise ServersMissingError(
            f"{len(missing)} of {len(servers)} servers unreachable after {connect_timeout:g} s: "
            f"{names} (last error: {missing[0][2]})",
            missing,
        )
    conns = [t.result() for t in tasks]
    opened = [c for c in conns if isinstance(c, Connection)]

    async def open_replica(host: str, port: int, part_id: int) -> Connection:
        return await Connection.open(
            host,
            port,
            part_id=part_id,
            role="replica",
            graph_name=graph_name,
            secret=secret,
            timeout=ATTEMPT_TIMEOUT,
            max_frame_size=max_frame_size,
            max_inflight=max_inflight,
            holder=holder,
            tls=tls,
            holder_key=holder_key,
        )

    try:
        answers = await asyncio.gather(*(c.call(Op.INFO, {}, call_timeout) for c in opened))
        infos = [ServerInfo.from_wire(a) for a in answers]
        served = await _from_infos(opened, infos, call_timeout, use_shared_memory, ATTEMPT_TIMEOUT, wanted)
    except BaseException:
        for c in opened:
            c.close()
        raise
    if use_replicas:
        await _add_replicas(served, infos, call_timeout, open_replica)
    return served


async def _add_replicas(
    served: ServedGraph,
    infos: list[ServerInfo],
    call_timeout: float,
    open_replica: Callable[[str, int, int], Awaitable[Connection]],
) -> None:
    """Give each partition reached over the socket its replica servers (listed by its primary).

    A replica that cannot be reached, or serves another partition or primary, is skipped with
    a warning: the primary alone still serves every request.
    """

    async def one(primary: RemotePartition, port: int, instance: Any) -> RemotePartition | None:
        where = f"{primary.conn.host}:{port}"
        conn: Connection | None = None
        try:
            conn = await open_replica(primary.conn.host, port, primary.part_id)
            info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, call_timeout))
            if (
                info.role != "replica"
                or info.part_id != primary.part_id
                or info.primary_instance != instance
            ):
                raise InvalidRequestError(f"{where} is not a replica of {primary.name}")
        except (AsyncGraphError, OSError) as exc:
            if conn is not None:
                conn.close()
            log.warning("replica %s of partition %d skipped: %s", where, primary.part_id, exc)
            return None
        return RemotePartition(
            primary.part_id, conn, primary.timeout, max_frame_size=primary.budget + REPLY_OVERHEAD
        )

    jobs: list[tuple[int, Awaitable[RemotePartition | None]]] = []
    for index, (part, info) in enumerate(zip(served.partitions, infos, strict=True)):
        if isinstance(part, RemotePartition):
            jobs += [(index, one(part, port, info.instance)) for port in info.replicas]
    if not jobs:
        return
    found = await asyncio.gather(*(job for _, job in jobs))
    by_partition: dict[int, list[RemotePartition]] = {}
    for (index, _), replica in zip(jobs, found, strict=True):
        if replica is not None:
            by_partition.setdefault(index, []).append(replica)
    for index, replicas in by_partition.items():
        primary = served.partitions[index]
        assert isinstance(primary, RemotePartition)

        def reopen(
            port: int, instance: Any, primary: RemotePartition = primary
        ) -> Awaitable[RemotePartition | None]:
            return one(primary, port, instance)

        served.partitions[index] = ReplicatedPartition(
            primary, replicas, writes_via_primary=infos[index].durable, reopen=reopen
        )


async def _from_infos(
    conns: list[Connection],
    infos: list[ServerInfo],
    call_timeout: float,
    use_shared_memory: bool,
    timeout: float,
    wanted: frozenset[int] | None,
) -> ServedGraph:
    first = infos[0]
    book = RangePartitionBook.from_dict(first.book)
    if len(conns) != book.num_partitions():
        raise InvalidRequestError(
            f"graph {first.graph_name!r} has {book.num_partitions()} partitions "
            f"but {len(conns)} servers were given"
        )
    for i, info in enumerate(infos):
        if info.part_id != i:
            raise InvalidRequestError(
                f"server {conns[i].name} serves partition {info.part_id}, expected {i}: "
                "list servers in partition order"
            )
        if info.graph_name != first.graph_name or RangePartitionBook.from_dict(info.book) != book:
            raise InvalidRequestError(f"server {conns[i].name} serves a different graph or partitioning")
    here = boot_id()
    partitions: list[Partition] = []
    for conn, info in zip(conns, infos, strict=True):
        limit = info.max_frame_size if info.max_frame_size is not None else conn.max_frame_size
        frame = min(conn.max_frame_size, limit)
        part: Partition = RemotePartition(info.part_id, conn, call_timeout, max_frame_size=frame)
        shm = info.shm
        if (
            use_shared_memory
            and shm is not None
            and info.boot_id == here
            and (wanted is None or info.part_id in wanted)
        ):
            store = await _try_attach(shm, timeout)
            if store is not None:
                part = LocalPartition(
                    PartitionService(store), server=part, shm=shm, instance=info.instance
                )
        partitions.append(part)
    return ServedGraph(
        first.graph_name,
        book,
        partitions,
        conns,
        first.num_clients,
        [TensorMeta.from_dict(m) for m in first.tensors],
    )


async def _try_attach(shm: SharedMemoryInfo, timeout: float) -> PartitionStore | None:
    from asyncgraph.storage.fdpass import attach_store

    try:
        return await asyncio.to_thread(attach_store, shm.address, shm.token, timeout=timeout)
    except (AsyncGraphError, OSError) as exc:
        log.info("shared memory unavailable (%s); using the socket", exc)
        return None
