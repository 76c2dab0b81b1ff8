"""Crash and disk-full points of the snapshot and write-ahead-log protocol (issue 32 section A).

Real server processes (Cora in one partition, ``--state-dir --wal``) are started with
``ASYNCGRAPH_FAILPOINTS`` naming a point; the server dies there (``os._exit``: what ``kill -9``
at that instant leaves) or fails there with ENOSPC, is restarted without it, the client resends
what it would resend (the same snapshot epoch, pushes with the same request ids), and the state
restored after a final ``kill -9`` must equal the acknowledged history exactly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import PartitionedGraph, _partition

from asyncgraph import failpoints
from asyncgraph.client import AsyncClient
from asyncgraph.errors import ServerUnavailableError, SnapshotFailedError, StorageFullError
from asyncgraph.protocol.ops import Op
from asyncgraph.testing import ServerGroup, start_servers


@pytest.fixture(scope="module")
def cora1(tmp_path_factory: pytest.TempPathFactory) -> PartitionedGraph:
    return _partition("cora", 1, tmp_path_factory.mktemp("cora1") / "out")


def serve(cora1: PartitionedGraph, tmp_path: Path, state: Path, points: str = "") -> ServerGroup:
    """One server over ``state`` with ``points`` as its failure points (restarts get none)."""
    args = ["--log-level", "WARNING", "--state-dir", str(state), "--wal"]
    os.environ[failpoints.ENV] = points
    try:
        return start_servers(cora1.part_config, tmp_path / "run", num_parts=1, extra_args=args)
    finally:
        del os.environ[failpoints.ENV]


@pytest.fixture
def no_failpoints_env() -> Iterator[None]:
    """Whatever a test sets in ``ASYNCGRAPH_FAILPOINTS`` is gone afterwards."""
    saved = os.environ.pop(failpoints.ENV, None)
    yield
    os.environ.pop(failpoints.ENV, None)
    if saved is not None:
        os.environ[failpoints.ENV] = saved


async def add_one(client: AsyncClient, k: int = 1) -> None:
    for _ in range(k):
        await client.push("acc", np.array([0]), np.ones((1, 1)), op="add")


async def value(group: ServerGroup) -> float:
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    try:
        return float((await client.pull_numpy("acc", np.array([0])))[0, 0])
    finally:
        await client.close()


def test_failpoint_spec_parses_and_refuses_unknown_points() -> None:
    try:
        failpoints.configure("wal.appended=2*off->enospc->crash; snapshot.begin=eio")
        assert failpoints.enabled
        failpoints.hit("wal.appended")
        failpoints.hit("wal.appended")
        with pytest.raises(OSError, match="No space left") as err:
            failpoints.hit("wal.appended")
        assert err.value.errno == 28
        with pytest.raises(OSError, match="Input/output error"):
            failpoints.hit("snapshot.begin")
        failpoints.hit("reply.push")  # not configured: nothing
        assert failpoints.hits["wal.appended"] == 3
        for bad in ("wal.nowhere=crash", "wal.appended=explode", "wal.appended=0*crash", "wal.appended"):
            with pytest.raises(failpoints.FailpointSpecError):
                failpoints.configure(bad)
    finally:
        failpoints.configure(None)
    assert not failpoints.enabled


@pytest.mark.timeout(180)
@pytest.mark.parametrize("crash", ["failpoint", "previous-release-layout"])
async def test_a_snapshot_resent_after_a_crash_mid_snapshot_applies_no_write_twice(
    cora1: PartitionedGraph, tmp_path: Path, crash: str, no_failpoints_env: None
) -> None:
    """Issue 32 A1, its exact scenario: add; snapshot 1; add; snapshot 2 killed while
    ``snap-2.tmp`` exists; restart; 5 adds; the client resends ``snapshot {"epoch": 2}``;
    2 adds; ``kill -9``; restart: 9 adds acknowledged, 9.0 restored (the old code gave 14.0).

    ``previous-release-layout``: the crash is a plain ``kill -9`` and the folder is then given
    what the previous release's unfinished snapshot left (an empty ``wal-2`` besides
    ``snap-2.tmp``): the restart must cope with it too."""
    state = tmp_path / "state"
    points = "snapshot.temp_synced=1*off->crash" if crash == "failpoint" else ""
    group = serve(cora1, tmp_path, state, points)
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        await client.create_tensor("acc", "node", [client.book.num_nodes, 1], "float64")
        await add_one(client)
        assert await client.snapshot() == 1
        await add_one(client)
        if crash == "failpoint":
            with pytest.raises(ServerUnavailableError):
                await client.snapshot()
            assert group.procs[0].wait(10) == failpoints.CRASH_EXIT
        else:
            group.kill(0)
            (state / "part0" / "snap-00000002.tmp").mkdir()
            (state / "part0" / "wal-00000002.log").touch()
        assert (state / "part0" / "snap-00000002.tmp").is_dir()
        await client.close()
        group.restart(0)
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        await add_one(client, 5)
        await client.connections[0].call(Op.SNAPSHOT, {"epoch": 2}, 30.0)  # the client's resend
        await add_one(client, 2)
        assert float((await client.pull_numpy("acc", np.array([0])))[0, 0]) == 9.0
        await client.close()
        group.kill(0)
        group.restart(0)
        assert await value(group) == 9.0
        assert not list((state / "part0").glob("*.tmp")), "the unfinished snapshot was not removed"
    finally:
        group.stop()


class Restarter(threading.Thread):
    """Restarts the server each time it dies, with the next failure point of ``points`` (then
    none), recording each death's exit status."""

    def __init__(self, group: ServerGroup, points: list[str]) -> None:
        super().__init__(daemon=True)
        self.group, self.points = group, list(points)
        self.exits: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                proc = self.group.procs[0]
                try:
                    code = proc.wait(0.1)
                except subprocess.TimeoutExpired:
                    continue
                if self.stop.is_set():
                    return
                self.exits.append(code)
                os.environ[failpoints.ENV] = self.points.pop(0) if self.points else ""
                self.group.restart(0)
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.timeout(420)
async def test_a_crash_at_every_failpoint_loses_and_doubles_no_acknowledged_write(
    cora1: PartitionedGraph, tmp_path: Path, no_failpoints_env: None
) -> None:
    """Issue 32 A1: the server crashes at each point of the snapshot and log protocol in turn
    (at its second hit, so some history precedes it; a hello at the first: the reconnect's),
    is restarted, and the clients, whose calls ride through (``reconnect_window``), resend;
    pushes of random adds and, from another client at the same time, snapshots go on until
    every point has crashed it once. In memory
    and after a last ``kill -9`` the tensor equals the sum of the acknowledged adds exactly."""
    # the second hit, but the first hello after a restart: the client's own reconnect
    points = [p for p in failpoints.POINTS if p not in failpoints.START_POINTS]  # hit by requests
    chain = [f"{p}=crash" if p == "reply.hello" else f"{p}=1*off->crash" for p in points]
    group = serve(cora1, tmp_path, tmp_path / "state", chain[0])
    restarter = Restarter(group, chain[1:])
    restarter.start()
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=60.0)
        snapper = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=60.0)
        n = client.book.num_nodes
        await client.create_tensor("acc", "node", [n, 2], "float64")
        expected = np.zeros((n, 2))
        rng = np.random.default_rng(3)

        async def pushes(k: int) -> None:
            for _ in range(k):
                ids = rng.integers(0, n, 16)
                vals = rng.integers(1, 5, (16, 2)).astype(np.float64)
                await client.push("acc", ids, vals, op="add")
                np.add.at(expected, ids, vals)

        for _ in range(150):
            if len(restarter.exits) == len(chain) or restarter.error is not None:
                break
            await pushes(2)
            # another client snapshots while this one pushes: after a crash mid-snapshot the
            # pushes may land before the snapshot is resent (issue 32's case)
            await asyncio.gather(snapper.snapshot(), pushes(4))
        assert restarter.error is None, restarter.error
        assert restarter.exits == [failpoints.CRASH_EXIT] * len(chain), "not every point crashed the server"
        assert client.retries() + snapper.retries() >= 1
        np.testing.assert_array_equal(await client.pull_numpy("acc", np.arange(n)), expected)
        await snapper.close()
        await client.close()
        restarter.stop.set()
        restarter.join(10)
        group.kill(0, signal.SIGKILL)
        group.restart(0)
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        np.testing.assert_array_equal(await client.pull_numpy("acc", np.arange(n)), expected)
        await client.close()
    finally:
        restarter.stop.set()
        group.stop()


