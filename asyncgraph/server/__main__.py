"""``python -m asyncgraph.server``: serve one partition of a partitioned graph.

Exit status: 0 after SIGTERM, SIGINT or a ``shutdown`` request (a requested, clean stop: the
listener, shared memory and store are closed first); 2 for bad options; 1 for a start-up
error; a server killed by any other signal dies of it (the launcher reports 128 + N).

Limits (see ``asyncgraph.server.admission`` and ``asyncgraph.service.limits``):
``--handshake-timeout`` (5 s), a 16 KiB frame limit until the hello succeeds,
``--max-pending-connections`` (128 still in their handshake), ``--max-frame-size`` (1 GiB,
which also bounds a pull's rows x row bytes), ``--max-sampled-edges`` (8 Mi per request),
``--max-tensor-bytes`` (one tensor's rows here; default physical memory). Server-wide
(``asyncgraph.server.budget``, issue 22): ``--max-tensors``, ``--memory-budget`` (all tensors),
``--max-connections`` (authenticated) and ``--max-connections-per-holder`` (one client's),
``--max-queued-reply-bytes`` (replies nobody reads);
``/metrics`` has its own limits (``asyncgraph.server.metrics_http``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from asyncgraph.cli import CliError, Parser, configure_logging, part_config_checked, run_main
from asyncgraph.net.tls import TlsConfig
from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.server.admission import DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_PENDING
from asyncgraph.server.app import serve
from asyncgraph.server.budget import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_HOLDER,
    DEFAULT_MAX_QUEUED_REPLY_BYTES,
)
from asyncgraph.server.options import ServerOptions
from asyncgraph.service.limits import DEFAULT_MAX_SAMPLED_EDGES


def build_parser() -> Parser:
    parser = Parser(prog="python -m asyncgraph.server", description=__doc__)
    parser.add_argument("--part-config", type=Path, required=True, help="the partition JSON file")
    parser.add_argument("--part-id", type=int, required=True, help="which partition to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--num-clients", type=int, default=1, help="trainer clients in barriers")
    parser.add_argument("--secret-file", type=Path, help="shared secret clients must prove")
    parser.add_argument(
        "--require-holder-keys",
        action="store_true",
        help="a client that names a holder must prove that holder's own key (derived from the "
        "secret), not the bare secret: the launcher's trainers get only their holder's key",
    )
    parser.add_argument("--ready-file", type=Path, help="write the bound address here (JSON)")
    tls = parser.add_argument_group("TLS with client certificates (all three, or none: off)")
    tls.add_argument("--tls-ca-file", type=Path, help="the job's CA (it signs every certificate)")
    tls.add_argument("--tls-cert", type=Path, help="this server's certificate (PEM)")
    tls.add_argument("--tls-key", type=Path, help="this server's private key (PEM)")
    parser.add_argument(
        "--max-frame-size",
        type=int,
        default=DEFAULT_MAX_FRAME_SIZE,
        help=f"largest frame accepted from a client, bytes (default {DEFAULT_MAX_FRAME_SIZE})",
    )
    parser.add_argument(
        "--max-inflight", type=int, default=64, help="async requests (barriers) pending per connection"
    )
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
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (0: a free port, written to the "
        "ready file as metrics_port and logged); default: no metrics",
    )
    parser.add_argument(
        "--metrics-host", help="address for the metrics endpoint (default: where the server binds, --host)"
    )
    parser.add_argument(
        "--metrics-token-file",
        type=Path,
        help="/metrics answers only requests with 'Authorization: Bearer <the file's contents>' "
        "(Prometheus: authorization.credentials_file)",
    )
    parser.add_argument(
        "--state-dir", type=Path, help="keep snapshots (and the WAL) here; restore from it on start"
    )
    parser.add_argument("--wal", action="store_true", help="log every acknowledged write (needs --state-dir)")
    parser.add_argument(
        "--wal-fsync",
        choices=("always", "interval"),
        default="always",
        help="always: fsync before each reply (survives power loss); interval: fsync every "
        "--wal-fsync-interval s (survives a process crash; a power loss may lose that interval)",
    )
    parser.add_argument(
        "--wal-fsync-interval",
        type=float,
        default=0.05,
        help="seconds between fsyncs with --wal-fsync interval",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help=f"authenticated connections held at once; more are refused (default {DEFAULT_MAX_CONNECTIONS})",
    )
    parser.add_argument(
        "--max-connections-per-holder",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS_PER_HOLDER,
        help="authenticated connections one client (the holder its hello names) keeps at once; "
        "connections naming none share one such count; 0: no cap per holder "
        f"(default {DEFAULT_MAX_CONNECTIONS_PER_HOLDER})",
    )
    parser.add_argument(
        "--max-queued-reply-bytes",
        type=int,
        default=DEFAULT_MAX_QUEUED_REPLY_BYTES,
        help="reply bytes queued for clients that do not read, all connections together; over it the "
        f"biggest queues stop being read (default {DEFAULT_MAX_QUEUED_REPLY_BYTES >> 20} MiB)",
    )
    parser.add_argument(
        "--memory-budget",
        type=int,
        default=0,
        help="most bytes the tensors of this server hold in memory together: run-time tensors and "
        "copies of partition data (--writable-partition-data, --copy-partition-data); the partition "
        "files served in place are page cache and not counted (0: the cgroup's memory limit, else "
        "physical memory)",
    )
    parser.add_argument(
        "--holder-lease",
        type=float,
        default=0.0,
        help="release a client's non-persistent tensor references once it has had no connection for "
        "S seconds (at least the clients' reconnect window; 0: never, the default)",
    )
    parser.add_argument(
        "--max-tensors",
        type=int,
        default=0,
        help="most tensors this server holds, the partition's own included (0: up to 4096, fewer when "
        "the descriptor limit is low: each tensor holds a descriptor)",
    )
    parser.add_argument(
        "--writable-partition-data",
        action="store_true",
        help="let clients write the partition's own tensors (features, labels: DGL's writable ndata); "
        "by default they are read-only. They can never be deleted",
    )
    parser.add_argument(
        "--copy-partition-data",
        action="store_true",
        help="copy the partition's files into memory at start instead of serving them in place "
        "(read-only mappings of the .npy files, the default): for files on a slow or network "
        "file system, or stored in a layout that cannot be mapped (Fortran order)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="at start, rehash every byte of the partition's structure files and refuse to serve "
        "(FingerprintMismatchError) unless they match the fingerprint the partitioner recorded; "
        "without it only sizes and .npy headers are checked",
    )
    parser.add_argument(
        "--wal-recover",
        action="store_true",
        help="a write-ahead log with a corrupt record followed by valid ones (the server refuses to "
        "start, naming file and offset): move it aside (kept as *.corrupt-TIME), replay the records "
        "that verify and log what was skipped",
    )
    parser.add_argument(
        "--compact-when-overlay-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="a live graph: fold the overlay into a new CSC (reads go on) once its added and removed "
        "edges pass F times the partition's edges, e.g. 0.2 (0: only on request, the default)",
    )
    parser.add_argument(
        "--snapshot-interval",
        type=float,
        default=0.0,
        help="also snapshot this server every S seconds when it was written to (0: only on request)",
    )
    parser.add_argument(
        "--replica-of",
        metavar="HOST:PORT",
        help="serve as one more process of this partition: map the memory of its primary server at "
        "HOST:PORT on this host and answer reads (and pushes) there; the primary keeps tensors, "
        "barriers and state (DGL's num_servers > 1)",
    )
    return parser


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise CliError(f"--replica-of {value!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def parse_args(argv: list[str] | None = None) -> ServerOptions:
    """Options from the command line; bad input raises ``CliError`` or exits 2 (argparse)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.num_clients < 1:
        parser.error("--num-clients must be at least 1")
    if not 0 <= ns.port <= 65535 or (ns.metrics_port is not None and not 0 <= ns.metrics_port <= 65535):
        parser.error("ports must be in 0..65535")
    part_config_checked(ns.part_config, ns.part_id)
    if ns.secret_file is not None and not ns.secret_file.is_file():
        raise CliError(f"--secret-file {ns.secret_file} does not exist")
    if ns.require_holder_keys and ns.secret_file is None:
        parser.error("--require-holder-keys needs --secret-file: holder keys are derived from it")
    if (ns.wal or ns.snapshot_interval or ns.wal_recover) and ns.state_dir is None:
        parser.error("--wal, --wal-recover and --snapshot-interval need --state-dir")
    if not ns.handshake_timeout > 0:
        parser.error("--handshake-timeout must be positive")
    counts = ("max_sampled_edges", "max_tensor_bytes", "max_tensors", "holder_lease", "memory_budget")
    for key in (*counts, "max_connections_per_holder"):
        if getattr(ns, key) < 0:
            parser.error(f"--{key.replace('_', '-')} must be >= 0")
    if ns.max_pending_connections < 1 or ns.max_connections < 1 or ns.max_queued_reply_bytes < 1:
        parser.error(
            "--max-pending-connections, --max-connections and --max-queued-reply-bytes must be at least 1"
        )
    replica_of = _address(ns.replica_of) if ns.replica_of is not None else None
    if replica_of is not None and (ns.state_dir is not None or ns.no_shared_memory):
        parser.error(
            "--replica-of keeps no state and needs shared memory: drop --state-dir/--wal "
            "and --no-shared-memory (the primary's state covers the partition)"
        )
    secret = ns.secret_file.read_bytes().strip() if ns.secret_file else None
    metrics_token = None
    if ns.metrics_token_file is not None:
        if not ns.metrics_token_file.is_file():
            raise CliError(f"--metrics-token-file {ns.metrics_token_file} does not exist")
        metrics_token = ns.metrics_token_file.read_bytes().strip()
        if not metrics_token:
            raise CliError(f"--metrics-token-file {ns.metrics_token_file} is empty")
    if secret is not None and not secret:
        raise CliError(f"--secret-file {ns.secret_file} is empty")
    configure_logging(
        ns.log_level, f"server[{ns.part_id}]" if ns.replica_of is None else f"replica[{ns.part_id}]"
    )
    return ServerOptions(
        part_config=ns.part_config,
        part_id=ns.part_id,
        host=ns.host,
        port=ns.port,
        num_clients=ns.num_clients,
        secret=secret,
        require_holder_keys=ns.require_holder_keys,
        ready_file=ns.ready_file,
        max_frame_size=ns.max_frame_size,
        max_inflight=ns.max_inflight,
        shared_memory=not ns.no_shared_memory,
        metrics_port=ns.metrics_port,
        metrics_host=ns.metrics_host,
        metrics_token=metrics_token,
        state_dir=ns.state_dir,
        wal=ns.wal,
        wal_fsync=ns.wal_fsync,
        wal_fsync_interval=ns.wal_fsync_interval,
        snapshot_interval=ns.snapshot_interval,
        wal_recover=ns.wal_recover,
        writable_partition_data=ns.writable_partition_data,
        copy_partition_data=ns.copy_partition_data,
        verify=ns.verify,
        max_tensors=ns.max_tensors,
        max_connections=ns.max_connections,
        max_connections_per_holder=ns.max_connections_per_holder,
        holder_lease=ns.holder_lease,
        memory_budget=ns.memory_budget,
        compact_fraction=ns.compact_when_overlay_fraction,
        max_queued_reply_bytes=ns.max_queued_reply_bytes,
        handshake_timeout=ns.handshake_timeout,
        max_pending_connections=ns.max_pending_connections,
        max_sampled_edges=ns.max_sampled_edges,
        max_tensor_bytes=ns.max_tensor_bytes,
        replica_of=replica_of,
        tls=_tls(parser, ns),
    )


def _tls(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> TlsConfig | None:
    """``--tls-*``: all three files (readable, loadable) or none."""
    files = (ns.tls_ca_file, ns.tls_cert, ns.tls_key)
    if not any(files):
        return None
    if not all(files):
        parser.error("TLS needs --tls-ca-file, --tls-cert and --tls-key together")
    config = TlsConfig(*(str(f) for f in files))
    try:
        config.server_context()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        parser.error(f"TLS files cannot be loaded: {exc}")
    return config


def main(argv: list[str] | None = None) -> int:
    """Serve until stopped; bad arguments or files: one line on stderr and status 2."""

    def run() -> None:
        options = parse_args(argv)
        try:
            import uvloop

            uvloop.run(serve(options))
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
            asyncio.run(serve(options))

    return run_main("python -m asyncgraph.server", run)


if __name__ == "__main__":
    sys.exit(main())
