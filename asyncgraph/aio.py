"""The async API: ``client = await asyncgraph.aio.connect(ip_config)``.

Use it inside an event loop you own (asyncio services, Jupyter's loop); scripts use the blocking
API (``asyncgraph.initialize`` / ``DistGraph``), which runs this same client on a loop thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.client.ipconfig import IpConfig


async def connect(
    ip_config: str | Path | Sequence[tuple[str, int]],
    *,
    secret: bytes | None = None,
    **kwargs: Any,
) -> AsyncClient:
    """Connect to every server of a job: an ip_config file or ``[(host, port), ...]`` in partition order."""
    servers = IpConfig.load(ip_config).addresses() if isinstance(ip_config, str | Path) else list(ip_config)
    return await AsyncClient.connect(servers, secret=secret, **kwargs)


def standalone(part_config: str | Path) -> AsyncClient:
    """An in-process client over every partition of ``part_config`` (no server)."""
    return AsyncClient.standalone(part_config)


__all__ = ["AsyncClient", "connect", "standalone"]
