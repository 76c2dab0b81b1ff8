"""A fake replica with the job's secret: a small server that answers the handshake (proving the
secret) and ``info`` as a replica of the primary, but maps none of the primary's memory; it asks
the primary to list it.

``fake_replica.py PRIMARY_HOST:PORT SECRET_FILE PART_CONFIG PID_MODE`` (PID_MODE ``one``: announce
pid 1; ``self``: its own pid). Prints one JSON line: ``{"error": code or null, "message": ...}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from asyncgraph.errors import AsyncGraphError
from asyncgraph.net.connection import Connection
from asyncgraph.protocol import ConnectionFailed, HandshakeComplete, Request, ServerInfo, ServerSession
from asyncgraph.protocol.ops import AddReplicaArgs, Op
from asyncgraph.server.durable import partition_fingerprint


class FakeServer(asyncio.Protocol):
    def __init__(self, info: ServerInfo, secret: bytes) -> None:
        self.info = info
        self.session = ServerSession(
            graph_name=info.graph_name, part_id=info.part_id, secret=secret, instance="fake", role="replica"
        )
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        assert self.transport is not None
        self.transport.writelines(self.session.data_to_send())

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        for event in self.session.receive_data(data):
            if isinstance(event, Request):
                result: Any = self.info.to_wire() if event.op == "info" else None
                self.transport.writelines(self.session.send_response(event.id, result))
            elif isinstance(event, (HandshakeComplete, ConnectionFailed)):
                self.transport.writelines(self.session.data_to_send())


async def main() -> None:
    host, _, port = sys.argv[1].rpartition(":")
    secret = Path(sys.argv[2]).read_bytes()
    part_config, pid_mode = Path(sys.argv[3]), sys.argv[4]
    primary = await Connection.open(host, int(port), graph_name=None, secret=secret)
    info = ServerInfo.from_wire(await primary.call(Op.INFO, {}, 10.0))
    claimed = dataclasses.replace(
        info, role="replica", primary=sys.argv[1], primary_instance=info.instance, instance="fake"
    )
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FakeServer(claimed, secret), "127.0.0.1", 0)
    my_port = server.sockets[0].getsockname()[1]
    fingerprint = partition_fingerprint(part_config, info.part_id)  # computed from the files
    pid = 1 if pid_mode == "one" else os.getpid()
    try:
        await primary.call(Op.ADD_REPLICA, AddReplicaArgs(my_port, pid, fingerprint).encode(), 30.0)
        print(json.dumps({"error": None, "message": "listed"}), flush=True)
    except AsyncGraphError as exc:
        print(json.dumps({"error": exc.code, "message": str(exc)}), flush=True)
    primary.close()
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
