"""Durable server state (snapshots, write-ahead log) and clients riding through a server restart.

Pure parts (log records, snapshot fallback) run on an in-process store; the rest on real server
processes (Cora, 2 partitions) killed with SIGKILL and restarted on the same port with the same
state folder.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import shutil
import signal
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import PartialTensorError, RequestTimeoutError, ServerUnavailableError, StateLogError
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol.ops import Op
from asyncgraph.server.durable import DurableState, SnapshotError, StateDir, WriteAheadLog
from asyncgraph.server.handlers import RequestHandlers
from asyncgraph.storage.store import PartitionStore
from asyncgraph.testing import ServerGroup, start_servers


# --- pure: log and snapshots on an in-process store -----------------------------------------
def small_store() -> PartitionStore:
    book = RangePartitionBook([0, 10], [0, 0])
    feat = np.arange(40, dtype=np.float32).reshape(10, 4)
    return PartitionStore.create(
        "g", 0, book, np.zeros(11, np.int64), np.empty(0, np.int64), np.empty(0, np.int64),
        {"feat": feat}, {}, shared=False,
    )  # fmt: skip


def logged_store_with_emb(state_dir: Path) -> tuple[PartitionStore, DurableState, RequestHandlers]:
    """A small store served by handlers that log to a WAL in ``state_dir``, with a fresh
    ``node:emb`` (10 x 2 float32) created through them."""
    store = small_store()
    state = DurableState(state_dir, 0, wal=True)
    handlers = RequestHandlers(store, num_clients=1, durable=state)
    state.restore(store, handlers.replay)
    handlers.ops[Op.CREATE_TENSOR](
        {"name": "node:emb", "policy": "node", "shape": [10, 2], "dtype": "float32"}
    )
    return store, state, handlers


def test_wal_round_trip_and_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "wal.log"
    wal = WriteAheadLog(path, "always")
    for i in range(3):
        wal.append(
            "push", {"name": "x", "ids": np.arange(i + 1), "values": np.full(i + 1, i, np.float32)}, f"r{i}"
        )
    wal.close()
    good = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\x00\x01\x02\x03\x00\x00\x10\x00partial")  # a record a crash cut short
    records = list(WriteAheadLog.records(path))
    assert [r["rid"] for r in records] == ["r0", "r1", "r2"]
    assert records[2]["args"]["values"].tolist() == [2.0, 2.0, 2.0]
    assert path.stat().st_size == good  # torn tail truncated


# One log record's frame as the previous release (protocol 1: arrays as ExtType 1, absolute
# offsets) wrote it: push {"name": "x", "ids": int64 [0, 1], "values": float32 [7, 8]}, rid "r-old".
V1_RECORD_FRAME = bytes.fromhex(
    "000000c80000006e84a26f70a470757368a46172677383a46e616d65a178a3696473c7190194a33c69389102cf000000"
    "0000000080cf0000000000000010a676616c756573c7190194a33c66349102cf00000000000000c0cf00000000000000"
    "08a3726964a5722d6f6c64a174cb3ff80000000000000000000000000000000000000000000000000000000001000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000e04000000041"
)


def test_wal_written_by_the_previous_release_still_replays(tmp_path: Path) -> None:
    """A log that starts with a protocol-1 record and goes on with this release's records."""
    path = tmp_path / "wal.log"
    path.write_bytes(zlib.crc32(V1_RECORD_FRAME).to_bytes(4, "big") + V1_RECORD_FRAME)
    wal = WriteAheadLog(path, "always")
    wal.append("push", {"name": "x", "ids": np.arange(3), "values": np.ones((3, 2), np.float32)}, "r-new")
    wal.close()
    size = path.stat().st_size
    old, new = WriteAheadLog.records(path)
    assert (old["op"], old["rid"], old["t"]) == ("push", "r-old", 1.5)
    assert old["args"]["ids"].dtype == np.int64 and old["args"]["ids"].tolist() == [0, 1]
    assert old["args"]["values"].dtype == np.float32 and old["args"]["values"].tolist() == [7.0, 8.0]
    assert new["rid"] == "r-new" and new["args"]["values"].shape == (3, 2)
    assert path.stat().st_size == size  # nothing taken for a torn tail


