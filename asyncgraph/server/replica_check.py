"""Only a server that proves it serves this partition may register as its replica (issue 22).

Before, ``add_replica`` took any port and pid from any authenticated client (port 9, pid 1 was
accepted and listed to every client, which then sent reads there). A primary now registers a
replica only when

- it presents the partition's fingerprint (``asyncgraph.server.durable.partition_fingerprint``:
  its config and structure files), the same the primary computes, and
- it is reachable: the primary connects back to the announced port at the address the request
  came from, completes the handshake (with the job's secret) and asks ``info``: the answer must
  be a replica of this partition attached to *this* primary (its instance).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path

from asyncgraph.errors import AsyncGraphError, InvalidRequestError
from asyncgraph.protocol.ops import AddReplicaArgs, Op

__all__ = ["ReplicaCheck", "fingerprint_of"]

CHECK_TIMEOUT = 10.0


def fingerprint_of(part_config: Path, part_id: int) -> Callable[[], str]:
    """The partition's fingerprint, computed once on first use (it hashes the structure files)."""
    from asyncgraph.server.durable import partition_fingerprint

    return functools.cache(lambda: partition_fingerprint(part_config, part_id))


class ReplicaCheck:
    """Verifies an ``add_replica`` request before the primary lists the replica."""

    def __init__(
        self,
        *,
        part_id: int,
        instance: str,
        fingerprint: Callable[[], str],
        secret: bytes | None,
        timeout: float = CHECK_TIMEOUT,
    ) -> None:
        self.part_id = part_id
        self.instance = instance
        self.fingerprint = fingerprint
        self.secret = secret
        self.timeout = timeout

    async def __call__(self, a: AddReplicaArgs, peer: str | None) -> None:
        """Return when ``a`` is a proven replica; ``InvalidRequestError`` saying why not."""
        from asyncgraph.net.connection import Connection
        from asyncgraph.protocol.info import ServerInfo

        mine = await asyncio.to_thread(self.fingerprint)
        if a.fingerprint != mine:
            raise InvalidRequestError(
                f"add_replica: the announced server presents partition fingerprint {a.fingerprint!r}, "
                f"this partition's is {mine!r}; only a server of this partition may register"
            )
        host = (peer or "127.0.0.1").rpartition(":")[0] or "127.0.0.1"
        where = f"{host}:{a.port}"
        try:
            conn = await Connection.open(
                host.strip("[]"), a.port, graph_name=None, secret=self.secret, timeout=self.timeout
            )
            try:
                info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, self.timeout))
            finally:
                conn.close()
        except (AsyncGraphError, OSError) as exc:
            raise InvalidRequestError(f"add_replica: {where} is not reachable as a server ({exc})") from None
        if (
            info.role != "replica"
            or info.part_id != self.part_id
            or info.primary_instance != self.instance
        ):
            raise InvalidRequestError(
                f"add_replica: {where} is not a replica of this server (role {info.role!r}, "
                f"partition {info.part_id}, primary instance {info.primary_instance!r})"
            )
