"""Issue 32 B: only those who hold the secret, and only as themselves. Real server processes
(Cora, 2 partitions, a secret) on loopback; the attackers are real processes and sockets."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import AuthenticationError
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.ops import Op
from asyncgraph.testing import ServerGroup, start_servers, subprocess_env

SECRET = b"issue32-secret"
WORKERS = Path(__file__).parent / "workers"
T = 10.0


@pytest.fixture
def servers(cora2, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, secret=SECRET, extra_args=["--log-level", "INFO"]
    )
    yield group
    group.stop()


class Relay:
    """``tests/workers/relay.py``: a process without the secret listening on ``port``."""

    def __init__(self, port: int, mode: str, target: tuple[str, int] | None = None, part: int = 1) -> None:
        argv = [sys.executable, str(WORKERS / "relay.py"), str(port), mode]
        if target is not None:
            argv.append(f"{target[0]}:{target[1]}")
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, env={**subprocess_env(), "PART": str(part)}
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "listening"

    def report(self) -> dict[str, object]:
        """The relay's account of the next client connection it served."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the relay ended without a report"
        value: dict[str, object] = json.loads(line)
        return value

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# --- item 4: mutual authentication bound to the session ------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["pass", "rewrite"])
async def test_a_relay_on_a_dead_servers_port_gets_no_session(servers: ServerGroup, mode: str) -> None:
    """Server 1 dies; a process without the secret binds its port and relays server 0's hello
    (as is, or claiming partition 1) and the reconnecting trainer's answer to server 0. The
    trainer refuses (or server 0 does): the relay never gets a session, the trainer a typed error."""
    client = await AsyncClient.connect(
        servers.addresses, secret=SECRET, use_shared_memory=False, reconnect_window=5.0
    )
    relay = None
    try:
        n = client.book.num_nodes
        before = (await client.pull("node:feat", np.arange(n))).numpy()
        servers.kill(1, signal.SIGKILL)
        relay = Relay(servers.addresses[1][1], mode, target=servers.addresses[0], part=1)
        with pytest.raises(AuthenticationError):
            await client.pull("node:feat", np.arange(n))
        report = relay.report()
        assert report["session"] is False and report["answered"] is False
        # server 0 is untouched and still serves the trainer its rows
        end0 = client.book.node_range(0)[1]
        again = (await client.pull("node:feat", np.arange(end0))).numpy()
        np.testing.assert_array_equal(again, before[:end0])
    finally:
        await client.close()
        if relay is not None:
            relay.stop()
    if mode == "rewrite":
        assert "wrong secret" in servers.log_text(0)


@pytest.mark.timeout(60)
async def test_a_client_refuses_a_server_that_cannot_prove_the_secret(servers: ServerGroup) -> None:
    """A process on a server's port that answers the hello itself (it has no secret): the
    client fails with AuthenticationError and sends it no request."""
    conn = await Connection.open(
        *servers.addresses[1], graph_name="cora", secret=SECRET, reconnect_window=5.0
    )
    relay = None
    try:
        await conn.call(Op.PING, {}, T)
        servers.kill(1, signal.SIGKILL)
        relay = Relay(servers.addresses[1][1], "fake", part=1)
        with pytest.raises(AuthenticationError, match="did not prove"):
            await conn.call(Op.INFO, {}, T)
        assert relay.report()["requests_seen"] == 0
        with pytest.raises(AuthenticationError, match="did not prove"):  # a fresh client too
            await Connection.open(*servers.addresses[1], graph_name="cora", secret=SECRET, timeout=T)
        assert relay.report()["requests_seen"] == 0
    finally:
        conn.close()
        if relay is not None:
            relay.stop()


# --- item 6: a holder is bound to its connection -------------------------------------------------
@pytest.fixture
def two_clients(cora2, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        num_clients=2,
        secret=SECRET,
        extra_args=["--log-level", "INFO", "--max-connections-per-holder", "4"],
    )
    yield group
    group.stop()


async def _open(group: ServerGroup, holder: str | None) -> Connection:
    host, port = group.addresses[0]
    return await Connection.open(host, port, graph_name="cora", secret=SECRET, holder=holder, timeout=T)


