"""A client's partitions from its servers: connect, check they serve one graph in partition
order, and map co-located partitions' memory (``LocalPartition``) instead of using the socket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from asyncgraph.errors import AsyncGraphError, InvalidRequestError
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol.ops import Op
from asyncgraph.service import LocalPartition, Partition, PartitionService, boot_id
from asyncgraph.storage.store import PartitionStore, TensorMeta

from .connection import Connection
from .remote import RemotePartition

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
) -> ServedGraph:
    """Connect to every server concurrently (see ``AsyncClient.connect``); all or nothing."""
    if not servers:
        raise InvalidRequestError("no servers given")
    wanted = _wanted(local_partitions, len(servers))
    conns = await asyncio.gather(
        *(
            Connection.open(
                host,
                port,
                graph_name=graph_name,
                secret=secret,
                timeout=connect_timeout,
                max_frame_size=max_frame_size,
                max_inflight=max_inflight,
                reconnect_window=reconnect_window,
            )
            for host, port in servers
        ),
        return_exceptions=True,
    )
    failures = [c for c in conns if isinstance(c, BaseException)]
    if failures:
        for c in conns:
            if isinstance(c, Connection):
                c.close()
        raise failures[0]
    opened = [c for c in conns if isinstance(c, Connection)]
    try:
        infos = await asyncio.gather(*(c.call(Op.INFO, {}, connect_timeout) for c in opened))
        return await _from_infos(opened, infos, call_timeout, use_shared_memory, connect_timeout, wanted)
    except BaseException:
        for c in opened:
            c.close()
        raise


async def _from_infos(
    conns: list[Connection],
    infos: list[dict[str, Any]],
    call_timeout: float,
    use_shared_memory: bool,
    timeout: float,
    wanted: frozenset[int] | None,
) -> ServedGraph:
    first = infos[0]
    book = RangePartitionBook.from_dict(first["book"])
    if len(conns) != book.num_partitions():
        raise InvalidRequestError(
            f"graph {first['graph_name']!r} has {book.num_partitions()} partitions "
            f"but {len(conns)} servers were given"
        )
    for i, info in enumerate(infos):
        if info["part_id"] != i:
            raise InvalidRequestError(
                f"server {conns[i].name} serves partition {info['part_id']}, expected {i}: "
                "list servers in partition order"
            )
        if info["graph_name"] != first["graph_name"] or RangePartitionBook.from_dict(info["book"]) != book:
            raise InvalidRequestError(f"server {conns[i].name} serves a different graph or partitioning")
    here = boot_id()
    partitions: list[Partition] = []
    for conn, info in zip(conns, infos, strict=True):
        part: Partition = RemotePartition(info["part_id"], conn, call_timeout)
        shm = info.get("shm")
        if (
            use_shared_memory
            and shm
            and info.get("boot_id") == here
            and (wanted is None or info["part_id"] in wanted)
        ):
            store = await _try_attach(shm, timeout)
            if store is not None:
                part = LocalPartition(
                    PartitionService(store), server=part, shm=shm, instance=info.get("instance")
                )
        partitions.append(part)
    return ServedGraph(
        first["graph_name"],
        book,
        partitions,
        conns,
        first["num_clients"],
        [TensorMeta.from_dict(m) for m in first["tensors"]],
    )


async def _try_attach(shm: Mapping[str, Any], timeout: float) -> PartitionStore | None:
    from asyncgraph.storage.fdpass import attach_store

    try:
        return await asyncio.to_thread(attach_store, shm["address"], shm["token"], timeout=timeout)
    except (AsyncGraphError, OSError) as exc:
        log.info("shared memory unavailable (%s); using the socket", exc)
        return None