async def snapshot_refused_then_taken(
    group: ServerGroup, state: Path, free: object, error: type[Exception] = StorageFullError
) -> None:
    """Snapshots fail with ``error`` and leave nothing; writes go on; ``free()`` makes room,
    the next snapshot is taken, and a ``kill -9`` restore has every write."""
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    await client.create_tensor("acc", "node", [client.book.num_nodes, 1], "float64")
    part = state / "part0"
    logs_before = sorted(p.name for p in part.glob("wal-*"))
    for attempt in range(4):
        await add_one(client)
        with pytest.raises(error, match="its partial files were removed") as err:
            await client.snapshot()
        assert isinstance(err.value, StorageFullError) == (error is StorageFullError)
        assert not list(part.glob("*.tmp")), f"attempt {attempt} left its temp folder"
        assert not list(part.glob("snap-*"))
        assert sorted(p.name for p in part.glob("wal-*")) == logs_before, "a new log was opened"
        infos = await client.connections[0].call(Op.INFO, {}, 10.0)
        assert int(infos["epoch"]) == 0, "the epoch advanced"
    assert callable(free)
    free()
    assert await client.snapshot() == 1
    await add_one(client, 2)
    await client.close()
    group.kill(0)
    group.restart(0)
    assert await value(group) == 6.0


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("point", "action"),
    [("snapshot.write_rows", "enospc"), ("snapshot.log_opened", "enospc"), ("snapshot.temp_synced", "eio")],
)
async def test_a_snapshot_that_hits_enospc_leaves_nothing_and_fails_typed(
    cora1: PartitionedGraph, tmp_path: Path, point: str, action: str, no_failpoints_env: None
) -> None:
    """Issue 32 A3 by failure point: four snapshots fail with ENOSPC while their rows are
    written, or once renamed into place, when their log is opened (then both are removed);
    an I/O error other than a full disk is a ``SnapshotFailedError``, not ``StorageFullError``."""
    state = tmp_path / "state"
    group = serve(cora1, tmp_path, state, f"{point}=4*{action}->off")
    error = StorageFullError if action == "enospc" else SnapshotFailedError
    try:
        await snapshot_refused_then_taken(group, state, lambda: None, error)
    finally:
        group.stop()


