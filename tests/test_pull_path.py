"""The pull/push path: explicit local partitions, big multi-owner pulls and acknowledged pushes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from asyncgraph.client import AsyncClient, Client
from asyncgraph.client.remote import RemotePartition
from asyncgraph.errors import InvalidRequestError
from asyncgraph.testing import ServerGroup, start_servers


@pytest.fixture(scope="module")
def servers(pubmed2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(pubmed2.part_config, tmp_path_factory.mktemp("pull_path"), num_parts=2)
    yield group
    group.stop()
    assert all(p.returncode == 0 for p in group.procs), [group.log_text(i) for i in range(2)]


@pytest.mark.parametrize("local", [[0], [1], [], None])
async def test_local_partitions_restricts_shared_memory(servers: ServerGroup, pubmed2, local) -> None:
    client = await AsyncClient.connect(servers.addresses, local_partitions=local)
    try:
        assert client.local_partitions() == ([0, 1] if local is None else local)
        n = client.book.num_nodes
        ids = np.random.default_rng(1).integers(0, n, 3000)
        got = await client.pull_numpy("node:feat", ids)
        np.testing.assert_array_equal(got, pubmed2.original_rows("feat", ids))
    finally:
        await client.close()


async def test_local_partitions_rejects_bad_ids(servers: ServerGroup) -> None:
    for bad in ([2], [-1], "0", [True]):
        with pytest.raises(InvalidRequestError):
            await AsyncClient.connect(servers.addresses, local_partitions=bad)  # type: ignore[arg-type]


def test_sync_client_passes_local_partitions(servers: ServerGroup) -> None:
    client = Client.connect(servers.addresses, local_partitions=[1])
    try:
        assert client.aio.local_partitions() == [1]
    finally:
        client.close()


@pytest.mark.parametrize("local", [[0], []])
async def test_large_pull_and_push_roundtrip(servers: ServerGroup, local) -> None:
    """Pulls and pushes big enough to be split into chunks, with duplicates, both owners."""
    client = await AsyncClient.connect(servers.addresses, local_partitions=local)
    try:
        n = client.book.num_nodes
        name = f"node:big_{len(local)}"
        await client.create_tensor(name, "node", [n, 16], "float32")
        rng = np.random.default_rng(2)
        ids = rng.permutation(n)[:60000]
        values = rng.standard_normal((ids.size, 16)).astype(np.float32)
        await client.push(name, ids, values)
        got = await client.pull_numpy(name, ids)
        np.testing.assert_array_equal(got, values)
        dup = np.concatenate([ids[:5000], ids[:5000], ids[-7:]])
        got = await client.pull_numpy(name, dup)
        np.testing.assert_array_equal(got[:5000], values[:5000])
        np.testing.assert_array_equal(got[5000:10000], values[:5000])
        np.testing.assert_array_equal(got[10000:], values[-7:])
        await client.push(name, ids[:100], np.ones((100, 16), np.float32), op="add")
        got = await client.pull_numpy(name, ids[:100])
        np.testing.assert_array_equal(got, values[:100] + 1)
    finally:
        await client.close()


@pytest.mark.parametrize("local", [[0], [0, 1], []])
@pytest.mark.parametrize("share", [0.95, 0.5, 0.41, 0.39, 0.05])
async def test_mixed_pull_gathered_by_the_local_majority_owner(
    servers: ServerGroup, pubmed2, local, share: float
) -> None:
    """When a partition in this process owns >= 40% of a pull it gathers every row and the
    others' rows are written over theirs: same rows, same order, duplicates kept, either side
    of the threshold, with one or two local partitions or none."""
    client = await AsyncClient.connect(servers.addresses, local_partitions=local)
    try:
        book = client.book
        rng = np.random.default_rng(int(share * 100))
        n = 2000
        own = rng.integers(*book.node_range(0), size=int(n * share))
        other = rng.integers(*book.node_range(1), size=n - own.size)
        ids = rng.permutation(np.concatenate([own, other, own[:50]]))  # duplicates across owners
        got = await client.pull_numpy("node:feat", ids)
        np.testing.assert_array_equal(got, pubmed2.original_rows("feat", ids))
        got[:] = 0  # the result is the caller's own array: nothing cached or shared is changed
        again = await client.pull_numpy("node:feat", ids)
        np.testing.assert_array_equal(again, pubmed2.original_rows("feat", ids))
    finally:
        await client.close()


@pytest.mark.parametrize("which", ["pubmed1", "pubmed2"])
def test_standalone_blocking_pulls_read_on_the_callers_thread(
    request: pytest.FixtureRequest, which: str
) -> None:
    """A standalone client answers a one-owner pull on the caller's thread (no hop to its loop
    thread) with the same rows, errors and empty shapes as the async path; pulls spanning
    several partitions, unknown tensors and cached tensors take the async path."""
    from asyncgraph.client.traffic import Traffic
    from asyncgraph.errors import DTypeMismatchError, OutOfRangeError, UnknownTensorError

    data = request.getfixturevalue(which)
    client = Client.standalone(data.part_config)
    try:
        aio = client.aio
        lo, hi = client.book.node_range(0)
        ids = np.random.default_rng(3).integers(lo, hi, 500)
        here = aio.pull_here("node:feat", ids)
        assert here is not None
        np.testing.assert_array_equal(here, data.original_rows("feat", ids))
        np.testing.assert_array_equal(client.pull("node:feat", ids).numpy(), here)
        assert aio.pull_here("node:feat", np.empty(0, np.int64)).shape == (0, 500)  # type: ignore[union-attr]
        spanning = np.array([lo, client.book.num_nodes - 1])
        assert (aio.pull_here("node:feat", spanning) is None) == (which == "pubmed2")
        np.testing.assert_array_equal(
            client.pull("node:feat", spanning).numpy(), data.original_rows("feat", spanning)
        )
        assert aio.pull_here("node:nope", ids) is None
        with pytest.raises(UnknownTensorError):
            client.pull("node:nope", ids)
        with pytest.raises(OutOfRangeError):
            client.pull("node:feat", np.array([client.book.num_nodes]))
        with pytest.raises(DTypeMismatchError):
            client.pull("node:feat", np.array([0.5]))
        client.loop.run(aio.build_cache("node:feat", ids[:10]))
        assert aio.pull_here("node:feat", ids) is None  # the cache's counters stay right
        traffic = Traffic()
        client.loop.run(aio.pull_numpy("node:feat", ids, traffic))
        assert traffic.cache_hits >= 10
    finally:
        client.close()


def test_served_blocking_pulls_keep_the_loop_path(servers: ServerGroup) -> None:
    client = Client.connect(servers.addresses)
    try:
        lo, _ = client.book.node_range(0)
        client.pull("node:feat", np.array([lo]))  # metadata known from here on
        assert client.aio.pull_here("node:feat", np.array([lo])) is None
    finally:
        client.close()


def _remotes(client: AsyncClient) -> list[RemotePartition]:
    return [p for p in client.partitions if isinstance(p, RemotePartition)]


@pytest.mark.parametrize("local", [[], [0]])
@pytest.mark.parametrize("owners", ["both", "one"])
async def test_large_remote_pull_goes_as_pipelined_chunks(
    servers: ServerGroup, pubmed2, local: list[int], owners: str
) -> None:
    """A pull of remote rows over twice ``chunk_bytes`` goes as requests of ``chunk_bytes``
    each (more than ``max_inflight``, so some wait for a slot), every chunk written to its
    place: same rows, same order, duplicates kept, one owner or both, with or without a
    partition in this process. At or under twice ``chunk_bytes``: one request per owner."""
    client = await AsyncClient.connect(servers.addresses, local_partitions=local)
    try:
        book = client.book
        remote = _remotes(client)
        assert [p.part_id for p in remote] == [p for p in (0, 1) if p not in local]
        for p in remote:
            assert p.conn.same_host  # loopback: not chunked unless told to
            p.chunk_bytes = 16 * 2000  # 16 rows of 500 float32
            p.chunk_on_same_host = True
        rng = np.random.default_rng(4)
        if owners == "one":
            ids = rng.integers(*book.node_range(1), size=700)
        else:
            ids = rng.integers(0, book.num_nodes, size=1500)
        ids = np.concatenate([ids, ids[:40]])  # duplicates
        written = {p.part_id: p.conn.requests_written for p in remote}
        got = await client.pull_numpy("node:feat", ids)
        np.testing.assert_array_equal(got, pubmed2.original_rows("feat", ids))
        assert got.flags.c_contiguous and got.flags.writeable
        owner = book.nid2partid(ids)
        for p in remote:
            rows = int(np.count_nonzero(owner == p.part_id))
            sent = p.conn.requests_written - written[p.part_id]
            assert sent == -(-rows // 16), (p.part_id, rows, sent)
        small = ids[:16]  # 16 rows: one request per owner
        written = {p.part_id: p.conn.requests_written for p in remote}
        np.testing.assert_array_equal(
            await client.pull_numpy("node:feat", small), pubmed2.original_rows("feat", small)
        )
        for p in remote:
            assert p.conn.requests_written - written[p.part_id] <= 1
        for p in remote:  # the default over loopback: one request per owner however large
            p.chunk_on_same_host = False
        written = {p.part_id: p.conn.requests_written for p in remote}
        got = await client.pull_numpy("node:feat", ids)
        np.testing.assert_array_equal(got, pubmed2.original_rows("feat", ids))
        for p in remote:
            assert p.conn.requests_written - written[p.part_id] == int(p.part_id in owner)
    finally:
        await client.close()


async def test_failed_chunk_fails_the_pull_and_writes_nothing_later(servers: ServerGroup, pubmed2) -> None:
    """A chunk the server refuses (an ID its partition does not own) fails the whole pull with
    the server's typed error; the other chunks are cancelled, so nothing is written into the
    caller's output after the error, and the connection serves the next pull."""
    from asyncgraph.errors import OutOfRangeError

    client = await AsyncClient.connect(servers.addresses, local_partitions=[])
    try:
        part = next(p for p in _remotes(client) if p.part_id == 1)
        part.chunk_bytes, part.chunk_on_same_host = 16 * 2000, True
        lo, hi = client.book.node_range(1)
        ids = np.random.default_rng(5).integers(lo, hi, 800)
        ids[500] = client.book.node_range(0)[0]  # owned by partition 0: chunk 31 of 50 is refused
        out = np.zeros((ids.size, 500), np.float32)
        with pytest.raises(OutOfRangeError):
            await part.pull("node:feat", ids, 2000, out=out)
        seen = out.copy()
        await asyncio.sleep(0.2)
        np.testing.assert_array_equal(out, seen)
        assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        good = ids[:480]
        np.testing.assert_array_equal(
            await part.pull("node:feat", good, 2000), pubmed2.original_rows("feat", good)
        )
    finally:
        await client.close()
