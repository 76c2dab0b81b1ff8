"""``python -m asyncgraph.launch.health``: is a server up and answering? One line, exit 0 or 1.

Connects with the real client handshake (the secret, when given, is proved exactly as trainers
prove it), sends ``ping`` and prints ``ok host:port graph=<name> part=<id> rtt=<ms>``; any failure
prints ``fail host:port: <reason>`` and exits 1. For Kubernetes readiness/liveness probes, systemd
``ExecStartPost=`` checks and scripts. Imports no torch, so it is cheap to run often.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from asyncgraph.cli import Parser, configure_logging
from asyncgraph.env import ENV_SECRET_FILE
from asyncgraph.net.connection import Connection

__all__ = ["check", "main"]


async def check(host: str, port: int, secret: bytes | None, timeout: float) -> str:
    """Handshake and ping; returns the ``ok ...`` line, raises on any failure."""
    start = time.perf_counter()
    conn = await Connection.open(host, port, graph_name=None, secret=secret, timeout=timeout)
    try:
        await conn.call("ping", {}, timeout)
        rtt_ms = (time.perf_counter() - start) * 1000.0
        hello = conn.server_hello
        served = f" graph={hello.graph_name} part={hello.part_id}" if hello is not None else ""
        return f"ok {host}:{port}{served} rtt={rtt_ms:.1f}ms"
    finally:
        conn.close()


def _read_secret(path: Path) -> bytes:
    secret = path.read_bytes().strip()  # the server strips it the same way
    if not secret:
        raise ValueError(f"secret file {path} is empty")
    return secret


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m asyncgraph.launch.health", description=__doc__, raw_description=True)
    parser.add_argument("--host", default="127.0.0.1", help="server address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="server port")
    parser.add_argument(
        "--secret-file", type=Path, help=f"the servers' secret (default: ${ENV_SECRET_FILE} if set)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds for connect, handshake, ping")
    args = parser.parse_args(argv)
    configure_logging(args.log_level, "health")
    where = f"{args.host}:{args.port}"
    secret_file = args.secret_file or (
        Path(os.environ[ENV_SECRET_FILE]) if ENV_SECRET_FILE in os.environ else None
    )
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    if secret_file is not None and not secret_file.is_file():  # misconfigured, not "server down"
        parser.exit(2, f"{parser.prog}: error: secret file {secret_file} does not exist\n")
    try:
        secret = _read_secret(secret_file) if secret_file is not None else None
        line = asyncio.run(
            asyncio.wait_for(check(args.host, args.port, secret, args.timeout), args.timeout * 2)
        )
    except TimeoutError:
        print(f"fail {where}: timed out after {args.timeout * 2:g} s", flush=True)
        return 1
    except Exception as exc:  # a probe reports every failure as one line, never a traceback
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"fail {where}: {reason}", flush=True)
        return 1
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
