"""Process-wide client state: ``initialize`` picks distributed or standalone mode.

``initialize(ip_config)`` connects to the servers listed in the file (or in the environment a
launcher sets); with neither, the process runs standalone and ``DistGraph(name, part_config)``
loads the partitions in-process. Either way later calls find the client here.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncgraph.client.ipconfig import IpConfig
from asyncgraph.client.sync_client import Client
from asyncgraph.env import (
    ENV_CONNECT_TIMEOUT,
    ENV_HOLDER,
    ENV_HOLDER_KEY_FILE,
    ENV_IP_CONFIG,
    ENV_PART_CONFIG,
    ENV_SECRET_FILE,
    ENV_SERVERS,
    process_rank,
    read_holder_key,
)
from asyncgraph.errors import AsyncGraphError, InvalidRequestError
from asyncgraph.net.tls import TlsConfig

_log = logging.getLogger("asyncgraph")

#: Seconds ``initialize`` waits for every server when neither the argument nor
#: ``$ASYNCGRAPH_CONNECT_TIMEOUT`` says otherwise.
DEFAULT_CONNECT_TIMEOUT = 60.0


@dataclass
class _State:
    client: Client | None = None
    servers: list[tuple[str, int]] | None = None
    secret: bytes | None = None
    standalone: bool = True
    options: dict[str, object] | None = None


_STATE = _State()


def _launched_servers(ip_config: str | Path | None) -> str | Path | None:
    """Inside a launched job the launcher's servers win over an ``ip_config`` argument."""
    launched = os.environ.get(ENV_IP_CONFIG) or None
    if launched is None and os.environ.get(ENV_SERVERS):
        if ip_config is not None:
            _log.warning("initialize: ip_config %s ignored: servers are in $%s", ip_config, ENV_SERVERS)
        return None
    same = ip_config is None or launched is None or Path(ip_config).resolve() == Path(launched).resolve()
    if not same:
        _log.warning(
            "initialize: ip_config %s ignored: this launched job's servers are in $%s=%s",
            ip_config,
            ENV_IP_CONFIG,
            launched,
        )
    return launched if launched is not None else ip_config


def initialize(
    ip_config: str | Path | None = None,
    num_servers: int = 1,
    num_workers: int = 0,
    max_queue_size: int | None = None,
    net_type: str | None = None,
    num_worker_threads: int = 1,
    use_graphbolt: bool = False,
    *,
    secret: bytes | None = None,
    secret_file: str | Path | None = None,
    call_timeout: float = 60.0,
    connect_timeout: float | None = None,
    use_shared_memory: bool = True,
    reconnect_window: float | None = None,
    local_partitions: Sequence[int] | None = None,
    tls: TlsConfig | None = None,
) -> None:
    """Set up this trainer process: connect to the servers, or choose standalone mode.

    Servers come from ``$ASYNCGRAPH_IP_CONFIG`` / ``$ASYNCGRAPH_SERVERS`` when a launcher set
    them (an ``ip_config`` argument is then ignored, with a logged warning, so a DGL script's
    ``initialize("ip_config.txt")`` runs unchanged under ``asyncgraph.launch``), else from
    ``ip_config`` (DGL's ``host [port]`` per line, one per partition in partition order); with
    none of them the process is standalone. DGL's ``num_servers`` is accepted and unused: a
    partition's replica servers (``asyncgraph.launch --num-servers``) are found through its
    primary. ``max_queue_size``, ``net_type`` and ``num_worker_threads`` are accepted and
    unused, and so is ``use_graphbolt``:
    partitions here are CSC arrays sampled by their owners already (what GraphBolt switches DGL
    to), so there is no second format to choose. ``num_workers`` (DGL's
    sampler processes) is accepted but ignored here (a value above 0 warns): worker processes
    belong to each loader, ``DistNodeDataLoader(num_workers=N)``.

    Trainers may start before their servers (any launcher: torchrun, srun, Kubernetes): each
    server is retried with jittered backoff until ``connect_timeout`` seconds (default
    ``$ASYNCGRAPH_CONNECT_TIMEOUT``, else 60) have passed, then ``ServersMissingError`` names
    every server still unreachable. A wrong secret fails at once (``AuthenticationError``).
    ``reconnect_window`` (seconds; default ``$ASYNCGRAPH_RECONNECT_WINDOW``, else 0) lets calls
    ride through a server restart. ``local_partitions`` restricts shared memory to those
    co-located partitions (``None``: every co-located one; see ``AsyncClient.connect``).
    ``tls`` (default ``$ASYNCGRAPH_TLS_CA_FILE``/``_CERT``/``_KEY``, else off): TLS with this
    trainer's certificate, for servers started with ``--tls-*`` (``asyncgraph.net.tls``).
    Once connected, a second call changes nothing (call ``finalize()`` first to reconnect).
    Without a secret, ``$ASYNCGRAPH_HOLDER`` and ``$ASYNCGRAPH_HOLDER_KEY_FILE`` (what the
    launcher gives its trainers) connect as that holder, proved by its own key (issue 32).
    """
    if _STATE.client is not None:
        # a second call is a no-op (PyG's Sequential re-imports the calling script, which calls
        # initialize() again); finalize() first to connect elsewhere
        _log.info("initialize(): this process is set up already; this call changes nothing")
        return
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise InvalidRequestError(f"num_workers must be a non-negative int, got {num_workers!r}")
    if num_workers > 0:
        warnings.warn(
            f"initialize(num_workers={num_workers}) is ignored: pass num_workers to "
            "DistNodeDataLoader, whose worker processes sample and gather its batches",
            UserWarning,
            stacklevel=2,
        )
    servers: list[tuple[str, int]] | None = None
    ip_config = _launched_servers(ip_config)
    if ip_config is None:
        ip_config = os.environ.get(ENV_IP_CONFIG) or None
    if ip_config is not None:
        servers = IpConfig.load(ip_config).addresses()
    elif os.environ.get(ENV_SERVERS):
        servers = parse_server_list(os.environ[ENV_SERVERS], source=f"${ENV_SERVERS}")
    if connect_timeout is None:
        connect_timeout = _env_timeout()
    if secret is None:
        secret_file = secret_file or os.environ.get(ENV_SECRET_FILE) or None
        if secret_file is not None:
            secret = Path(secret_file).read_bytes().strip()
    holder = holder_key = None
    key_file = os.environ.get(ENV_HOLDER_KEY_FILE) or None
    if secret is None and key_file is not None:
        holder = os.environ.get(ENV_HOLDER) or None
        if holder is None:
            raise InvalidRequestError(f"${ENV_HOLDER_KEY_FILE} is set without ${ENV_HOLDER}, its holder")
        holder_key = read_holder_key(key_file)
    _STATE.servers = servers
    _STATE.secret = secret
    _STATE.standalone = servers is None
    _STATE.options = {
        "call_timeout": call_timeout,
        "connect_timeout": connect_timeout,
        "use_shared_memory": use_shared_memory,
    }
    if servers is not None:
        _STATE.client = Client.connect(
            servers,
            secret=secret,
            call_timeout=call_timeout,
            connect_timeout=connect_timeout,
            use_shared_memory=use_shared_memory,
            reconnect_window=reconnect_window,
            local_partitions=local_partitions,
            tls=tls,
            holder=holder,
            holder_key=holder_key,
        )


