"""Trainer-side clients: async core, sync facade, ip_config parsing."""

from .async_client import AsyncClient, PartitionEndpoint, split_by_owner
from .connection import Connection
from .ipconfig import IpConfig, ServerEntry
from .sync_client import Client, EventLoopThread

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
