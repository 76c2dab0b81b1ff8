"""Issue 22, second red team: data that came back wrong or was lost, work one client made
unbounded. Real server processes (Cora, 2 partitions, a secret) on loopback, real ``kill -9``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    MemoryBudgetError,
    NonFiniteError,
    ReadOnlyTensorError,
    ServerUnavailableError,
    TooManyTensorsError,
)
from asyncgraph.protocol.ops import MAX_EPOCH, AddReplicaArgs, BarrierArgs, Op, PushArgs, SparseUpdateArgs
from asyncgraph.server.durable import MAX_EPOCH_STEP
from asyncgraph.testing import ServerGroup, start_servers

SECRET = b"issue22-secret"


@pytest.fixture
def wal_servers(cora2, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        secret=SECRET,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )
    yield group
    group.stop()


@pytest.fixture(scope="module")
def shared_servers(cora2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    """One pair of logged servers for the tests of this module that restart nothing."""
    tmp = tmp_path_factory.mktemp("abuse")
    group = start_servers(
        cora2.part_config,
        tmp / "run",
        num_parts=2,
        num_clients=2,
        secret=SECRET,
        extra_args=[
            "--log-level", "WARNING", "--state-dir", str(tmp / "state"), "--wal",
            "--snapshot-interval", "0.2",
        ],
    )  # fmt: skip
    yield group
    group.stop()


async def connect(group: ServerGroup) -> AsyncClient:
    return await AsyncClient.connect(group.addresses, secret=SECRET, use_shared_memory=False)


def record_offsets(path: Path) -> list[int]:
    """Start offsets of the records of a write-ahead log (crc32 + length-prefixed frame)."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        (body_len,) = struct.unpack_from(">I", data, pos + 4)
        pos += 8 + body_len
    return out


