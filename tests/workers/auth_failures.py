"""Fails to connect in every way a client can (wrong or missing secret, a handshake that times
out), collects garbage and exits; the test reads its stderr for asyncio's complaints."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys

import asyncgraph
from asyncgraph.client import AsyncClient
from asyncgraph.errors import AuthenticationError, ServerUnavailableError
from asyncgraph.net.connection import Connection


async def attempts(servers: list[tuple[str, int]]) -> None:
    for secret in (b"wrong", None):
        try:
            await AsyncClient.connect(servers, secret=secret, connect_timeout=5)
        except AuthenticationError as exc:
            print("refused:", exc, flush=True)
    # A client that fails on one server closes its other connections, perhaps before those
    # servers read the handshake: only a direct open to each server makes every one refuse.
    for host, port in servers:
        try:
            await Connection.open(host, port, graph_name=None, secret=b"wrong", timeout=5)
        except AuthenticationError as exc:
            print("refused:", exc, flush=True)
    with socket.socket() as silent:  # accepts, never answers: the handshake times out
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        try:
            await Connection.open(
                "127.0.0.1", silent.getsockname()[1], graph_name=None, secret=b"x", timeout=0.3
            )
        except ServerUnavailableError as exc:
            print("timed out:", exc, flush=True)
        await asyncio.sleep(0.2)
    gc.collect()
    await asyncio.sleep(0.1)


def main() -> None:
    servers = [(h, int(p)) for h, p in (a.split(":") for a in sys.argv[1].split(","))]
    asyncio.run(attempts(servers))
    try:
        asyncgraph.initialize(sys.argv[2], secret=b"wrong", connect_timeout=5)
    except AuthenticationError as exc:
        print("refused:", exc, flush=True)
    asyncgraph.finalize()
    gc.collect()


if __name__ == "__main__":
    main()
