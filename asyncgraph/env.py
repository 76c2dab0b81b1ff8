"""Names of the environment variables asyncgraph reads and the launcher sets, and the one reader
of a trainer's rank under any launcher (no heavy imports: the launcher and servers read them
without paying for torch)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ENV_CONNECT_TIMEOUT",
    "ENV_DDP_BACKEND",
    "ENV_DEVICE",
    "ENV_HOLDER",
    "ENV_HOLDER_KEY_FILE",
    "ENV_IP_CONFIG",
    "ENV_MALLOC_TUNING",
    "ENV_NO_JIT",
    "ENV_PART_CONFIG",
    "ENV_RECONNECT_WINDOW",
    "ENV_SECRET_FILE",
    "ENV_SERVERS",
    "ENV_WRITABLE_PARTITION_DATA",
    "ProcessRank",
    "process_rank",
    "read_holder_key",
]

#: Path of the ip_config file (DGL's ``host [port]`` per line, in partition order).
ENV_IP_CONFIG = "ASYNCGRAPH_IP_CONFIG"
#: The same as "host[:port],host[:port]" (commas or spaces) in partition order, for launchers
#: without a shared file system; a host without a port uses the default port 30050.
ENV_SERVERS = "ASYNCGRAPH_SERVERS"
#: File holding the shared secret servers require.
ENV_SECRET_FILE = "ASYNCGRAPH_SECRET_FILE"
#: The holder (client name) this trainer connects as, given with its key instead of the secret
#: (the launcher's trainers: issue 32, ``protocol/handshake.py``'s holder keys).
ENV_HOLDER = "ASYNCGRAPH_HOLDER"
#: File holding that holder's key, in hex (mode 600): it proves this holder and no other.
ENV_HOLDER_KEY_FILE = "ASYNCGRAPH_HOLDER_KEY_FILE"
#: The partition JSON file of the job.
ENV_PART_CONFIG = "ASYNCGRAPH_PART_CONFIG"
#: "0" leaves glibc malloc's thresholds alone (see ``asyncgraph.storage.malloc``).
ENV_MALLOC_TUNING = "ASYNCGRAPH_MALLOC_TUNING"
#: Set (to anything but "0"): never load the numba kernels; sample and relabel with numpy only.
ENV_NO_JIT = "ASYNCGRAPH_NO_JIT"
#: Seconds a client keeps reconnecting to a server that went away (default 0: fail at once).
ENV_RECONNECT_WINDOW = "ASYNCGRAPH_RECONNECT_WINDOW"

#: torch.distributed backend the launcher chose for the trainers: "nccl" (GPUs) or "gloo".
ENV_DDP_BACKEND = "ASYNCGRAPH_DDP_BACKEND"
#: The trainer's torch device ("cuda:<LOCAL_RANK>" or "cpu"), set by the launcher and spawn_trainers.
ENV_DEVICE = "ASYNCGRAPH_DEVICE"

#: Seconds ``initialize`` keeps retrying to reach every server before it gives up.
ENV_CONNECT_TIMEOUT = "ASYNCGRAPH_CONNECT_TIMEOUT"
#: Set (to anything but "0"): a standalone process may write its partitions' own tensors, as a
#: server started with ``--writable-partition-data`` (default: read-only, as a server keeps them).
ENV_WRITABLE_PARTITION_DATA = "ASYNCGRAPH_WRITABLE_PARTITION_DATA"


@dataclass(frozen=True)
class ProcessRank:
    """This trainer's place in the job and which launcher said so."""

    rank: int
    world_size: int
    local_rank: int
    source: str  # "torchrun", "slurm" or "default"


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {env[name]!r}") from None


def process_rank(env: Mapping[str, str] | None = None) -> ProcessRank:
    """Rank, world size and local rank from ``torchrun`` (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``; also set by ``asyncgraph.launch``), else ``srun`` (``SLURM_PROCID``,
    ``SLURM_NTASKS``, ``SLURM_LOCALID``), else a single process (0 of 1).

    torchrun's variables win inside an ``srun`` step that runs torchrun, since torchrun's are the
    trainers' own. Raises ``ValueError`` for a non-integer value or ``rank`` outside the world.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        found = ProcessRank(
            _int(env, "RANK"),
            _int(env, "WORLD_SIZE"),
            _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            "torchrun",
        )
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        found = ProcessRank(
            _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_NTASKS"),
            _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            "slurm",
        )
    else:
        return ProcessRank(0, 1, 0, "default")
    if found.world_size < 1 or not 0 <= found.rank < found.world_size or found.local_rank < 0:
        raise ValueError(
            f"{found.source} environment gives rank {found.rank} of world size {found.world_size} "
            f"(local rank {found.local_rank})"
        )
    return found


def read_holder_key(path: str) -> bytes:
    """The holder key in ``path`` (hex, as the launcher writes it); ``ValueError`` if it is not."""
    with open(path) as f:
        text = f.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"holder key file {path} does not hold a hex key") from None
    if not key:
        raise ValueError(f"holder key file {path} is empty")
    return key