# --- item 3: a corrupt byte in the middle of the WAL ----------------------------------------------
@pytest.mark.timeout(120)
async def test_corrupt_wal_record_refuses_start_and_recover_keeps_the_rest(
    wal_servers: ServerGroup, tmp_path: Path
) -> None:
    group = wal_servers
    client = await connect(group)
    n = client.book.num_nodes
    lo, _ = client.book.node_range(0)
    await client.create_tensor("acc", "node", [n, 1], "float64")
    ids = lo + np.arange(10)
    for i in range(10):  # 10 acknowledged pushes, one row each
        await client.push("acc", ids[i : i + 1], np.full((1, 1), i + 1.0))
    await client.close()
    group.kill(0, signal.SIGKILL)

    wal = tmp_path / "state" / "part0" / "wal-00000000.log"
    offsets = record_offsets(wal)
    assert len(offsets) == 11  # the create, then the 10 pushes
    data = bytearray(wal.read_bytes())
    hit = offsets[5] + 40  # inside the 5th push's record (the 5 after it are intact)
    data[hit] ^= 0xFF
    wal.write_bytes(bytes(data))

    with pytest.raises(RuntimeError, match="corrupt at byte offset"):
        group.restart(0, timeout=30)
    text = group.log_text(0)
    assert str(wal) in text and f"offset {offsets[5]}" in text and "--wal-recover" in text
    assert wal.read_bytes() == bytes(data)  # the file is kept exactly as it was

    group.argvs[0].append("--wal-recover")
    group.restart(0)
    aside = list(wal.parent.glob("wal-00000000.log.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)  # moved aside, never deleted
    assert "skipped bytes" in group.log_text(0)
    client = await connect(group)
    got = (await client.pull("acc", ids)).numpy()[:, 0]
    expected = np.arange(1.0, 11.0)
    expected[4] = 0.0  # the one corrupt record (the 5th push) is the only write missing
    np.testing.assert_array_equal(got, expected)
    await client.close()


# --- item 5: NaN and inf gradients --------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["adagrad", "adam"])
async def test_non_finite_gradients_are_refused_and_change_nothing(
    shared_servers: ServerGroup, kind: str
) -> None:
    client = await connect(shared_servers)
    n = client.book.num_nodes
    name = f"emb_{kind}"
    init = {"kind": "uniform", "low": -1, "high": 1}
    await client.create_tensor(name, "node", [n, 4], "float32", init=init)
    spec = {"kind": kind, "lr": 0.1}
    ids = np.array([0, 5, n - 1])
    await client.sparse_update(name, ids, np.ones((3, 4), np.float32), spec)  # state exists now
    names = sorted(m.name for m in await client.refresh_tensors() if m.name.startswith(name))
    assert len(names) == (2 if kind == "adagrad" else 4)
    before = {m: (await client.pull(m, np.arange(n))).numpy().copy() for m in names}
    for bad in (np.nan, np.inf, -np.inf):
        grads = np.ones((3, 4), np.float32)
        grads[1, 2] = bad
        with pytest.raises(NonFiniteError, match="ID 5 is not finite"):
            await client.sparse_update(name, ids, grads, spec)
        # a client that skips the check: the server refuses too (raw request, no client checks)
        owner = client.partitions[int(client.book.nid2partid(np.array([5]))[0])]
        with pytest.raises(NonFiniteError, match="not finite"):
            await owner.conn.call(  # type: ignore[attr-defined]
                Op.SPARSE_UPDATE, SparseUpdateArgs(name, ids[1:2], grads[1:2], spec).encode(), 10.0
            )
    huge = np.full((3, 4), 3e38, np.float32)  # finite, but its square overflows float32
    with pytest.raises(NonFiniteError, match="overflows"):
        await client.sparse_update(name, ids, huge, spec)
    for m in names:
        np.testing.assert_array_equal((await client.pull(m, np.arange(n))).numpy(), before[m])
    await client.close()


# --- item 4: snapshots tied to what they describe -----------------------------------------------
@pytest.mark.timeout(120)
async def test_edited_manifest_falls_back_and_repartitioned_graph_is_refused(
    wal_servers: ServerGroup, cora2, tmp_path: Path
) -> None:
    group = wal_servers
    client = await connect(group)
    n = client.book.num_nodes
    labels = (await client.pull("node:label", np.arange(n))).numpy().copy()
    await client.create_tensor("acc", "node", [n, 1], "float64")
    await client.push("acc", np.arange(n), np.full((n, 1), 1.0))
    await client.snapshot()
    await client.push("acc", np.arange(n), np.full((n, 1), 2.0), op="add")
    epoch = await client.snapshot()
    await client.close()
    group.kill(0, signal.SIGKILL)

    # An edited dtype in the newest manifest (same byte size: int64 labels read as float64).
    manifest = tmp_path / "state" / "part0" / f"snap-{epoch:08d}" / "manifest.json"
    text = manifest.read_text()
    doc = json.loads(text)
    entry = next(e for e in doc["tensors"] if e["name"].endswith("label"))
    assert entry["dtype"] == "int64"
    entry["dtype"] = "float64"
    manifest.write_text(json.dumps(doc))
    group.restart(0)
    assert "does not match its checksum" in group.log_text(0)  # skipped, the older one used
    client = await connect(group)
    got = (await client.pull("node:label", np.arange(n))).numpy()
    assert got.dtype == labels.dtype
    np.testing.assert_array_equal(got, labels)
    np.testing.assert_array_equal((await client.pull("acc", np.arange(n))).numpy(), np.full((n, 1), 3.0))
    await client.close()
    group.kill(0, signal.SIGKILL)

    # The same graph name partitioned again (another method): its state is refused, naming both.
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    graph = Graph.from_npz(Path(__file__).resolve().parent.parent / "examples" / "data" / "cora.npz")
    partition_graph(graph, "cora", 2, tmp_path / "again", part_method="random")
    argv = group.argvs[0]
    argv[argv.index("--part-config") + 1] = str(tmp_path / "again" / "cora.json")
    with pytest.raises(RuntimeError, match="fingerprint"):
        group.restart(0, timeout=30)
    text = group.log_text(0)
    assert str(cora2.part_config) in text and str(tmp_path / "again" / "cora.json") in text


# --- item 8: epochs from clients are bounded --------------------------------------------------------
@pytest.mark.timeout(120)
async def test_epoch_overflow_is_refused_and_handshakes_keep_working(shared_servers: ServerGroup) -> None:
    client = await connect(shared_servers)
    server = client.partitions[0]
    current = int((await client.info(0))["epoch"])
    for bad in (2**64 - 1, 2**63, MAX_EPOCH + 1, current + MAX_EPOCH_STEP + 1):
        with pytest.raises(InvalidRequestError, match="epoch"):
            await server.conn.call(Op.SNAPSHOT, {"epoch": bad}, 10.0)  # type: ignore[attr-defined]
    n = client.book.num_nodes
    await client.create_tensor("ep", "node", [n, 1], "float32")
    await client.push("ep", np.arange(n), np.ones((n, 1), np.float32))
    await asyncio.sleep(0.8)  # --snapshot-interval 0.2: the periodic snapshot runs after the write
    await client.close()
    for _ in range(3):  # new handshakes still work, and so does a job-wide snapshot
        again = await connect(shared_servers)
        assert await again.snapshot() > current
        await again.close()
    for i in range(2):
        assert "Traceback" not in shared_servers.log_text(i)


# --- item 12: barriers count distinct clients ---------------------------------------------------
@pytest.mark.timeout(60)
async def test_barrier_counts_distinct_clients_not_calls(shared_servers: ServerGroup) -> None:
    """Servers expect 2 clients (--num-clients 2)."""
    a, b, c = [await connect(shared_servers) for _ in range(3)]
    first = asyncio.ensure_future(a.barrier("twice", timeout=20))
    await asyncio.sleep(0.2)
    with pytest.raises(InvalidRequestError, match="already arrived"):
        await a.barrier("twice", timeout=20)  # the same client again: an error, not a release
    # one connection posing as another client is refused too
    with pytest.raises(InvalidRequestError, match="one connection is one client"):
        await a.connections[0].call(Op.BARRIER, BarrierArgs("twice", 20.0, "someone-else").encode(), 30.0)
    await asyncio.sleep(0.3)
    assert not first.done()
    await b.barrier("twice", timeout=20)  # the second client releases it
    await asyncio.wait_for(first, 5)

    # an arrival whose client goes away is withdrawn: it does not help release the next round
    gone = asyncio.ensure_future(c.barrier("left", timeout=20))
    await asyncio.sleep(0.2)
    await c.close()
    with pytest.raises((ServerUnavailableError, asyncio.CancelledError)):
        await gone
    await asyncio.sleep(0.3)  # the server sees the connection go
    alone = asyncio.ensure_future(a.barrier("left", timeout=20))
    await asyncio.sleep(0.3)
    assert not alone.done()
    await b.barrier("left", timeout=20)
    await asyncio.wait_for(alone, 5)
    await a.close()
    await b.close()


# --- item 6: the partition's own data ------------------------------------------------------------
def _digest(rows: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shm", [False, True])
async def test_partition_tensors_are_read_only_and_never_deleted(
    shared_servers: ServerGroup, shm: bool
) -> None:
    client = await AsyncClient.connect(shared_servers.addresses, secret=SECRET, use_shared_memory=shm)
    n = client.book.num_nodes
    ids = np.arange(n)
    before = {k: _digest((await client.pull(k, ids)).numpy()) for k in ("node:feat", "node:label")}
    count = len(await client.refresh_tensors())
    feat_dim = (await client.tensor_meta("node:feat")).shape[1]
    with pytest.raises(ReadOnlyTensorError, match="read-only"):
        await client.push("node:feat", ids[:3], np.zeros((3, feat_dim), np.float32))
    with pytest.raises(ReadOnlyTensorError, match="cannot be deleted"):
        await client.delete_tensor("node:label")
    with pytest.raises(ReadOnlyTensorError, match="embeddings"):
        await client.sparse_update(
            "node:feat", ids[:3], np.ones((3, feat_dim), np.float32), {"kind": "adam", "lr": 1}
        )
    with pytest.raises(ReadOnlyTensorError, match="optimizer state"):
        await client.create_tensor("node:feat#adagrad_state", "node", [n, feat_dim], "float32")
    # optimizer state is for embeddings only, never state for state
    await client.create_tensor(f"emb{shm}", "node", [n, 2], "float32")
    await client.sparse_update(
        f"emb{shm}", ids[:3], np.ones((3, 2), np.float32), {"kind": "adagrad", "lr": 1}
    )
    with pytest.raises(ReadOnlyTensorError, match="optimizer state"):
        await client.sparse_update(
            f"emb{shm}#adagrad_state", ids[:3], np.ones((3, 2), np.float32), {"kind": "adagrad", "lr": 1}
        )
    assert len(await client.refresh_tensors()) == count + 2  # the embedding and its one state tensor
    after = {k: _digest((await client.pull(k, ids)).numpy()) for k in ("node:feat", "node:label")}
    assert after == before
    await client.close()


@pytest.mark.timeout(60)
async def test_writable_partition_data_is_an_option(cora2, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config,
        tmp_path,
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--writable-partition-data"],
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        feat_dim = (await client.tensor_meta("node:feat")).shape[1]
        await client.push("node:feat", np.array([0, 7]), np.full((2, feat_dim), 3.0, np.float32))
        assert (await client.pull("node:feat", np.array([0, 7]))).numpy().tolist() == [[3.0] * feat_dim] * 2
        with pytest.raises(ReadOnlyTensorError, match="cannot be deleted"):
            await client.delete_tensor("node:feat")
        await client.close()
    finally:
        group.stop()


# --- item 14: the metrics port --------------------------------------------------------------------
def _http(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.timeout(90)
def test_metrics_endpoint_is_bound_bounded_and_token_protected(cora2, tmp_path: Path) -> None:
    token = tmp_path / "metrics-token"
    token.write_text("s3cret-token\n")
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "INFO", "--metrics-port", "0", "--metrics-token-file", str(token)],
    )
    try:
        port = json.loads((tmp_path / "run" / "ready0.json").read_text())["metrics_port"]
        assert f"metrics on http://127.0.0.1:{port}/metrics" in group.log_text(0)  # where the server binds
        get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
        assert _http(port, get + b"\r\n").startswith(b"HTTP/1.1 401")  # no tensor names for anyone
        assert _http(port, get + b"Authorization: Bearer wrong\r\n\r\n").startswith(b"HTTP/1.1 401")
        ok = _http(port, get + b"Authorization: Bearer s3cret-token\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200") and b"asyncgraph_tensor_bytes" in ok

        proc = psutil.Process(group.procs[0].pid)
        # slow clients: at most 16 held, the others closed at once, the held ones after 5 s
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
        time.sleep(1.0)
        closed = 0
        for s in idle:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 24, closed
        threads = proc.num_threads()
        time.sleep(4.8)  # the held ones time out (and the sampler's kernel has loaded meanwhile)
        dropped = 0
        for s in idle:
            try:
                dropped += s.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionResetError:
                dropped += 1
            s.close()
        assert dropped == 40, dropped  # the server hung up on every silent client
        assert proc.num_threads() <= threads + 3  # no thread per connection (a worker may start)
        rss0 = proc.memory_info().rss
        # huge headers: refused at the limit, nothing kept
        for _ in range(10):
            try:
                reply = _http(port, get + b"X-Junk: " + b"a" * (4 << 20) + b"\r\n\r\n")
            except (ConnectionResetError, BrokenPipeError):
                continue  # answered 431 and closed while we were still sending
            assert reply == b"" or reply.startswith(b"HTTP/1.1 431")
        ok = _http(port, get + b"Authorization: Bearer s3cret-token\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")
        assert proc.memory_info().rss - rss0 < 32 << 20  # 40 MB of headers were never buffered
    finally:
        group.stop()


# --- item 13: add_replica only for a proven replica ----------------------------------------------
@pytest.mark.timeout(60)
async def test_add_replica_needs_the_fingerprint_and_a_reachable_replica(
    shared_servers: ServerGroup, cora2
) -> None:
    from asyncgraph.server.durable import partition_fingerprint

    client = await connect(shared_servers)
    conn = client.partitions[0].conn  # type: ignore[attr-defined]
    right = partition_fingerprint(cora2.part_config, 0)
    other_server = shared_servers.addresses[1][1]  # a primary, not a replica of partition 0
    for port, pid, fingerprint, why in (
        (9, 1, "", "fingerprint"),  # the red team's request
        (9, 1, right, "not reachable"),
        (other_server, shared_servers.procs[1].pid, right, "not a replica"),
        (
            other_server,
            shared_servers.procs[1].pid,
            partition_fingerprint(cora2.part_config, 1),
            "fingerprint",
        ),
    ):
        with pytest.raises(InvalidRequestError, match=why):
            await conn.call(Op.ADD_REPLICA, AddReplicaArgs(port, pid, fingerprint).encode(), 30.0)
    assert (await client.info(0))["replicas"] == []  # nothing listed to clients
    await client.close()


# --- item 9: tensors per server ------------------------------------------------------------------
@pytest.mark.timeout(120)
async def test_tensor_count_is_capped_and_the_state_restores(cora2, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        secret=SECRET,
        extra_args=[
            "--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal", "--max-tensors", "40",
        ],
    )  # fmt: skip
    try:
        client = await connect(group)
        n = client.book.num_nodes
        base = len(await client.refresh_tensors())  # the partition's own: feat, label, masks
        for i in range(40 - base):
            await client.create_tensor(f"tiny{i}", "node", [n], "int8")
        with pytest.raises(TooManyTensorsError, match="--max-tensors 40"):
            await client.create_tensor("one_too_many", "node", [n], "int8")
        assert len(await client.refresh_tensors()) == 40  # refused everywhere, nothing half-made
        await client.snapshot()
        with pytest.raises(TooManyTensorsError):  # the cap holds after a snapshot too
            await client.create_tensor("after", "node", [n], "int8")
    finally:
        await client.close()
    try:
        fds = psutil.Process(group.procs[0].pid).num_fds()
        assert fds < 40 + 64, fds  # one descriptor a tensor, a few dozen besides
        group.kill(0, signal.SIGKILL)
        group.restart(0)  # the accepted state restores
        client = await connect(group)
        assert len(await client.refresh_tensors()) == 40
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(120)
async def test_a_state_restores_with_one_descriptor_per_tensor(cora2, tmp_path: Path) -> None:
    """Issue 22 item 9: each tensor holds one descriptor, so a server killed with many tensors
    restarts from its --state-dir under a descriptor limit that fits one per tensor, not two."""
    count = 300
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        secret=SECRET,
        extra_args=[
            "--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal",
            "--max-tensors", "1000",
        ],
    )  # fmt: skip
    try:
        client = await connect(group)
        base = psutil.Process(group.procs[0].pid).num_fds()
        n = client.book.num_nodes
        await asyncio.gather(*(client.create_tensor(f"tiny{i}", "node", [n], "int8") for i in range(count)))
        await client.push("tiny7", np.arange(5), np.full(5, 3, np.int8))
        await client.close()
        held = psutil.Process(group.procs[0].pid).num_fds() - base
        # base counted the client's connection, which the server may or may not have closed yet
        assert count - 1 <= held < count + 16, held
        limit = base + count + 64  # one descriptor a tensor fits; two (base + 600) would not
        group.kill(0, signal.SIGKILL)
        group.argvs[0] = ["/bin/sh", "-c", f'ulimit -n {limit} && exec "$@"', "sh", *group.argvs[0]]
        group.restart(0)
        assert psutil.Process(group.procs[0].pid).rlimit(psutil.RLIMIT_NOFILE) == (limit, limit)
        client = await connect(group)  # new connections work too
        assert len([m for m in await client.refresh_tensors() if "tiny" in m.name]) == count
        np.testing.assert_array_equal((await client.pull("tiny7", np.arange(6))).numpy(), [3, 3, 3, 3, 3, 0])
        await client.close()
    finally:
        group.stop()


# --- item 11: connections per server, IDs as int32/int64 ------------------------------------------
@pytest.mark.timeout(60)
async def test_connections_are_capped_and_ids_are_int32_or_int64(cora2, tmp_path: Path) -> None:
    from asyncgraph.net.connection import Connection

    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        secret=SECRET,
        extra_args=["--log-level", "WARNING", "--max-connections", "3"],
    )
    host, port = group.addresses[0]

    async def open_one() -> Connection:
        return await Connection.open(host, port, graph_name="cora", secret=SECRET)

    try:
        held = [await open_one() for _ in range(3)]
        for c in held:
            await c.call(Op.PING, {}, 10.0)
        extra = await open_one()  # the handshake completes, then the server says why it hangs up
        with pytest.raises(ServerUnavailableError, match="--max-connections 3"):
            await extra.call(Op.PING, {}, 10.0)
        extra.close()
        held.pop().close()
        await asyncio.sleep(0.3)
        again = await open_one()  # a slot was freed
        await again.call(Op.PING, {}, 10.0)
        # IDs are int32 or int64: 64 KB of uint16 IDs no longer asks for a huge reply
        with pytest.raises(DTypeMismatchError, match="int32 or int64"):
            await again.call(Op.PULL, {"name": "node:feat", "ids": np.zeros(32768, np.uint16)}, 10.0)
        rows = await again.call(Op.PULL, {"name": "node:feat", "ids": np.zeros(4, np.int32)}, 10.0)
        assert len(rows) == 4
        for c in [*held, again]:
            c.close()
    finally:
        group.stop()


@pytest.mark.timeout(60)
async def test_connections_are_capped_per_holder(cora2, tmp_path: Path) -> None:
    """Item 11, the rest: a cap per holder (the one a client names in its hello); connections
    naming none share one anonymous count under the same cap."""
    from asyncgraph.net.connection import Connection

    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        secret=SECRET,
        extra_args=["--log-level", "WARNING", "--max-connections-per-holder", "2"],
    )
    host, port = group.addresses[0]

    async def open_one(holder: str | None) -> Connection:
        conn = await Connection.open(host, port, graph_name="cora", secret=SECRET, holder=holder)
        opened.append(conn)
        return conn

    opened: list[Connection] = []
    try:
        mine = [await open_one("trainer-a") for _ in range(2)]
        for c in mine:
            await c.call(Op.PING, {}, 10.0)
        extra = await open_one("trainer-a")
        per_holder = r"--max-connections-per-holder 2"
        with pytest.raises(ServerUnavailableError, match=rf"holder 'trainer-a' .*{per_holder}"):
            await extra.call(Op.PING, {}, 10.0)
        await (await open_one("trainer-b")).call(Op.PING, {}, 10.0)  # another holder is served
        mine[0].close()
        await asyncio.sleep(0.3)
        await (await open_one("trainer-a")).call(Op.PING, {}, 10.0)  # a slot was freed
        # no holder: one shared anonymous count, capped the same
        for c in [await open_one(None) for _ in range(2)]:
            await c.call(Op.PING, {}, 10.0)
        anonymous = await open_one(None)
        with pytest.raises(ServerUnavailableError, match=rf"without a holder .*{per_holder}"):
            await anonymous.call(Op.PING, {}, 10.0)
        # AsyncClient names its holder on every connection: one here, one more fits, not two
        client = await AsyncClient.connect(group.addresses, secret=SECRET, use_shared_memory=False)
        try:
            await (await open_one(client.holder)).call(Op.PING, {}, 10.0)
            with pytest.raises(ServerUnavailableError, match=rf"holder '{client.holder}' .*{per_holder}"):
                await (await open_one(client.holder)).call(Op.PING, {}, 10.0)
            assert len(await client.refresh_tensors()) > 0  # the client itself is unaffected
        finally:
            await client.close()
    finally:
        for c in opened:
            c.close()
        group.stop()


