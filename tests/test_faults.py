"""Network faults between the real client and real servers, injected by a TCP proxy (PubMed, 2 parts).

No process is killed and nothing sleeps for a fault to happen: ``FaultProxy`` black-holes
traffic, tears a reply mid-frame or stops reading the server's replies exactly when told.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from fault_proxy import FaultProxy

from asyncgraph.client import AsyncClient
from asyncgraph.errors import RequestTimeoutError, ServerUnavailableError
from asyncgraph.testing import ServerGroup, start_servers


@pytest.fixture(scope="module")
def servers(pubmed2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(
        pubmed2.part_config,
        tmp_path_factory.mktemp("faults"),
        num_parts=2,
        extra_args=["--log-level", "WARNING"],
    )
    yield group
    group.stop()


@pytest.fixture
async def proxy(servers: ServerGroup) -> AsyncIterator[FaultProxy]:
    """A proxy in front of partition 0's server; partition 1 is reached directly."""
    async with FaultProxy(servers.addresses[0]) as p:
        yield p


async def connect(servers: ServerGroup, proxy: FaultProxy, **kwargs: float) -> AsyncClient:
    return await AsyncClient.connect(
        [proxy.address, servers.addresses[1]],
        use_shared_memory=False,
        **kwargs,  # type: ignore[arg-type]
    )


def part0_ids(client: AsyncClient, count: int) -> np.ndarray:
    start, end = client.book.node_range(0)
    return np.arange(count) % (end - start) + start


@pytest.mark.timeout(60)
async def test_black_holed_server_times_out_then_recovers(
    servers: ServerGroup, proxy: FaultProxy, pubmed2
) -> None:
    client = await connect(servers, proxy, call_timeout=0.5)
    try:
        ids = part0_ids(client, 10)
        assert (await client.pull("node:feat", ids)).shape == (10, 500)
        proxy.black_hole()
        for _ in range(2):
            t0 = time.monotonic()
            with pytest.raises(
                RequestTimeoutError, match=r"pull on server 127\.0\.0\.1:\d+ timed out after 0\.5 s"
            ):
                await client.pull("node:feat", ids)
            assert 0.4 < time.monotonic() - t0 < 3
        other = np.array([client.book.num_nodes - 1])  # partition 1 does not go through the proxy
        assert (await client.pull("node:feat", other)).shape == (1, 500)
        proxy.restore()  # the late replies arrive for callers that left; later calls work
        got = await client.pull("node:feat", ids)
        np.testing.assert_array_equal(got.numpy(), pubmed2.original_rows("feat", ids))
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_calls_waiting_for_a_slot_time_out_at_their_deadline_and_free_nothing_twice(
    servers: ServerGroup, proxy: FaultProxy, pubmed2
) -> None:
    """max_inflight=1 on a black-holed server: one call holds the slot, the others wait for it;
    every one fails at its own deadline, and afterwards the connection still serves calls one
    at a time (no slot leaked or handed out twice)."""
    client = await connect(servers, proxy, call_timeout=0.5, max_inflight=1)
    try:
        ids = part0_ids(client, 3)
        assert (await client.pull("node:feat", ids)).shape == (3, 500)
        conn = client.partitions[0].conn  # type: ignore[attr-defined]
        proxy.black_hole()
        t0 = time.monotonic()
        calls = [asyncio.ensure_future(client.pull("node:feat", ids)) for _ in range(4)]
        await asyncio.sleep(0.1)
        assert conn._inflight == 1 and len(conn._slot_waiters) == 3
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, RequestTimeoutError) for r in results), results
        assert time.monotonic() - t0 < 3  # the waiters did not each wait for the holder first
        assert conn._inflight == 0
        proxy.restore()
        got = await asyncio.gather(*(client.pull("node:feat", ids[i : i + 1]) for i in range(3)))
        for i, rows in enumerate(got):
            np.testing.assert_array_equal(rows.numpy(), pubmed2.original_rows("feat", ids[i : i + 1]))
        assert conn._inflight == 0
    finally:
        await client.close()


