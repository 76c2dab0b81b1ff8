"""Everything ``python -m asyncgraph.server`` accepts, as one record (``server/__main__.py`` parses
the command line into it; ``server/app.py`` serves by it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asyncgraph.net.tls import TlsConfig
from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.server.admission import DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_PENDING
from asyncgraph.server.budget import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_HOLDER,
    DEFAULT_MAX_QUEUED_REPLY_BYTES,
)
from asyncgraph.server.durable import FsyncPolicy
from asyncgraph.service.limits import DEFAULT_MAX_SAMPLED_EDGES

__all__ = ["ServerOptions"]


@dataclass
class ServerOptions:
    """Everything ``python -m asyncgraph.server`` accepts."""

    part_config: Path
    part_id: int
    host: str = "127.0.0.1"
    port: int = 0
    num_clients: int = 1
    secret: bytes | None = None
    #: A hello that names a holder must prove that holder's own key, not the bare secret
    #: (``--require-holder-keys``; ``protocol/handshake.py``). The launcher turns it on.
    require_holder_keys: bool = False
    ready_file: Path | None = None
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_inflight: int = 64
    shared_memory: bool = True
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    max_pending_connections: int = DEFAULT_MAX_PENDING
    max_sampled_edges: int = DEFAULT_MAX_SAMPLED_EDGES
    max_tensor_bytes: int = 0  # 0: the machine's physical memory
    #: Serve Prometheus metrics on this port (0: a free one, reported in the ready file and
    #: the log); None: no metrics.
    metrics_port: int | None = None
    #: Where ``/metrics`` listens; None: where the server listens (``host``).
    metrics_host: str | None = None
    #: Bearer token ``/metrics`` requires (``--metrics-token-file``); None: no token.
    metrics_token: bytes | None = None
    state_dir: Path | None = None
    wal: bool = False
    wal_fsync: FsyncPolicy = "always"
    wal_fsync_interval: float = 0.05
    snapshot_interval: float = 0.0
    #: Replay a corrupt write-ahead log's valid records (the log moved aside) instead of
    #: refusing to start (``asyncgraph.server.wal``).
    wal_recover: bool = False
    #: Let requests write the partition's own tensors (features, labels), as DGL's writable
    #: ``ndata``; by default they are read-only (``PartitionStore.protect``). Never deletable.
    writable_partition_data: bool = False
    #: Copy the partition's files into memory at start (before issue 34, always) instead of
    #: mapping them read-only in place.
    copy_partition_data: bool = False
    #: Rehash the structure files at start and refuse a mismatch with the recorded fingerprint.
    verify: bool = False
    #: Most tensors this server holds (issue 22); 0: as many as its descriptor limit allows.
    max_tensors: int = 0
    #: Authenticated connections held at once, and per holder (issue 22; 0: no cap per holder).
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_holder: int = DEFAULT_MAX_CONNECTIONS_PER_HOLDER
    #: Release a holder's tensor references once it has had no connection for this many
    #: seconds (issue 22, ``asyncgraph.server.leases``); 0: never.
    holder_lease: float = 0.0
    #: Reply bytes queued on all connections together before the worst readers are paused.
    max_queued_reply_bytes: int = DEFAULT_MAX_QUEUED_REPLY_BYTES
    #: Most bytes of all tensors together (issue 22); 0: the cgroup's limit, else physical memory.
    memory_budget: int = 0
    #: Compact a live graph's overlay once it holds this share of the partition's edges (0: off).
    compact_fraction: float = 0.0
    #: Serve as a replica of the primary at this address (same host): map its memory, hold
    #: no state of its own (``asyncgraph.server.replica``).
    replica_of: tuple[str, int] | None = None
    #: TLS with client certificates (``--tls-ca-file --tls-cert --tls-key``, ``net/tls.py``):
    #: the listener and this server's own connections (replica link and check); None: off.
    tls: TlsConfig | None = None