def test_snapshot_restore_and_fallback_to_previous(tmp_path: Path) -> None:
    store, state, handlers = logged_store_with_emb(tmp_path)
    handlers.ops[Op.PUSH]({"name": "node:emb", "ids": np.arange(10), "values": np.ones((10, 2), np.float32)})
    state.snapshot(store, 1)
    push = {"name": "node:emb", "ids": np.array([3]), "values": np.full((1, 2), 5, np.float32), "op": "add"}
    handlers.ops[Op.PUSH]({**push, "rid": "a"})
    handlers.ops[Op.PUSH]({**push, "rid": "a"})  # a retry: applied once
    state.snapshot(store, 2)
    handlers.ops[Op.PUSH]({**push, "rid": "b"})
    expected = store.local_rows("node:emb").copy()
    assert expected[3].tolist() == [11.0, 11.0]
    state.close()

    def restored() -> tuple[PartitionStore, RequestHandlers]:
        fresh = small_store()
        st = DurableState(tmp_path, 0, wal=True)
        h = RequestHandlers(fresh, num_clients=1, durable=st)
        st.restore(fresh, h.replay)
        return fresh, h

    fresh, h = restored()
    np.testing.assert_array_equal(fresh.local_rows("node:emb"), expected)
    h.ops[Op.PUSH]({**push, "rid": "b"})  # remembered across the restart: not applied again
    np.testing.assert_array_equal(fresh.local_rows("node:emb"), expected)
    assert h.durable is not None
    h.durable.close()

    # Corrupt the newest snapshot: the older one plus both logs give the same rows.
    sd = StateDir(tmp_path, 0)
    newest = sd.snapshot_path(max(sd.snapshot_epochs()))
    target = next(newest.glob("t*.bin"))
    data = bytearray(target.read_bytes())
    data[0] ^= 0xFF
    target.write_bytes(bytes(data))
    fresh, h = restored()
    np.testing.assert_array_equal(fresh.local_rows("node:emb"), expected)
    assert h.durable is not None
    h.durable.close()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_write_the_log_cannot_take_refuses_every_later_write(tmp_path: Path) -> None:
    """Disk full under the WAL (``/dev/full``: every flush fails with ENOSPC): the write fails
    typed, later writes and its retry are refused (memory may be ahead of the log), reads go on,
    and a restart from the state folder gives the last durable rows."""
    store, state, handlers = logged_store_with_emb(tmp_path)
    push = {"name": "node:emb", "ids": np.array([3]), "values": np.full((1, 2), 5, np.float32), "op": "add"}
    handlers.ops[Op.PUSH]({**push, "rid": "a"})
    durable_rows = store.local_rows("node:emb").copy()
    assert state.wal is not None
    state.wal.close()
    state.wal = WriteAheadLog(Path("/dev/full"), "interval")
    with pytest.raises(StateLogError, match="No space left"):
        handlers.ops[Op.PUSH]({**push, "rid": "b"})
    rows_after_failure = store.local_rows("node:emb").copy()
    with pytest.raises(StateLogError, match="refused"):
        handlers.ops[Op.PUSH]({**push, "rid": "b"})  # the client's retry: not applied twice
    with pytest.raises(StateLogError, match="refused"):
        handlers.ops[Op.CREATE_TENSOR]({"name": "node:x", "policy": "node", "shape": [10], "dtype": "int64"})
    np.testing.assert_array_equal(store.local_rows("node:emb"), rows_after_failure)
    assert not store.has_tensor("node:x")
    np.testing.assert_array_equal(  # reads are still served
        handlers.ops[Op.PULL]({"name": "node:emb", "ids": np.arange(10)}), rows_after_failure
    )
    fresh = small_store()
    restarted = DurableState(tmp_path, 0, wal=True)
    restarted.restore(fresh, RequestHandlers(fresh, num_clients=1, durable=restarted).replay)
    np.testing.assert_array_equal(fresh.local_rows("node:emb"), durable_rows)
    restarted.close()


def test_no_usable_snapshot_is_a_clear_error(tmp_path: Path) -> None:
    store = small_store()
    state = DurableState(tmp_path, 0, wal=False)
    state.snapshot(store, 1)
    (state.dir.snapshot_path(1) / "manifest.json").write_text("{not json")
    with pytest.raises(SnapshotError, match="no usable snapshot"):
        DurableState(tmp_path, 0, wal=False).restore(small_store(), lambda op, args: None)


