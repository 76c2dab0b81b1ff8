"""The primary's list of replica servers of its partition on this host (``add_replica``)."""

from __future__ import annotations

import logging

from asyncgraph.launch.processes import process_alive

log = logging.getLogger("asyncgraph.server")

__all__ = ["ReplicaRegistry"]


class ReplicaRegistry:
    """Replica servers that announced themselves: port -> pid; dead ones are forgotten when read."""

    def __init__(self) -> None:
        self._pids: dict[int, int] = {}

    def add(self, port: int, pid: int) -> list[int]:
        """Record a replica; returns the live replicas' ports."""
        self._pids[port] = pid
        log.info("replica server pid %d on port %d", pid, port)
        return self.live()

    def live(self) -> list[int]:
        """Ports of announced replicas whose process still runs."""
        for port, pid in list(self._pids.items()):
            if not process_alive(pid):
                del self._pids[port]
        return sorted(self._pids)
