"""Names of the environment variables asyncgraph reads and the launcher sets (no imports: the
launcher and servers read them without paying for torch)."""

from __future__ import annotations

__all__ = [
    "ENV_IP_CONFIG",
    "ENV_MALLOC_TUNING",
    "ENV_PART_CONFIG",
    "ENV_RECONNECT_WINDOW",
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
#: Seconds a client keeps reconnecting to a server that went away (default 0: fail at once).
ENV_RECONNECT_WINDOW = "ASYNCGRAPH_RECONNECT_WINDOW"