# --- real servers -----------------------------------------------------------------------------
@pytest.fixture
def durable_servers(cora2, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )
    yield group
    group.stop()


@pytest.mark.timeout(120)
async def test_kill9_push_storm_loses_no_acknowledged_write(durable_servers: ServerGroup, cora2) -> None:
    """Push-adds of known deltas; SIGKILL at random points; every acknowledged add survives."""
    group = durable_servers
    rng = random.Random(7)
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    n = client.book.num_nodes
    await client.create_tensor("acc", "node", [n, 2], "float64")
    await client.snapshot()
    acked = np.zeros((n, 2))
    maybe = np.zeros((n, 2))  # sent but never acknowledged: may or may not be applied
    nrng = np.random.default_rng(1)
    for _round in range(3):
        stop = asyncio.Event()

        async def storm(client: AsyncClient, stop: asyncio.Event, acked: np.ndarray) -> None:
            while not stop.is_set():
                ids = nrng.integers(0, n, 64)
                vals = nrng.integers(1, 5, (64, 2)).astype(np.float64)
                try:
                    await client.push("acc", ids, vals, op="add")
                except ServerUnavailableError:
                    np.add.at(maybe, ids, vals)
                    return
                np.add.at(acked, ids, vals)

        before = acked.sum()
        task = asyncio.ensure_future(storm(client, stop, acked))
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        victim = rng.randrange(2)
        group.kill(victim, signal.SIGKILL)
        stop.set()
        await task
        assert acked.sum() > before  # writes were acknowledged before the kill
        await client.close()
        group.restart(victim)
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        got = (await client.pull("acc", np.arange(n))).numpy()
        assert np.all(got >= acked - 1e-9), "an acknowledged write was lost"
        assert np.all(got <= acked + maybe + 1e-9)
        acked = got.copy()  # the unacknowledged ones that made it are now the truth
        maybe[:] = 0
    await client.close()


@pytest.mark.timeout(120)
async def test_partial_tensor_is_an_error(cora2, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        n = client.book.num_nodes
        await client.create_tensor("h", "node", [n, 3], "float32")
        await client.close()
        group.kill(1)
        group.restart(1)  # no state folder: partition 1 forgot "h"
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        with pytest.raises(PartialTensorError, match="partitions \\[0\\] only"):
            await client.create_tensor("h", "node", [n, 3], "float32")
        await client.close()
    finally:
        group.stop()


def training_loop(group: ServerGroup, *, shm: bool, kill_at: int | None, steps: int = 40) -> np.ndarray:
    """Pulls and push-adds of a fixed sequence; optionally kill -9 and restart a server mid-way."""

    async def run() -> np.ndarray:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=shm, reconnect_window=30.0)
        n = client.book.num_nodes
        assert client.local_partitions() == ([0, 1] if shm else [])
        first_store = client.partitions[0].store
        await client.create_tensor("w", "node", [n, 4], "float32")
        rng = np.random.default_rng(5)
        restarter: threading.Thread | None = None
        for step in range(steps):
            ids = rng.integers(0, n, 256)
            rows = await client.pull("w", ids)
            assert rows.shape == (256, 4)
            await client.push("w", ids, np.ones((256, 4), np.float32), op="add")
            if step == kill_at:
                group.kill(0, signal.SIGKILL)
                restarter = threading.Thread(target=lambda: (time.sleep(0.5), group.restart(0)))
                restarter.start()
        if restarter is not None:
            restarter.join()
            assert client.retries() >= 1
            if shm:  # re-attached to the new server's memory, not the dead one's
                part0 = client.partitions[0]
                assert part0.store is not None and part0.store is not first_store
        out = (await client.pull("w", np.arange(n))).numpy()
        await client.close()
        return out

    return asyncio.run(run())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shared-memory"])
def test_training_loop_rides_through_restart(cora2, tmp_path: Path, shm: bool) -> None:
    def servers(name: str) -> ServerGroup:
        args = ["--log-level", "WARNING", "--state-dir", str(tmp_path / name / "state"), "--wal"]
        return start_servers(cora2.part_config, tmp_path / name, num_parts=2, extra_args=args)

    group = servers("reference")
    try:
        reference = training_loop(group, shm=shm, kill_at=None)
    finally:
        group.stop()
    group = servers("restarted")
    try:
        restarted = training_loop(group, shm=shm, kill_at=15)
    finally:
        group.stop()
    assert reference.sum() == 40 * 256 * 4
    np.testing.assert_array_equal(restarted, reference)


