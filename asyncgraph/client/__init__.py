"""Trainer-side clients: async core, sync facade, ip_config parsing.

Attributes load lazily, so ``asyncgraph.client.ipconfig`` (used by the launcher) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncClient": "asyncgraph.client.async_client",
    "PartitionEndpoint": "asyncgraph.client.async_client",
    "split_by_owner": "asyncgraph.client.async_client",
    "Connection": "asyncgraph.client.connection",
    "IpConfig": "asyncgraph.client.ipconfig",
    "ServerEntry": "asyncgraph.client.ipconfig",
    "Client": "asyncgraph.client.sync_client",
    "EventLoopThread": "asyncgraph.client.sync_client",
}

if TYPE_CHECKING:
    from .async_client import AsyncClient, PartitionEndpoint, split_by_owner
    from .connection import Connection
    from .ipconfig import IpConfig, ServerEntry
    from .sync_client import Client, EventLoopThread


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncgraph.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AsyncClient",
    "Client",
    "Connection",
    "EventLoopThread",
    "IpConfig",
    "PartitionEndpoint",
    "ServerEntry",
    "split_by_owner",
]