def parse_server_list(text: str, source: str = "<servers>") -> list[tuple[str, int]]:
    """``"host[:port],host[:port]"`` (commas or whitespace) as ``(host, port)`` in order."""
    entries = text.replace(",", " ").split()
    return IpConfig.parse("\n".join(e.replace(":", " ") for e in entries), source=source).addresses()


def _env_timeout() -> float:
    raw = os.environ.get(ENV_CONNECT_TIMEOUT)
    if not raw:
        return DEFAULT_CONNECT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidRequestError(f"${ENV_CONNECT_TIMEOUT} must be a positive number of seconds, got {raw!r}")
    return value


def is_standalone() -> bool:
    return _STATE.client is None or _STATE.client.is_standalone


def get_client(graph_name: str | None = None, part_config: str | Path | None = None) -> Client:
    """The process's client; in standalone mode the first call loads ``part_config``."""
    if _STATE.client is None:
        part_config = part_config or os.environ.get(ENV_PART_CONFIG) or None
        if part_config is None:
            raise AsyncGraphError(
                "asyncgraph is in standalone mode and no part_config was given: "
                "pass DistGraph(name, part_config=...) or call initialize(ip_config) first"
            )
        _STATE.client = Client.standalone(part_config)
    client = _STATE.client
    if graph_name is not None and client.graph_name != graph_name:
        raise AsyncGraphError(f"this process serves graph {client.graph_name!r}, not {graph_name!r}")
    return client


def barrier(name: str = "default", timeout: float = 300.0) -> None:
    """Block until every trainer of the job reaches this barrier (no-op when standalone)."""
    if _STATE.client is not None:
        _STATE.client.barrier(name, timeout)


def snapshot(name: str = "asyncgraph-snapshot", timeout: float = 300.0) -> int | None:
    """Snapshot every server's state as one epoch; every trainer calls it (collective).

    Trainers meet at a barrier (no writes in flight), trainer 0's call snapshots every server
    under one new epoch number, and a second barrier releases everyone. Servers need
    ``--state-dir``. Returns the epoch on the trainer that took it, else None; no-op standalone.
    """
    client = _STATE.client
    if client is None or client.is_standalone:
        return None
    client.barrier(f"{name}:before", timeout)
    rank = int(os.environ.get("RANK", "0"))
    epoch = client.snapshot() if rank == 0 else None
    client.barrier(f"{name}:after", timeout)
    return epoch


def shutdown_servers() -> None:
    """Ask every server to stop; call from one trainer after a final barrier."""
    if _STATE.client is not None and not _STATE.client.is_standalone:
        _STATE.client.shutdown_servers()


def finalize() -> None:
    """Close this process's client (connections, loop thread, shared-memory maps)."""
    client, _STATE.client = _STATE.client, None
    if client is not None:
        client.close()


def current_client() -> Client | None:
    """The client ``initialize`` (or a first ``DistGraph``) made, or None before / after."""
    return _STATE.client


def rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Fill ``rank``/``world_size`` from torch.distributed, else the launcher's environment
    (torchrun's RANK/WORLD_SIZE, srun's SLURM_PROCID/SLURM_NTASKS; ``env.process_rank``), else 0/1."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            env_rank, env_world = dist.get_rank(), dist.get_world_size()
        else:
            found = process_rank()
            env_rank, env_world = found.rank, found.world_size
        rank = env_rank if rank is None else rank
        world_size = env_world if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidRequestError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
    return int(rank), int(world_size)
