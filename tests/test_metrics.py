"""Prometheus metrics and connection logs of a real server: scrape, parse, check they moved."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncgraph.client import AsyncClient
from asyncgraph.errors import AuthenticationError, UnknownTensorError
from asyncgraph.testing import ServerGroup, start_servers


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``(sample name, sorted labels) -> value`` of every sample at ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def start_metered(part_config: Path, workdir: Path, num_parts: int) -> tuple[ServerGroup, int]:
    """Servers with ``/metrics`` on a free loopback port; the group and server 0's metrics port."""
    group = start_servers(
        part_config,
        workdir,
        num_parts=num_parts,
        # a test pushes into node:feat (the partition's own data is read-only by default)
        extra_args=["--metrics-port", "0", "--metrics-host", "127.0.0.1", "--writable-partition-data"],
    )
    return group, json.loads((workdir / "ready0.json").read_text())["metrics_port"]


async def wait_for_log(group: ServerGroup, index: int, needle: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = group.log_text(index)
        if needle in text:
            return text
        await asyncio.sleep(0.05)  # the client's loop must run for its socket to close
    raise AssertionError(f"{needle!r} not in server log:\n{group.log_text(index)}")


async def test_metrics_move_with_requests(cora2, tmp_path: Path) -> None:
    group, port = start_metered(cora2.part_config, tmp_path / "srv", 2)
    try:
        assert isinstance(port, int) and port > 0
        assert f"metrics on http://127.0.0.1:{port}/metrics" in group.log_text(0)
        before = scrape(port)
        assert before[("asyncgraph_connections_open", ())] == 0
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        ids = np.arange(5)  # partition 0 owns the first node IDs
        for _ in range(3):
            await client.pull_numpy("node:feat", ids)
        await client.push("node:feat", ids[:4], np.zeros((4, 1433), dtype=np.float32))
        with pytest.raises(UnknownTensorError):
            await client.pull_numpy("node:nope", ids)
        after = scrape(port)
        assert after[("asyncgraph_connections_open", ())] == 1
        assert after[("asyncgraph_connections_total", ())] == 1
        assert after[("asyncgraph_requests_total", (("op", "pull"), ("outcome", "ok")))] == 3
        assert after[("asyncgraph_requests_total", (("op", "push"), ("outcome", "ok")))] == 1
        assert after[("asyncgraph_requests_total", (("op", "info"), ("outcome", "ok")))] == 1
        assert after[("asyncgraph_rows_total", (("direction", "out"),))] == 15
        assert after[("asyncgraph_rows_total", (("direction", "in"),))] == 4
        assert after[("asyncgraph_request_seconds_count", (("op", "pull"),))] >= 3
        pulled = 15 * 1433 * 4
        assert after[("asyncgraph_bytes_total", (("direction", "out"),))] > pulled
        assert after[("asyncgraph_bytes_total", (("direction", "in"),))] > 4 * 1433 * 4
        assert after[("asyncgraph_request_seconds_bucket", (("le", "+Inf"), ("op", "pull")))] >= 3
        assert after[("process_resident_memory_bytes", ())] > 10 << 20
        feat_rows = after[("asyncgraph_tensor_rows", (("tensor", "node:feat"),))]
        assert 0 < feat_rows < client.book.num_nodes
        assert after[("asyncgraph_tensor_bytes", (("tensor", "node:feat"),))] == feat_rows * 1433 * 4
        assert after[("asyncgraph_requests_in_flight", ())] == 0
        assert after[("asyncgraph_connections_held_back", ())] == 0
        await client.close()
        await wait_for_log(group, 0, "connection closed peer=127.0.0.1:")
        assert scrape(port)[("asyncgraph_connections_open", ())] == 0
    finally:
        group.stop()


async def test_server_error_counted(cora2, tmp_path: Path) -> None:
    """A request the server rejects counts as outcome=error (sent below the client's checks)."""
    group = start_servers(
        cora2.part_config, tmp_path / "srv", num_parts=2, extra_args=["--metrics-port", "0"]
    )
    try:
        port = json.loads((tmp_path / "srv" / "ready0.json").read_text())["metrics_port"]
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        conn = client.connections[0]
        with pytest.raises(UnknownTensorError):
            await conn.call("pull", {"name": "node:nope", "ids": np.arange(3)}, 10)
        after = scrape(port)
        assert after[("asyncgraph_requests_total", (("op", "pull"), ("outcome", "error")))] == 1
        assert after[("asyncgraph_request_seconds_count", (("op", "pull"),))] == 1
        await client.close()
    finally:
        group.stop()


def test_no_metrics_port_by_default(cora2, tmp_path: Path) -> None:
    group = start_servers(cora2.part_config, tmp_path / "srv", num_parts=2)
    try:
        assert "metrics_port" not in json.loads((tmp_path / "srv" / "ready0.json").read_text())
    finally:
        group.stop()


async def test_connection_log_lines(cora2, tmp_path: Path) -> None:
    """One greppable key=value line per connection opened, closed and refused, with the peer."""
    group = start_servers(cora2.part_config, tmp_path / "srv", num_parts=2, secret=b"right")
    try:
        client = await AsyncClient.connect(group.addresses, secret=b"right", use_shared_memory=False)
        await client.close()
        text = await wait_for_log(group, 0, "connection closed peer=")
        assert "connection open peer=127.0.0.1:" in text
        closed = [line for line in text.splitlines() if "connection closed" in line]
        assert "requests=1 " in closed[0] and "open=0" in closed[0]  # the info request
        with pytest.raises(AuthenticationError):
            # one server: the first refusal ends a multi-server connect, and the others' hellos
            # may then be cut before they are read (logged as eof, not as refused)
            await AsyncClient.connect(group.addresses[:1], secret=b"wrong", connect_timeout=5)
        text = await wait_for_log(group, 0, "connection refused peer=127.0.0.1:")
        refused = [line for line in text.splitlines() if "connection refused" in line]
        assert "reason=auth" in refused[0] and "error=AuthenticationError" in refused[0]
    finally:
        group.stop()
