"""Requests issued in one loop tick share socket writes (issue 9): real servers (PubMed, 2 parts).

``Connection`` writes the first request of a tick at once and the others of that tick in groups
of ``COALESCE_REQUESTS`` (one ``writelines`` each), the last group at the end of the tick.
``Connection.writes`` / ``requests_written`` count what went out, so coalescing is checked by
count, never by timing. A request cancelled while queued is never written; a connection lost
while requests are queued fails them all (or, with a reconnect window, resends them on the new
connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient, Client, Connection
from asyncgraph.errors import ServerUnavailableError
from asyncgraph.net.connection import COALESCE_BYTES, COALESCE_REQUESTS
from asyncgraph.testing import ServerGroup

# Concurrent pulls per tick: the first, one full group, and a half group still queued at the end
# of the tick; below max_inflight (32), so none waits for a slot.
N = 1 + COALESCE_REQUESTS + COALESCE_REQUESTS // 2
WRITES = 3  # for N requests in one tick: the first, the full group, the rest at the end
EARLY = 1 + COALESCE_REQUESTS  # requests written before the tick ends
assert COALESCE_REQUESTS >= 2 and N <= 32


@pytest.fixture
async def client(served: ServerGroup) -> AsyncIterator[AsyncClient]:
    c = await AsyncClient.connect(served.addresses, use_shared_memory=False, call_timeout=20.0)
    try:
        yield c
    finally:
        await c.close()


def conn_of(client: AsyncClient, part: int) -> Connection:
    conn = client.partitions[part].conn  # type: ignore[attr-defined]
    assert isinstance(conn, Connection)
    return conn


def rows_of(client: AsyncClient, part: int, count: int) -> list[np.ndarray]:
    """``count`` different single-ID requests owned by ``part``."""
    start, end = client.book.node_range(part)
    return [np.array([start + (7 * i) % (end - start)]) for i in range(count)]


async def start_tick(client: AsyncClient, requests: list[np.ndarray]) -> list[asyncio.Task[Any]]:
    """Start one pull per request and return once every one has issued its request (one tick)."""
    tasks = [asyncio.ensure_future(client.pull("node:feat", ids)) for ids in requests]
    await asyncio.sleep(0)  # the tasks' first steps ran before us: all issued, none flushed yet
    return tasks


async def queue_a_tick(
    client: AsyncClient, part: int
) -> tuple[Connection, list[np.ndarray], int, list[asyncio.Task[Any]]]:
    """``N`` pulls to ``part``'s server in one tick, the first ``EARLY`` written and the rest
    still queued: ``(connection, requests, requests written before, tasks)``."""
    conn = conn_of(client, part)
    requests = rows_of(client, part, N)
    await client.pull("node:feat", requests[0])  # tensor metadata cached: a pull sends at once
    written = conn.requests_written
    tasks = await start_tick(client, requests)
    assert len(conn.writer.queued) == N - EARLY
    return conn, requests, written, tasks


@pytest.mark.timeout(60)
async def test_concurrent_pulls_in_one_tick_are_written_in_groups(client: AsyncClient, pubmed2: Any) -> None:
    conn = conn_of(client, 0)
    requests = rows_of(client, 0, N)
    await client.pull("node:feat", requests[0])  # tensor metadata cached: a pull sends at once
    w0, r0 = conn.writes, conn.requests_written
    got = await asyncio.gather(*(client.pull("node:feat", ids) for ids in requests))
    assert (conn.writes - w0, conn.requests_written - r0) == (WRITES, N)
    for ids, rows in zip(requests, got, strict=True):
        np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", ids))
    assert conn._inflight == 0 and not conn._pending and not conn.writer.queued


@pytest.mark.timeout(60)
def test_the_sync_clients_uvloop_coalesces_too(served: ServerGroup, pubmed2: Any) -> None:
    """The blocking ``Client`` runs its calls on its own loop (uvloop where installed)."""
    client = Client.connect(served.addresses, use_shared_memory=False)
    try:
        aio = client.aio
        conn = conn_of(aio, 1)
        requests = rows_of(aio, 1, N)
        client.pull("node:feat", requests[0])
        w0, r0 = conn.writes, conn.requests_written

        async def tick() -> list[Any]:
            return await asyncio.gather(*(aio.pull("node:feat", ids) for ids in requests))

        got = client.loop.run(tick())
        assert (conn.writes - w0, conn.requests_written - r0) == (WRITES, N)
        for ids, rows in zip(requests, got, strict=True):
            np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", ids))
    finally:
        client.close()


@pytest.mark.timeout(60)
async def test_pulls_over_both_partitions_coalesce_per_connection(client: AsyncClient, pubmed2: Any) -> None:
    """One gather of pulls spanning both partitions: each connection coalesces its own share."""
    ids = np.concatenate(rows_of(client, 0, 3) + rows_of(client, 1, 3))
    await client.pull("node:feat", ids)
    conns = [conn_of(client, p) for p in (0, 1)]
    before = [(c.writes, c.requests_written) for c in conns]
    got = await asyncio.gather(*(client.pull("node:feat", ids) for _ in range(N)))
    for c, (w0, r0) in zip(conns, before, strict=True):
        assert (c.writes - w0, c.requests_written - r0) == (WRITES, N)
    for rows in got:
        np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", ids))


@pytest.mark.timeout(60)
async def test_big_requests_are_written_when_issued(client: AsyncClient, pubmed2: Any) -> None:
    """A request that brings the tick's queue to ``COALESCE_BYTES`` is written at once (with
    what was queued before it), so flow control sees it as before; small ones still coalesce."""
    conn = conn_of(client, 0)
    start, end = client.book.node_range(0)
    big = np.resize(np.arange(start, end), COALESCE_BYTES // 8 + 100)  # its frame alone exceeds it
    small = rows_of(client, 0, 3)
    requests = [small[0], big, big[::-1].copy(), small[1], small[2]]
    await client.pull("node:label", small[0])
    w0, r0 = conn.writes, conn.requests_written
    got = await asyncio.gather(*(client.pull("node:label", ids) for ids in requests))
    # small[0] at once; each big one when issued; small[1:] together at the end of the tick
    assert (conn.writes - w0, conn.requests_written - r0) == (4, 5)
    for ids, rows in zip(requests, got, strict=True):
        np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("label", ids))


@pytest.mark.timeout(60)
async def test_sequential_calls_write_once_each(client: AsyncClient, pubmed2: Any) -> None:
    conn = conn_of(client, 1)
    requests = rows_of(client, 1, 5)
    w0, r0 = conn.writes, conn.requests_written
    for ids in requests:
        rows = await client.pull("node:feat", ids)
        np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", ids))
    assert (conn.writes - w0, conn.requests_written - r0) == (5, 5)
    assert not conn.writer.queued


@pytest.mark.timeout(60)
async def test_cancelled_requests_leave_the_connection_and_the_others_intact(
    client: AsyncClient, pubmed2: Any
) -> None:
    """The tick's first request (already written) and one queued request are cancelled: the queued
    one is never written, the late reply to the written one is dropped, every other call gets
    its own rows, and the connection serves later calls with no slot lost."""
    conn = conn_of(client, 0)
    requests = rows_of(client, 0, N)
    await client.pull("node:feat", requests[0])
    w0, r0 = conn.writes, conn.requests_written
    tasks = await start_tick(client, requests)
    assert len(conn.writer.queued) == N - EARLY and conn.requests_written - r0 == EARLY
    tasks[0].cancel()
    tasks[N - 2].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert (conn.writes - w0, conn.requests_written - r0) == (WRITES, N - 1)
    for i, (ids, result) in enumerate(zip(requests, results, strict=True)):
        if i in (0, N - 2):
            assert isinstance(result, asyncio.CancelledError)
        else:
            assert not isinstance(result, BaseException), result
            np.testing.assert_array_equal(result.numpy(), pubmed2.original_rows("feat", ids))
    assert conn._inflight == 0 and not conn._pending and not conn.closed
    got = await asyncio.gather(*(client.pull("node:feat", ids) for ids in requests))
    for ids, rows in zip(requests, got, strict=True):
        np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", ids))


@pytest.mark.timeout(60)
async def test_connection_lost_with_requests_queued_fails_all_of_them(client: AsyncClient) -> None:
    conn, requests, r0, tasks = await queue_a_tick(client, 0)
    assert conn._transport is not None
    conn._transport.abort()  # the socket is gone before the tick's flush
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, ServerUnavailableError) for r in results), results
    assert all(conn.name in str(r) for r in results)
    assert conn.requests_written - r0 == EARLY  # the queued ones were never written
    assert conn.closed and conn._inflight == 0 and not conn._pending and not conn.writer.queued
    with pytest.raises(ServerUnavailableError):  # later calls fail at once
        await client.pull("node:feat", requests[0])
    other = rows_of(client, 1, 1)[0]  # the other server's connection is untouched
    assert (await client.pull("node:feat", other)).shape == (1, 500)


@pytest.mark.timeout(60)
async def test_closing_the_connection_with_requests_queued_fails_them(client: AsyncClient) -> None:
    conn, _, r0, tasks = await queue_a_tick(client, 1)
    conn.close()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, ServerUnavailableError) for r in results), results
    assert all("closed by the client" in str(r) for r in results[EARLY:]), results
    assert conn.requests_written - r0 == EARLY and not conn._pending and not conn.writer.queued


@pytest.mark.timeout(60)
async def test_requests_queued_when_the_connection_is_lost_are_resent_after_reconnecting(
    served: ServerGroup, pubmed2: Any
) -> None:
    client = await AsyncClient.connect(
        served.addresses, use_shared_memory=False, call_timeout=20.0, reconnect_window=10.0
    )
    try:
        conn, requests, _, tasks = await queue_a_tick(client, 0)
        assert conn._transport is not None
        conn._transport.abort()
        got = await asyncio.gather(*tasks)
        for ids, rows in zip(requests, got, strict=True):
            np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", ids))
        assert conn.generation == 1 and conn.retries == N
        # Issued in the very tick the transport closed (before ``connection_lost`` has run):
        # the call must see the loss and reconnect, not retry on the closing transport forever.
        assert conn._transport is not None
        conn._transport.abort()
        rows = await client.pull("node:feat", requests[1])
        np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", requests[1]))
        assert conn.generation == 2
    finally:
        await client.close()