@pytest.mark.timeout(90)
async def test_a_connection_acts_only_as_the_holder_its_hello_named(two_clients: ServerGroup) -> None:
    from asyncgraph.errors import HolderError, InvalidRequestError
    from asyncgraph.protocol.ops import BarrierArgs, CreateTensorArgs, ReleaseTensorsArgs

    victim, attacker, anonymous = (
        await _open(two_clients, "victim-0123"),
        await _open(two_clients, "attacker"),
        await _open(two_clients, None),
    )
    try:
        n = 2708  # Cora's nodes
        create = CreateTensorArgs("scratch", "node", [n, 1], "float32", None, "victim-0123").encode()
        await victim.call(Op.CREATE_TENSOR, create, T)
        # another's references cannot be released, by a named or an anonymous connection
        for conn in (attacker, anonymous):
            for release in (
                ReleaseTensorsArgs("victim-0123", [], True),
                ReleaseTensorsArgs("victim-0123", ["scratch"]),
            ):
                with pytest.raises(HolderError, match="may not act as holder 'victim-0123'"):
                    await conn.call(Op.RELEASE_TENSORS, release.encode(), T)
        # nor can a reference be taken in another's name
        other = CreateTensorArgs("scratch", "node", [n, 1], "float32", None, "victim-0123").encode()
        with pytest.raises(HolderError):
            await attacker.call(Op.CREATE_TENSOR, other, T)
        names = [m["name"] for m in await victim.call(Op.LIST_TENSORS, {}, T)]
        assert any(name.endswith("scratch") for name in names)
        # a victim's barrier arrival cannot be taken by naming its holder
        with pytest.raises(HolderError):
            await attacker.call(Op.BARRIER, BarrierArgs("b", 5.0, "victim-0123").encode(), T)
        # one connection is one client: without a holder and then with its own, it arrives once
        first = asyncio.ensure_future(attacker.call(Op.BARRIER, BarrierArgs("b", 2.0).encode(), T))
        await asyncio.sleep(0.2)
        with pytest.raises(InvalidRequestError, match="already arrived"):
            await attacker.call(Op.BARRIER, BarrierArgs("b", 2.0, "attacker").encode(), T)
        with pytest.raises(HolderError):  # an anonymous connection cannot pose as a holder
            await anonymous.call(Op.BARRIER, BarrierArgs("b", 2.0, "someone").encode(), T)
        from asyncgraph.errors import BarrierTimeoutError

        with pytest.raises(BarrierTimeoutError, match="1 of 2"):
            await first  # never released by one client
        # the victim releases its own reference: the tensor goes
        await victim.call(Op.RELEASE_TENSORS, ReleaseTensorsArgs("victim-0123", [], True).encode(), T)
        names = [m["name"] for m in await victim.call(Op.LIST_TENSORS, {}, T)]
        assert not any(name.endswith("scratch") for name in names)
    finally:
        for c in (victim, attacker, anonymous):
            c.close()


@pytest.mark.timeout(60)
async def test_holder_names_are_short_and_printable(two_clients: ServerGroup) -> None:
    from asyncgraph.errors import HolderError

    for holder in ['x\n@asyncgraph-agent {"ready": ["10.0.0.9", 1]}', "y" * 129, "", "tab\there"]:
        with pytest.raises(HolderError, match="holder name"):
            await _open(two_clients, holder)
    fine = await _open(two_clients, "ok-" + "z" * 125)  # 128 characters
    await fine.call(Op.PING, {}, T)
    fine.close()
    log = two_clients.log_text(0)
    assert "connection refused" in log
    assert not any(line.startswith("@asyncgraph-agent") for line in log.splitlines())