@pytest.mark.timeout(120)
async def test_server_that_lost_its_state_is_refused(durable_servers: ServerGroup, tmp_path: Path) -> None:
    """The handshake carries the state epoch: a server back at an older epoch is not trusted."""
    group = durable_servers
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=20.0)
    n = client.book.num_nodes
    await client.create_tensor("h", "node", [n, 2], "float32")
    assert await client.snapshot() == 1
    await client.close()
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=20.0)
    assert client.connections[0].server_hello is not None
    assert client.connections[0].server_hello.epoch == 1
    instance = client.connections[0].server_hello.instance
    group.kill(0)
    shutil.rmtree(tmp_path / "state" / "part0")
    group.restart(0)
    with pytest.raises(ServerUnavailableError, match="lost state"):
        await client.pull("h", np.arange(5))
    await client.close()
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    assert client.connections[0].server_hello is not None
    assert client.connections[0].server_hello.instance != instance
    await client.close()


@pytest.mark.timeout(120)
async def test_retried_push_after_a_lost_reply_is_applied_once(cora2, tmp_path: Path) -> None:
    """The proxy tears the push's reply: the client reconnects and resends; the add counts once."""
    from fault_proxy import FaultProxy

    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        async with FaultProxy(group.addresses[0]) as proxy:
            client = await AsyncClient.connect(
                [proxy.address, group.addresses[1]], use_shared_memory=False, reconnect_window=10.0
            )
            n = client.book.num_nodes
            await client.create_tensor("c", "node", [n, 2], "float32")
            lo, hi = client.book.node_range(0)
            ids = np.arange(lo, hi)
            proxy.cut(after=1)  # the next reply from server 0 (the push's) is torn
            push = asyncio.ensure_future(client.push("c", ids, np.ones((ids.size, 2), np.float32), op="add"))
            for _ in range(5000):
                if proxy.cuts:
                    break
                await asyncio.sleep(0.001)
            proxy.cut_after = None  # let the reconnect through
            await push
            assert proxy.cuts >= 1 and client.retries() >= 1
            got = await client.pull_numpy("c", ids)
            np.testing.assert_array_equal(got, np.ones((ids.size, 2), np.float32))
            await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(120)
