"""``Connection``'s life cycle is one ``ConnectionState`` (issue 21): OPEN after the handshake,
LOST when the socket goes, RECONNECTING while one shared reconnect runs, OPEN again (next
generation), CLOSED for good after ``close()``. Real servers (PubMed, 2 parts)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import ServerUnavailableError
from asyncgraph.net import ConnectionState
from asyncgraph.testing import ServerGroup


@pytest.mark.timeout(60)
async def test_connection_state_follows_its_life_cycle(served: ServerGroup) -> None:
    client = await AsyncClient.connect(served.addresses, use_shared_memory=False, reconnect_window=10.0)
    try:
        conn = client.connections[0]
        one = np.array([client.book.node_range(0)[0]], dtype=np.int64)
        assert conn.state is ConnectionState.OPEN and not conn.closed and conn.generation == 0
        assert conn._transport is not None
        conn._transport.abort()
        await asyncio.sleep(0.05)  # connection_lost has run
        assert conn.state is ConnectionState.LOST and conn.closed
        with pytest.raises(ServerUnavailableError):  # a push is not resent: it fails at once
            await conn.call("push", {}, 5.0, retry=False)
        first = asyncio.ensure_future(conn.reconnect())
        second = asyncio.ensure_future(conn.reconnect())  # shares the first's reconnect
        await asyncio.sleep(0)
        assert conn.state is ConnectionState.RECONNECTING
        await asyncio.gather(first, second)
        assert conn.state is ConnectionState.OPEN and conn.generation == 1
        assert (await client.pull("node:feat", one)).shape == (1, 500)
        conn.close()
        assert conn.state is ConnectionState.CLOSED and conn.closed
        with pytest.raises(ServerUnavailableError, match="closed by the client"):
            await conn.reconnect()  # closed is final: no reconnect
        with pytest.raises(ServerUnavailableError, match="closed by the client"):
            await client.pull("node:feat", one)  # nor a resent read
        assert conn.state is ConnectionState.CLOSED and conn.generation == 1
    finally:
        await client.close()