# --- item 7: read-only partition data is read-only in shared memory too ---------------------------
def _mprotect_writable(fd: int, nbytes: int) -> int:
    """Map ``fd`` read-only, then ask for write access to the mapping: mprotect's result (0: ok)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    c_int = ctypes.c_int
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, c_int, c_int, c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    addr = libc.mmap(None, nbytes, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    try:
        return int(libc.mprotect(addr, nbytes, mmap.PROT_READ | mmap.PROT_WRITE))
    finally:
        libc.munmap(addr, nbytes)


@pytest.mark.timeout(60)
async def test_a_co_located_client_cannot_write_read_only_partition_memory(servers: ServerGroup) -> None:
    """The descriptor a co-located client is sent for ``node:feat`` cannot be written through
    (mmap, mprotect, write(2)); TCP readers see the original rows. Since issue 34 it is the
    partition file itself, opened read-only (reopening it by /proc is opening the file by its
    path: its permissions decide); a memfd copy (``--copy-partition-data``) is sealed against
    that door too (``tests/test_serve_files.py``). A tensor made at run time stays writable
    through shared memory."""
    import mmap
    import os

    from asyncgraph.protocol.info import ServerInfo
    from asyncgraph.protocol.ops import CreateTensorArgs, PullArgs
    from asyncgraph.storage.fdpass import fetch_catalog

    conn = await Connection.open(*servers.addresses[0], graph_name="cora", secret=SECRET, timeout=T)
    fds: list[int] = []
    try:
        ids = np.arange(8)
        before = await conn.call(Op.PULL, PullArgs("node:feat", ids).encode(), T)
        info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, T))
        assert info.shm is not None
        create = CreateTensorArgs("emb", "node", [2708, 4], "float32").encode()
        await conn.call(Op.CREATE_TENSOR, create, T)
        desc, fds = await asyncio.to_thread(fetch_catalog, info.shm.address, info.shm.token, T)
        index = {t["meta"]["name"]: t["fd_index"] for t in desc["tensors"]}
        feat = fds[index["node:feat"]]
        size = os.fstat(feat).st_size
        with pytest.raises(PermissionError):
            mmap.mmap(feat, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.pwrite(feat, b"\xff" * 16, 0)
        assert _mprotect_writable(feat, size) != 0
        readable = mmap.mmap(feat, size, mmap.MAP_SHARED, mmap.PROT_READ)  # reading is fine
        offset = next(t["offset"] for t in desc["tensors"] if t["meta"]["name"] == "node:feat")
        assert readable[offset : offset + 16] == np.ascontiguousarray(before[0]).tobytes()[:16]
        readable.close()
        after = await conn.call(Op.PULL, PullArgs("node:feat", ids).encode(), T)
        np.testing.assert_array_equal(after, before)
        # a run-time tensor is writable through shared memory, as before
        emb = fds[index["emb"]]
        writable = mmap.mmap(emb, os.fstat(emb).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        writable[:4] = np.float32(2.5).tobytes()
        writable.close()
        row = await conn.call(Op.PULL, PullArgs("emb", np.array([0])).encode(), T)
        assert float(row[0, 0]) == 2.5
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


# --- item 5: a replica proves itself ------------------------------------------------------------------
@pytest.mark.timeout(120)
async def test_a_fake_replica_with_the_secret_is_not_listed(cora2, tmp_path: Path) -> None:
    """A process with the secret that answers the handshake and ``info`` as a replica (pid 1, or
    its own) is refused with ``ReplicaProofError``: it does not map the primary's memory (pid 1
    does not even listen on its port). A real replica (``num_servers=2``) is listed."""
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, num_servers=2, secret=SECRET,
        extra_args=["--log-level", "INFO"],
    )  # fmt: skip
    try:
        assert group.secret is not None
        secret_file = group.workdir / "secret"
        host, port = group.addresses[0]
        for pid_mode, why in (("one", "process 1 "), ("self", "does not map this primary's memory")):
            argv = [
                sys.executable, str(WORKERS / "fake_replica.py"), f"{host}:{port}", str(secret_file),
                str(cora2.part_config), pid_mode,
            ]  # fmt: skip
            out = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), timeout=60)
            report = json.loads(out.stdout.strip().splitlines()[-1])
            assert report["error"] == "replica_unproven", (report, out.stderr[-2000:])
            assert why in report["message"]
        conn = await Connection.open(host, port, graph_name="cora", secret=SECRET, timeout=T)
        from asyncgraph.protocol.info import ServerInfo

        info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, T))
        assert info.replicas == [group.bound[2][1]]  # only the real replica
        conn.close()
    finally:
        group.stop()
