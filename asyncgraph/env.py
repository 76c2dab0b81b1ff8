"""Names of the environment variables asyncgraph reads and the launcher sets (no imports: the
launcher and servers read them without paying for torch)."""

from __future__ import annotations

__all__ = [
    "ENV_DDP_BACKEND",
    "ENV_DEVICE",
    "ENV_IP_CONFIG",
    "ENV_MALLOC_TUNING",
    "ENV_PART_CONFIG",
    "ENV_SECRET_FILE",
    "ENV_SERVERS",
]

#: Path of the ip_config file (DGL's ``host [port]`` per line, in partition order).
ENV_IP_CONFIG = "ASYNCGRAPH_IP_CONFIG"
#: The same as "host:port,host:port" in partition order, for launchers without a shared file system.
ENV_SERVERS = "ASYNCGRAPH_SERVERS"
#: File holding the shared secret servers require.
ENV_SECRET_FILE = "ASYNCGRAPH_SECRET_FILE"
#: The partition JSON file of the job.
ENV_PART_CONFIG = "ASYNCGRAPH_PART_CONFIG"
#: "0" leaves glibc malloc's thresholds alone (see ``asyncgraph.storage.malloc``).
ENV_MALLOC_TUNING = "ASYNCGRAPH_MALLOC_TUNING"
#: torch.distributed backend the launcher chose for the trainers: "nccl" (GPUs) or "gloo".
ENV_DDP_BACKEND = "ASYNCGRAPH_DDP_BACKEND"
#: The trainer's torch device ("cuda:<LOCAL_RANK>" or "cpu"), set by the launcher and spawn_trainers.
ENV_DEVICE = "ASYNCGRAPH_DEVICE"