@pytest.mark.timeout(60)
async def test_cut_mid_frame_fails_every_pending_call(servers: ServerGroup, proxy: FaultProxy) -> None:
    client = await connect(servers, proxy, call_timeout=30.0)
    try:
        ids = part0_ids(client, 2000)  # a 4 MB reply: the cut falls inside it
        assert (await client.pull("node:feat", ids[:5])).shape == (5, 500)
        proxy.cut(after=1000)
        calls = [asyncio.ensure_future(client.pull("node:feat", ids)) for _ in range(4)]
        t0 = time.monotonic()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert time.monotonic() - t0 < 10
        assert proxy.cuts == 1
        assert all(isinstance(r, ServerUnavailableError) for r in results), results
        assert all(f"{proxy.address[1]}" in str(r) for r in results)
        with pytest.raises(ServerUnavailableError):  # later calls fail at once
            await client.pull("node:feat", ids[:5])
    finally:
        await client.close()


@pytest.mark.timeout(120)
async def test_slow_reader_is_held_back_while_another_client_is_served(
    servers: ServerGroup, proxy: FaultProxy, pubmed2
) -> None:
    """A client that stops reading replies: the server stops reading its requests (bounded memory)."""
    slow = await connect(servers, proxy, call_timeout=60.0, max_inflight=64)
    other = await AsyncClient.connect(servers.addresses, use_shared_memory=False, call_timeout=10.0)
    try:
        rss_before = (await other.server_stats())[0]["rss"]
        proxy.pause_server_reads()
        big = part0_ids(slow, 2000)  # 4 MB replies: 30 of them overflow the server's 64 MiB write buffer
        many = part0_ids(slow, 200_000)  # 1.6 MB requests with 1.6 MB replies
        calls = [asyncio.ensure_future(slow.pull_numpy("node:feat", big)) for _ in range(30)]
        calls += [asyncio.ensure_future(slow.pull_numpy("node:label", many)) for _ in range(16)]
        # wait until the server has stopped taking the slow client's bytes (bounded in time)
        deadline = time.monotonic() + 30
        last, still_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            accepted = proxy.server_accepted
            if accepted != last:
                last, still_since = accepted, time.monotonic()
            elif time.monotonic() - still_since > 1.0 and proxy.pending_to_server > 0:
                break
        assert proxy.pending_to_server > 0, "the server kept reading from a client that reads nothing"
        assert not any(c.done() for c in calls)
        # meanwhile another client is served by the same server
        ids = np.arange(0, other.book.num_nodes, 997)
        for _ in range(5):
            got = await other.pull("node:feat", ids)
            np.testing.assert_array_equal(got.numpy(), pubmed2.original_rows("feat", ids))
        growth = (await other.server_stats())[0]["rss"] - rss_before
        assert growth < 400 << 20, f"server RSS grew by {growth >> 20} MiB for one slow reader"
        assert proxy.server_accepted == last  # still held back
        proxy.resume_server_reads()
        results = await asyncio.wait_for(asyncio.gather(*calls), 60)
        assert [r.shape[0] for r in results] == [2000] * 30 + [200_000] * 16
        np.testing.assert_array_equal(results[-1], pubmed2.original_rows("label", many))
    finally:
        await slow.close()
        await other.close()


@pytest.mark.timeout(60)
async def test_throttled_replies_still_arrive_whole(servers: ServerGroup, proxy: FaultProxy, pubmed2) -> None:
    client = await connect(servers, proxy, call_timeout=30.0)
    try:
        proxy.throttle(4 << 20)  # ~4 MB/s: a 1 MB reply takes a quarter of a second
        ids = part0_ids(client, 500)
        t0 = time.monotonic()
        got = await client.pull("node:feat", ids)
        assert time.monotonic() - t0 > 0.1
        np.testing.assert_array_equal(got.numpy(), pubmed2.original_rows("feat", ids))
    finally:
        await client.close()
