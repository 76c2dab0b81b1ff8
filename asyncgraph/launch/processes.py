"""Starting processes: server command lines, ready files, free ports, GPU and core counts,
where each trainer runs (``plan_trainers``) and its ``OMP_NUM_THREADS`` (ssh: ``sshcmd`` and
the agent, ``remote``).

Shared by the launcher (``asyncgraph.launch``), the test and benchmark helper
(``asyncgraph.testing``) and ``asyncgraph.distributed.trainers``; nothing here keeps state.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LOCAL_HOSTS",
    "OMP_ENV",
    "ServerExitedError",
    "TrainerSlot",
    "detect_gpus",
    "free_port",
    "local_cores",
    "omp_threads",
    "parse_gpus",
    "plan_trainers",
    "process_alive",
    "replica_args",
    "server_argv",
    "wait_ready_files",
]

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", socket.gethostname()}


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` on this host is running (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    end = stat.rfind(b")")  # the state follows the command name, which may itself hold ") "
    return stat[end + 2 : end + 3] not in (b"Z", b"X")


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port free right now (for torch.distributed's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def detect_gpus() -> int:
    """CUDA devices visible on this host (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def parse_gpus(value: str | None) -> int | None:
    """``--num-gpus-per-host``: ``None`` (not given), ``auto`` (detected here) or a count >= 1.

    Raises ``ValueError`` naming the problem for a bad count or ``auto`` without GPUs.
    """
    if value is None:
        return None
    if value == "auto":
        found = detect_gpus()
        if found == 0:
            raise ValueError(
                "--num-gpus-per-host auto: no CUDA device on this host; use --num-trainers for CPU trainers"
            )
        return found
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--num-gpus-per-host must be 'auto' or an integer, got {value!r}") from None
    if count < 1:
        raise ValueError(f"--num-gpus-per-host must be at least 1 (or 'auto'), got {count}")
    return count


@dataclass(frozen=True)
class TrainerSlot:
    """Where one trainer runs (its rank is its index in :func:`plan_trainers`' list)."""

    #: Its host, as the caller named it (one name per machine).
    host: str
    #: Its index among the trainers of its host (``LOCAL_RANK``): distinct on a host.
    local_rank: int
    #: How many trainers its host runs (``LOCAL_WORLD_SIZE``).
    local_world_size: int
    #: ``cuda:<local_rank>`` (an index below the host's GPU count) or ``cpu``.
    device: str


def plan_trainers(
    part_hosts: Sequence[str], *, per_partition: int | None, gpus_per_host: int | None
) -> list[TrainerSlot]:
    """Every trainer of a job, in rank order, from the host of each partition.

    With ``gpus_per_host`` a host runs one trainer per GPU, however many partitions it serves
    (each trainer reaches every partition anyway): ``gpus_per_host`` on each host, or
    ``per_partition`` times its partitions when that is given. Without it (CPU trainers)
    each partition gets ``per_partition`` (default 1). Ranks go host by host (GPUs) or
    partition by partition (a count per partition), so trainers of one partition are
    consecutive, as ``node_split`` expects. ``LOCAL_RANK`` counts the trainers of one host.

    ``ValueError`` naming both numbers when a host would get more trainers than GPUs.
    """
    if per_partition is not None and per_partition < 1:
        raise ValueError("--num-trainers must be at least 1")
    hosts = list(dict.fromkeys(part_hosts))  # each once, in order of first appearance
    order: list[str]
    if gpus_per_host is not None and per_partition is None:
        order = [host for host in hosts for _ in range(gpus_per_host)]
    else:
        order = [host for host in part_hosts for _ in range(per_partition or 1)]
    on_host = {host: order.count(host) for host in hosts}
    if gpus_per_host is not None:
        for host in hosts:
            if on_host[host] > gpus_per_host:
                parts = part_hosts.count(host)
                raise ValueError(
                    f"{on_host[host]} trainers on {host} ({per_partition} per partition x {parts} "
                    f"partitions) but it has {gpus_per_host} GPU{'s' if gpus_per_host > 1 else ''} "
                    "(--num-gpus-per-host): at most one trainer per GPU; leave out --num-trainers "
                    "for one trainer per GPU"
                )
    seen = dict.fromkeys(hosts, 0)
    slots = []
    for host in order:
        local_rank, seen[host] = seen[host], seen[host] + 1
        device = "cpu" if gpus_per_host is None else f"cuda:{local_rank}"
        slots.append(TrainerSlot(host, local_rank, on_host[host], device))
    return slots


def server_argv(
    part_config: Path,
    part_id: int,
    ready_file: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    num_clients: int = 1,
    secret_file: Path | None = None,
    python: str = sys.executable,
    extra_args: Sequence[str] = (),
    replica_of: tuple[str, int] | None = None,
) -> list[str]:
    """The command line of one partition's server (``python -m asyncgraph.server ...``);
    with ``replica_of`` (the primary's address on this host) a replica server's."""
    argv = [
        python, "-m", "asyncgraph.server",
        "--part-config", str(part_config),
        "--part-id", str(part_id),
        "--host", host,
        "--port", str(port),
        "--num-clients", str(num_clients),
        "--ready-file", str(ready_file),
    ]  # fmt: skip
    if secret_file is not None:
        argv += ["--secret-file", str(secret_file)]
    if replica_of is not None:
        argv += ["--replica-of", f"{replica_of[0]}:{replica_of[1]}"]
    return [*argv, *extra_args]


class ServerExitedError(RuntimeError):
    """Server ``index`` exited with ``status`` before writing its ready file."""

    def __init__(self, index: int, status: int) -> None:
        super().__init__(f"server {index} exited with status {status} before it was ready")
        self.index = index
        self.status = status


#: Server options only a primary takes (its state and log cover the partition's replicas too).
PRIMARY_ONLY_OPTIONS = ("--state-dir", "--wal", "--wal-fsync", "--wal-fsync-interval", "--snapshot-interval")
_FLAGS = ("--wal",)  # of those, the ones that take no value


def replica_args(extra_args: Sequence[str]) -> list[str]:
    """``extra_args`` of a primary server without the options a replica does not take."""
    out: list[str] = []
    skip_value = False
    for arg in extra_args:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in PRIMARY_ONLY_OPTIONS:
            skip_value = "=" not in arg and name not in _FLAGS
            continue
        out.append(arg)
    return out


def wait_ready_files(
    procs: Sequence[subprocess.Popen[bytes]], ready_files: Sequence[Path], timeout: float
) -> list[tuple[str, int]]:
    """Wait until every server has written its ready file; their ``(host, port)`` in order.

    Raises :class:`ServerExitedError` when one exits first and ``TimeoutError`` after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    addresses: list[tuple[str, int] | None] = [None] * len(procs)
    while any(a is None for a in addresses):
        for i, (proc, path) in enumerate(zip(procs, ready_files, strict=True)):
            if addresses[i] is None and path.exists():
                info = json.loads(path.read_text())
                addresses[i] = (str(info["host"]), int(info["port"]))
            code = proc.poll()
            if code is not None and addresses[i] is None:
                raise ServerExitedError(i, code)
        if any(a is None for a in addresses):
            if time.monotonic() > deadline:
                raise TimeoutError(f"servers not ready after {timeout:g} s")
            time.sleep(0.01)
    return [a for a in addresses if a is not None]


OMP_ENV = "OMP_NUM_THREADS"


def omp_threads(cores: int, trainers_on_host: int) -> int:
    """``OMP_NUM_THREADS`` for each of ``trainers_on_host`` trainers sharing ``cores`` cores.

    Like torchrun, the launcher sets it (here to an even share, at least 1) unless the user did:
    otherwise every trainer's torch starts one OpenMP thread per core and they oversubscribe.
    """
    return max(1, int(cores) // max(1, int(trainers_on_host)))


def local_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