async def test_periodic_snapshot_restores_without_the_log(cora2, tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ["--log-level", "WARNING", "--state-dir", str(state), "--snapshot-interval", "0.3"]
    group = start_servers(cora2.part_config, tmp_path / "run", num_parts=2, extra_args=args)
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        n = client.book.num_nodes
        await client.create_tensor("p", "node", [n, 3], "int64")
        values = np.arange(n * 3, dtype=np.int64).reshape(n, 3)
        await client.push("p", np.arange(n), values)
        await client.close()
        for _ in range(200):
            if all(list((state / f"part{p}").glob("snap-*[0-9]")) for p in range(2)):
                break
            time.sleep(0.05)
        time.sleep(0.5)  # a snapshot in progress finishes (a later one finds nothing new)
        for p in range(2):
            group.kill(p)
            assert not list((state / f"part{p}").glob("wal-*"))  # no --wal: the snapshot holds it all
            group.restart(p)
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        np.testing.assert_array_equal(await client.pull_numpy("p", np.arange(n)), values)
        await client.close()
    finally:
        group.stop()


# --- a frozen server (SIGSTOP) -----------------------------------------------------------------
async def _freeze(group: ServerGroup, index: int, seconds: float) -> None:
    """SIGSTOP server ``index`` now and SIGCONT it ``seconds`` later (in a thread: it must not
    depend on the event loop the frozen calls are waiting on)."""
    pid = group.procs[index].pid
    os.kill(pid, signal.SIGSTOP)
    threading.Thread(target=lambda: (time.sleep(seconds), os.kill(pid, signal.SIGCONT)), daemon=True).start()


@pytest.mark.timeout(120)
async def test_a_short_freeze_mid_epoch_only_delays(cora2, tmp_path: Path) -> None:
    """SIGSTOP shorter than the call timeout: calls wait, nothing fails, results equal a run without it."""
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        results = []
        for freeze in (False, True):
            client = await AsyncClient.connect(group.addresses, use_shared_memory=False, call_timeout=20.0)
            n = client.book.num_nodes
            name = f"w{int(freeze)}"
            await client.create_tensor(name, "node", [n, 4], "float32")
            rng = np.random.default_rng(5)
            slowest = 0.0
            for step in range(30):
                if freeze and step == 10:
                    await _freeze(group, 0, 1.5)
                t0 = time.perf_counter()
                ids = rng.integers(0, n, 256)
                await client.pull(name, ids)
                await client.push(name, ids, np.ones((256, 4), np.float32), op="add")
                slowest = max(slowest, time.perf_counter() - t0)
            if freeze:
                assert slowest >= 1.0, "the freeze was not felt: the test did not test anything"
            results.append(await client.pull_numpy(name, np.arange(n)))
            await client.close()
        np.testing.assert_array_equal(results[1], results[0])
        assert results[0].sum() == 30 * 256 * 4
    finally:
        for i in range(2):
            os.kill(group.procs[i].pid, signal.SIGCONT)
        group.stop()


@pytest.mark.timeout(120)
async def test_a_long_freeze_is_a_timeout_naming_the_server_and_loses_nothing(cora2, tmp_path: Path) -> None:
    """SIGSTOP longer than the call timeout: the call fails typed and in time, the other server
    keeps serving, and once thawed the frozen one serves the data it had."""
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, call_timeout=1.0)
        n = client.book.num_nodes
        await client.create_tensor("v", "node", [n, 2], "int64")
        values = np.arange(2 * n, dtype=np.int64).reshape(n, 2)
        await client.push("v", np.arange(n), values)
        lo0, hi0 = client.book.node_range(0)
        lo1, hi1 = client.book.node_range(1)
        await _freeze(group, 0, 4.0)
        t0 = time.perf_counter()
        with pytest.raises(RequestTimeoutError, match=f"{group.addresses[0][1]}"):
            await client.pull_numpy("v", np.arange(lo0, hi0))
        assert time.perf_counter() - t0 < 3.5
        # the other partition is untouched by the freeze
        np.testing.assert_array_equal(await client.pull_numpy("v", np.arange(lo1, hi1)), values[lo1:hi1])
        await client.close()
        time.sleep(max(0.0, 4.5 - (time.perf_counter() - t0)))
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        np.testing.assert_array_equal(await client.pull_numpy("v", np.arange(n)), values)
        await client.close()
    finally:
        for i in range(2):
            os.kill(group.procs[i].pid, signal.SIGCONT)
        group.stop()


async def test_group_commit_one_fsync_serves_concurrent_writes(tmp_path: Path) -> None:
    """--wal-fsync always on a running loop: 50 pushes of one round share one fsync, and
    none is acknowledged (its awaitable done) before its record is on disk."""
    store = small_store()
    state = DurableState(tmp_path, 0, wal=True, fsync="always")
    handlers = RequestHandlers(store, num_clients=1, durable=state)
    state.restore(store, handlers.replay)
    created = handlers.ops[Op.CREATE_TENSOR](
        {"name": "node:emb", "policy": "node", "shape": [10, 2], "dtype": "float32"}
    )
    if inspect.isawaitable(created):
        await created
    wal = state.wal
    assert wal is not None
    fsyncs = wal.fsyncs
    push = {"name": "node:emb", "ids": np.array([3]), "values": np.ones((1, 2), np.float32), "op": "add"}
    pending = [handlers.ops[Op.PUSH]({**push, "rid": f"r{i}"}) for i in range(50)]
    assert all(inspect.isawaitable(p) for p in pending)
    assert wal.synced < wal.appended  # applied and logged, not yet on disk: not acknowledged
    await asyncio.gather(*pending)
    assert wal.synced == wal.appended
    assert wal.fsyncs - fsyncs == 1
    state.close()
    fresh = small_store()  # and the log holds all 50
    restarted = DurableState(tmp_path, 0, wal=True)
    restarted.restore(fresh, RequestHandlers(fresh, num_clients=1, durable=restarted).replay)
    assert fresh.local_rows("node:emb")[3].tolist() == [50.0, 50.0]
    restarted.close()
