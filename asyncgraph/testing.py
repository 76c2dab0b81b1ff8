"""Helpers for tests and benchmarks: local servers on ephemeral loopback ports.

They live in :mod:`asyncgraph.launch.servers` (``spawn_trainers`` uses them too); this module
keeps the name tests and benchmarks import, and production code never imports it.
"""

from __future__ import annotations

from asyncgraph.launch.servers import (
    PACKAGE_ROOT,
    ServerGroup,
    shm_entries,
    start_servers,
    subprocess_env,
)

__all__ = ["PACKAGE_ROOT", "ServerGroup", "shm_entries", "start_servers", "subprocess_env"]
