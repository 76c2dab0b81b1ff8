"""Trainer-side clients: async core, sync facade, ip_config parsing.

Attributes load lazily, so ``asyncgraph.client.ipconfig`` (used by the launcher) never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncgraph.lazy import lazy_exports

_EXPORTS = {
    "AsyncClient": "asyncgraph.client.async_client",
    "RemotePartition": "asyncgraph.client.remote",
    "SampledRows": "asyncgraph.service.base",
    "scatter": "asyncgraph.client.scatter",
    "split_by_owner": "asyncgraph.client.scatter",
    "Connection": "asyncgraph.net.connection",
    "LocalPartition": "asyncgraph.client.local",
    "Traffic": "asyncgraph.client.traffic",
    "IpConfig": "asyncgraph.client.ipconfig",
    "ServerEntry": "asyncgraph.client.ipconfig",
    "Client": "asyncgraph.client.sync_client",
    "EventLoopThread": "asyncgraph.client.loop_thread",
}

if TYPE_CHECKING:
    from asyncgraph.net.connection import Connection
    from asyncgraph.service.base import SampledRows

    from .async_client import AsyncClient
    from .ipconfig import IpConfig, ServerEntry
    from .local import LocalPartition
    from .loop_thread import EventLoopThread
    from .remote import RemotePartition
    from .scatter import scatter, split_by_owner
    from .sync_client import Client
    from .traffic import Traffic


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "AsyncClient",
    "Client",
    "Connection",
    "EventLoopThread",
    "IpConfig",
    "LocalPartition",
    "RemotePartition",
    "SampledRows",
    "ServerEntry",
    "Traffic",
    "scatter",
    "split_by_owner",
]