# --- item 7: a replica never acknowledges a write after its primary died -----------------------
@pytest.mark.timeout(90)
async def test_replica_refuses_pushes_once_its_primary_is_dead(cora2, tmp_path: Path) -> None:
    from asyncgraph.net.connection import Connection

    group = start_servers(
        cora2.part_config, tmp_path, num_parts=2, num_servers=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, use_replicas=False)
        n = client.book.num_nodes
        await client.create_tensor("r", "node", [n, 1], "float32")
        await client.close()
        host, port = group.bound[2]  # the replica of partition 0
        replica = await Connection.open(host, port, graph_name="cora")
        push = PushArgs("r", np.array([1]), np.ones((1, 1), np.float32)).encode()
        await replica.call(Op.PUSH, push, 10.0)  # acknowledged while the primary lives
        group.kill(0, signal.SIGKILL)
        with pytest.raises(ServerUnavailableError, match="is gone"):
            await replica.call(Op.PUSH, push, 10.0)  # at once, not after the replica's watch notices
        replica.close()
    finally:
        group.stop()


# --- item 2: holders that vanish ---------------------------------------------------------------------
TRAINER = """
import asyncio, sys, time
from asyncgraph.client import AsyncClient

async def main():
    client = await AsyncClient.connect(
        [(h, int(p)) for h, p in (a.split(":") for a in sys.argv[1:])], use_shared_memory=False
    )
    n = client.book.num_nodes
    await client.create_tensor_parts("scratch", "node", [n, 2], "float32", persistent=False)
    print("created", flush=True)
    time.sleep(60)

asyncio.run(main())
"""


