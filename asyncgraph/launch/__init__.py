"""Running a job: the launcher (``python -m asyncgraph.launch``), staging partitions to their
hosts (``stage``), server processes and their command lines (``processes``, ``servers``), the
no-orphans lifeline (``lifeline``) and the readiness probe (``health``).

Nothing is imported eagerly: ``python -m asyncgraph.launch.health`` and the servers' lifeline
stay cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncgraph.lazy import lazy_exports

if TYPE_CHECKING:
    from asyncgraph.launch.cli import build_parser, main
    from asyncgraph.launch.launcher import Launcher, LaunchError
    from asyncgraph.launch.servers import ServerGroup, start_servers

__all__ = ["LaunchError", "Launcher", "ServerGroup", "build_parser", "main", "start_servers"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "build_parser": "asyncgraph.launch.cli",
        "main": "asyncgraph.launch.cli",
        "Launcher": "asyncgraph.launch.launcher",
        "LaunchError": "asyncgraph.launch.launcher",
        "ServerGroup": "asyncgraph.launch.servers",
        "start_servers": "asyncgraph.launch.servers",
    },
)

_ = Any