@pytest.mark.timeout(180)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
async def test_a_snapshot_on_a_full_tmpfs_leaves_nothing_and_fails_typed(
    cora1: PartitionedGraph, tmp_path: Path, no_failpoints_env: None
) -> None:
    """Issue 32 A3 on a real full disk: a 4 MiB tmpfs holds the log but not a snapshot (Cora's
    features alone are 15 MiB); once it is grown to 64 MiB the snapshot is taken."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state)], check=True)
    group = None
    try:
        group = serve(cora1, tmp_path, state)

        def grow() -> None:
            subprocess.run(["mount", "-o", "remount,size=64m", str(state)], check=True)

        await snapshot_refused_then_taken(group, state, grow)
    finally:
        if group is not None:
            group.stop()
        for _ in range(50):  # the server may take a moment to let go of its files
            if subprocess.run(["umount", str(state)], check=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(state)], check=False)


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak RSS from /proc")
async def test_a_log_much_larger_than_the_memory_it_may_take_replays(
    cora1: PartitionedGraph, tmp_path: Path, no_failpoints_env: None
) -> None:
    """Issue 32 A2: a 64 MiB log (12 adds of a 5.3 MiB tensor) replays record by record: the
    restarted server's peak RSS stays within 16 MiB of the same server restored from a snapshot
    of the same rows (reading the whole log, as before, took more than the log's size)."""
    state = str(tmp_path / "state")
    args = ["--log-level", "WARNING", "--state-dir", state, "--wal", "--wal-fsync", "interval"]
    group = start_servers(cora1.part_config, tmp_path / "run", num_parts=1, extra_args=args)
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        n = client.book.num_nodes
        await client.create_tensor("big", "node", [n, 512], "float32")
        ones = np.ones((n, 512), np.float32)
        for _ in range(12):
            await client.push("big", np.arange(n), ones, op="add")
        await client.close()
        log_mib = (tmp_path / "state" / "part0" / "wal-00000000.log").stat().st_size / 2**20
        assert log_mib >= 60
        group.kill(0)
        group.restart(0)
        replayed = peak_rss_mib(group.procs[0].pid)
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        got = await client.pull_numpy("big", np.arange(n))
        assert got.min() == got.max() == 12.0
        await client.snapshot()
        await client.close()
        group.kill(0)
        group.restart(0)
        from_snapshot = peak_rss_mib(group.procs[0].pid)
        assert replayed - from_snapshot < 16, (
            f"replaying a {log_mib:.0f} MiB log peaked at {replayed:.0f} MiB RSS, "
            f"restoring a snapshot of the same rows at {from_snapshot:.0f} MiB"
        )
    finally:
        group.stop()


@pytest.mark.timeout(180)
async def test_a_reconnect_refused_right_after_the_hello_keeps_trying(
    cora1: PartitionedGraph, tmp_path: Path
) -> None:
    """Found by the failure-point soak: a restarted server at its connection cap answers a
    reconnecting client's hello and then refuses it (``--max-connections``). The client used to
    take the hello as success and stay "open" over a closed session, every later call failing
    with ``ProtocolError``; it must go on reconnecting within its window and succeed once a
    connection is free."""
    state = str(tmp_path / "state")
    args = ["--log-level", "WARNING", "--state-dir", state, "--wal", "--max-connections", "1"]
    group = start_servers(cora1.part_config, tmp_path / "run", num_parts=1, extra_args=args)
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=60.0)
        await client.create_tensor("acc", "node", [client.book.num_nodes, 1], "float64")
        await add_one(client)
        group.kill(0)
        group.restart(0)
        other = await AsyncClient.connect(group.addresses, use_shared_memory=False)  # takes the cap

        async def free_later() -> None:
            await asyncio.sleep(1.5)
            await other.close()

        freeing = asyncio.ensure_future(free_later())
        await add_one(client, 2)  # reconnects: refused over the cap, then admitted
        await freeing
        assert client.retries() >= 1
        assert float((await client.pull_numpy("acc", np.array([0])))[0, 0]) == 3.0
        await client.close()
    finally:
        group.stop()