async def _names(group: ServerGroup) -> set[str]:
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    try:
        return {m.name for m in await client.refresh_tensors()}
    finally:
        await client.close()


@pytest.mark.timeout(90)
async def test_async_close_releases_and_a_killed_trainers_lease_expires(cora2, tmp_path: Path) -> None:
    import subprocess
    import sys

    from asyncgraph.testing import subprocess_env

    group = start_servers(
        cora2.part_config, tmp_path, num_parts=2, extra_args=["--log-level", "INFO", "--holder-lease", "1.5"]
    )
    try:
        # AsyncClient.close() releases what the client holds (only the sync Client.close did)
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        await client.create_tensor_parts(
            "mine", "node", [client.book.num_nodes, 2], "float32", persistent=False
        )
        assert "mine" in await _names(group)
        await client.close()
        assert "mine" not in await _names(group)

        # a trainer killed with SIGKILL: its references go once its lease expires
        argv = [sys.executable, "-c", TRAINER, *(f"{h}:{p}" for h, p in group.addresses)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=subprocess_env())
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"created"
            assert "scratch" in await _names(group)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        await asyncio.sleep(0.5)
        assert "scratch" in await _names(group)  # within the lease: kept (the trainer may reconnect)
        await asyncio.sleep(2.5)
        assert "scratch" not in await _names(group)
        assert "references released" in group.log_text(0)

        # a client whose connection drops (the server stays) and that only reads keeps its lease:
        # it presents its holder again on the new connection
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=10.0)
        n = client.book.num_nodes
        await client.create_tensor_parts("kept", "node", [n, 2], "float32", persistent=False)
        for conn in client.connections:
            conn._transport.abort()  # type: ignore[attr-defined]  # a network drop
        await asyncio.sleep(0.2)
        await client.pull_numpy("kept", np.arange(n))  # reconnects
        await asyncio.sleep(2.5)  # longer than the lease
        assert "kept" in await _names(group)
        await client.close()
    finally:
        group.stop()


