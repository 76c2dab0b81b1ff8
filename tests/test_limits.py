"""Bounded work and memory before and after the handshake, against real servers (Cora, 2 parts)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.testing import ServerGroup, start_servers

SECRET = b"limits-secret"
MAX_PENDING = 4


@pytest.fixture(scope="module")
def servers(cora2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path_factory.mktemp("limits"),
        num_parts=2,
        secret=SECRET,
        extra_args=[
            "--log-level",
            "WARNING",
            "--handshake-timeout",
            "1",
            "--max-pending-connections",
            str(MAX_PENDING),
        ],
    )
    yield group
    group.stop()


def _raw(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    sock.settimeout(5)
    return sock


def _read_until_eof(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closed ``sock`` (reads and drops its hello)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            if not sock.recv(65536):
                return time.monotonic() - t0
        except ConnectionResetError:
            return time.monotonic() - t0
    raise AssertionError(f"socket still open after {limit} s")


def test_idle_socket_closed_after_handshake_timeout(servers: ServerGroup) -> None:
    with _raw(servers.addresses[0]) as sock:
        waited = _read_until_eof(sock, 4.0)
    assert 0.5 < waited < 4.0


def test_huge_frame_before_hello_refused_from_its_prefix(servers: ServerGroup) -> None:
    with _raw(servers.addresses[0]) as sock:
        sock.sendall(struct.pack(">I", 1 << 30))  # declares 1 GiB, sends nothing more
        waited = _read_until_eof(sock, 4.0)
    assert waited < 0.5  # refused at once, not at the handshake timeout
    assert "over the limit of 16384 bytes" in servers.log_text(0)


@pytest.mark.timeout(60)
async def test_pending_cap_while_authenticated_client_served(servers: ServerGroup) -> None:
    client = await AsyncClient.connect(servers.addresses, secret=SECRET, use_shared_memory=False)
    idle = [_raw(servers.addresses[0]) for _ in range(MAX_PENDING)]
    try:
        for sock in idle:  # each got its server hello: the server counts it as pending
            assert sock.recv(65536)
        with _raw(servers.addresses[0]) as extra:
            assert _read_until_eof(extra, 0.9) < 0.9  # over the cap: closed at once
        ids = np.arange(5, dtype=np.int64) + client.book.node_range(0)[0]
        rows = await client.pull_numpy("node:feat", ids)
        assert rows.shape[0] == 5
    finally:
        for sock in idle:
            sock.close()
        await client.close()
    await asyncio.sleep(0.1)  # the closed sockets leave the pending count; new clients get in
    again = await AsyncClient.connect(servers.addresses, secret=SECRET, use_shared_memory=False)
    await again.close()
