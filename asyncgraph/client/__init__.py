"""Trainer-side clients: async core, sync facade, ip_config parsing.

Attributes load lazily, so ``asyncgraph.client.ipconfig`` (used by the launcher) never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncgraph.lazy import lazy_exports

_EXPORTS = {
    "AsyncClient": "asyncgraph.client.async_client",
    "RemotePartition": "asyncgraph.client.remote",
    "scatter": "asyncgraph.client.scatter",
    "split_by_owner": "asyncgraph.client.scatter",
    "Connection": "asyncgraph.client.connection",
    "IpConfig": "asyncgraph.client.ipconfig",
    "ServerEntry": "asyncgraph.client.ipconfig",
    "Client": "asyncgraph.client.sync_client",
    "EventLoopThread": "asyncgraph.client.sync_client",
}

if TYPE_CHECKING:
    from .async_client import AsyncClient
    from .connection import Connection
    from .ipconfig import IpConfig, ServerEntry
    from .remote import RemotePartition
    from .scatter import scatter, split_by_owner
    from .sync_client import Client, EventLoopThread


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "AsyncClient",
    "Client",
    "Connection",
    "EventLoopThread",
    "IpConfig",
    "RemotePartition",
    "ServerEntry",
    "scatter",
    "split_by_owner",
]