# --- item 10: one memory budget per server; inits in bounded pieces ----------------------------
def test_init_draws_in_bounded_pieces_with_the_same_values() -> None:
    import tracemalloc

    from asyncgraph.storage.initializers import INIT_BLOCK_ROWS, fill_init, validate_init

    for kind in ("uniform", "normal"):
        spec = validate_init({"kind": kind, "seed": 3}, np.dtype("float16"))
        rows = np.zeros((INIT_BLOCK_ROWS + 700, 300), np.float16)
        fill_init(rows[:1234], spec, 0)  # any split of the rows gives the same tensor
        fill_init(rows[1234:], spec, 1234)
        for block in range(2):  # what one draw per block (the previous code) gave
            rng = np.random.default_rng([3, block])
            b0, b1 = block * INIT_BLOCK_ROWS, min((block + 1) * INIT_BLOCK_ROWS, rows.shape[0])
            size = (b1 - b0, 300)
            ref = rng.uniform(0.0, 1.0, size) if kind == "uniform" else rng.normal(0.0, 1.0, size)
            np.testing.assert_array_equal(rows[b0:b1], ref.astype(np.float16))
    out = np.zeros((4096, 4096), np.float16)  # 32 MiB
    tracemalloc.start()
    try:
        fill_init(out, validate_init({"kind": "uniform"}, np.dtype("float16")), 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= out.nbytes, peak / out.nbytes  # was 4x: a whole block drawn as float64


@pytest.mark.timeout(60)
async def test_tensors_share_one_memory_budget_per_server(cora2, tmp_path: Path) -> None:
    from asyncgraph.server.budget import memory_budget

    group = start_servers(cora2.part_config, tmp_path, num_parts=2, extra_args=["--log-level", "WARNING"])
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        n = client.book.num_nodes
        per_row = 4 * (n // 2 + 1)  # float32 bytes a column takes on one partition
        cols = int(0.6 * memory_budget()) // per_row
        # zeros: memfd pages never touched, so each was accepted at once (the limit was per tensor)
        await client.create_tensor("big1", "node", [n, cols], "float32")
        with pytest.raises(MemoryBudgetError, match="--memory-budget"):
            await client.create_tensor("big2", "node", [n, cols], "float32")
        assert "big2" not in {m.name for m in await client.refresh_tensors()}
        await client.delete_tensor("big1")
        await client.create_tensor("big2", "node", [n, cols], "float32")  # the budget is free again
        await client.close()
    finally:
        group.stop()


# --- item 11: one budget for reply bytes nobody reads ------------------------------------------------
@pytest.mark.timeout(90)
async def test_clients_that_never_read_share_one_reply_budget(cora2, tmp_path: Path) -> None:
    from asyncgraph.protocol import ClientSession

    group = start_servers(
        cora2.part_config,
        tmp_path,
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--max-queued-reply-bytes", str(8 << 20)],
    )
    socks = []
    try:
        proc = psutil.Process(group.procs[0].pid)
        time.sleep(3.0)  # the sampler's compiled kernel loads in the background after start
        rss0 = proc.memory_info().rss
        for _ in range(4):  # each asks for ~200 MB of replies and never reads them
            sock = socket.create_connection(group.addresses[0], timeout=30)
            session = ClientSession(graph_name=None, secret=None)
            while session.state.value != "ready":
                buf = session.get_buffer(1 << 16)
                session.buffer_updated(sock.recv_into(buf))
                out = session.data_to_send()
                if out:
                    sock.sendall(b"".join(bytes(p) for p in out))
            sock.setblocking(False)
            for _ in range(60):
                _, pieces = session.send_request("pull", {"name": "node:feat", "ids": np.arange(600)})
                try:
                    sock.sendall(b"".join(bytes(p) for p in pieces))
                except BlockingIOError:
                    break  # the server stopped reading us: what the budget is for
            socks.append(sock)
        await asyncio.sleep(1.0)
        growth = proc.memory_info().rss - rss0
        assert growth < 64 << 20, growth >> 20  # without the budget: 4 x 64 MiB queued
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        t0 = time.monotonic()
        rows = await client.pull_numpy("node:feat", np.arange(10))  # others are still served
        assert rows.shape[0] == 10 and time.monotonic() - t0 < 5.0
        await client.close()
    finally:
        for sock in socks:
            sock.close()
        group.stop()


# --- item 14: freed memory goes back to the OS ------------------------------------------------------
@pytest.mark.timeout(60)
async def test_an_idle_server_returns_freed_memory(shared_servers: ServerGroup) -> None:
    client = await connect(shared_servers)
    n = client.book.num_nodes
    proc = psutil.Process(shared_servers.procs[0].pid)
    ids = np.tile(np.arange(n // 2), 8)  # ~60 MB replies from server 0, freed once sent
    for _ in range(3):
        await client.pull_numpy("node:feat", ids)
    busy = proc.memory_info().rss
    await asyncio.sleep(5.0)  # idle for over 2 s: the server trims its heap
    idle = proc.memory_info().rss
    await client.close()
    assert idle < busy - (20 << 20), (busy >> 20, idle >> 20)  # was kept (up to 1 GiB per arena)
