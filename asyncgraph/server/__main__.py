"""``python -m asyncgraph.server``: serve one partition of a partitioned graph.

Exit status: 0 after SIGTERM, SIGINT or a ``shutdown`` request (a requested, clean stop: the
listener, shared memory and store are closed first); 2 for bad options; 1 for a start-up
error; a server killed by any other signal dies of it (the launcher reports 128 + N).

Limits (see ``asyncgraph.server.admission`` and ``asyncgraph.service.limits``):
``--handshake-timeout`` (5 s), a 16 KiB frame limit until the hello succeeds,
``--max-pending-connections`` (128 still in their handshake), ``--max-frame-size`` (1 GiB,
which also bounds a pull's rows x row bytes), ``--max-sampled-edges`` (8 Mi per request),
``--max-tensor-bytes`` (one tensor's rows here; default physical memory).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.server.admission import DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_PENDING
from asyncgraph.server.app import ServerOptions, serve
from asyncgraph.service.limits import DEFAULT_MAX_SAMPLED_EDGES


def parse_args(argv: list[str] | None = None) -> ServerOptions:
    parser = argparse.ArgumentParser(prog="python -m asyncgraph.server", description=__doc__)
    parser.add_argument("--part-config", type=Path, required=True, help="the partition JSON file")
    parser.add_argument("--part-id", type=int, required=True, help="which partition to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--num-clients", type=int, default=1, help="trainer clients in barriers")
    parser.add_argument("--secret-file", type=Path, help="shared secret clients must prove")
    parser.add_argument("--ready-file", type=Path, help="write the bound address here (JSON)")
    parser.add_argument("--max-frame-size", type=int, default=DEFAULT_MAX_FRAME_SIZE)
    parser.add_argument("--max-inflight", type=int, default=64, help="async requests per connection")
    parser.add_argument(
        "--handshake-timeout",
        type=float,
        default=DEFAULT_HANDSHAKE_TIMEOUT,
        help="seconds a new connection has to complete its hello",
    )
    parser.add_argument(
        "--max-pending-connections",
        type=int,
        default=DEFAULT_MAX_PENDING,
        help="connections still in their handshake; new ones beyond this are closed at once",
    )
    parser.add_argument(
        "--max-sampled-edges",
        type=int,
        default=DEFAULT_MAX_SAMPLED_EDGES,
        help="most edges one sample request may return",
    )
    parser.add_argument(
        "--max-tensor-bytes",
        type=int,
        default=0,
        help="most bytes of one tensor's rows on this server (0: physical memory)",
    )
    parser.add_argument("--no-shared-memory", action="store_true", help="serve over TCP only")
    parser.add_argument("--log-level", default="INFO")
    ns = parser.parse_args(argv)
    if ns.num_clients < 1:
        parser.error("--num-clients must be at least 1")
    if not ns.handshake_timeout > 0:
        parser.error("--handshake-timeout must be positive")
    if ns.max_sampled_edges < 0 or ns.max_tensor_bytes < 0:
        parser.error("--max-sampled-edges and --max-tensor-bytes must be >= 0")
    if ns.max_pending_connections < 1:
        parser.error("--max-pending-connections must be at least 1")
    secret = ns.secret_file.read_bytes().strip() if ns.secret_file else None
    if secret is not None and not secret:
        parser.error(f"--secret-file {ns.secret_file} is empty")
    logging.basicConfig(
        level=ns.log_level.upper(),
        format=f"%(asctime)s server[{ns.part_id}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return ServerOptions(
        part_config=ns.part_config,
        part_id=ns.part_id,
        host=ns.host,
        port=ns.port,
        num_clients=ns.num_clients,
        secret=secret,
        ready_file=ns.ready_file,
        max_frame_size=ns.max_frame_size,
        max_inflight=ns.max_inflight,
        shared_memory=not ns.no_shared_memory,
        handshake_timeout=ns.handshake_timeout,
        max_pending_connections=ns.max_pending_connections,
        max_sampled_edges=ns.max_sampled_edges,
        max_tensor_bytes=ns.max_tensor_bytes,
    )


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(options))
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        asyncio.run(serve(options))


if __name__ == "__main__":
    main()
