"""Only a server that proves it serves this partition may register as its replica (issues 22, 32).

Before, ``add_replica`` took any port and pid from any authenticated client (port 9, pid 1 was
accepted and listed to every client, which then sent reads there; then a 30-line fake with a
computed fingerprint was). A primary now registers a replica only when

- it presents the partition's fingerprint (``asyncgraph.server.durable.partition_fingerprint``:
  its config and structure files), the same the primary computes;
- the request comes from this host (a replica maps this primary's memory);
- it is reachable and proves the secret: the primary connects back to the announced port,
  expecting a replica of this partition, and the server there must prove the job's secret in
  the handshake (``protocol/handshake.py``); its ``info`` must name *this* primary (instance);
- the announced pid is that server and maps this primary's memory (``server/replica_proof.py``:
  it listens on the port, the primary's lock memfd and structure are in its maps).

A refusal is a ``ReplicaProofError`` naming the failed check; nothing is listed.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from asyncgraph.errors import AsyncGraphError, AuthenticationError, ReplicaProofError
from asyncgraph.protocol.ops import AddReplicaArgs, Op
from asyncgraph.server.replica_proof import unproven
from asyncgraph.storage.memfd import SharedArray
from asyncgraph.storage.rwlock import SharedRWLock

if TYPE_CHECKING:
    from asyncgraph.net.tls import TlsConfig
    from asyncgraph.storage.store import PartitionStore

__all__ = ["ReplicaCheck", "fingerprint_of"]

CHECK_TIMEOUT = 10.0
log = logging.getLogger("asyncgraph.server")


def fingerprint_of(part_config: Path, part_id: int) -> Callable[[], str]:
    """The partition's fingerprint: the one its config records (issue 34: the partitioner
    computed it), else computed once on first use by hashing the structure files (logged)."""
    from asyncgraph.partition.fingerprint import partition_fingerprint, recorded_fingerprint

    recorded = recorded_fingerprint(part_config, part_id)
    if recorded is not None:
        return lambda: recorded

    def compute() -> str:
        log.info(
            "%s records no fingerprint for partition %d (partitioned before asyncgraph recorded them): "
            "hashing its structure files",
            part_config,
            part_id,
        )
        return partition_fingerprint(part_config, part_id)

    return functools.cache(compute)


class ReplicaCheck:
    """Verifies an ``add_replica`` request before the primary lists the replica."""

    def __init__(
        self,
        *,
        part_id: int,
        instance: str,
        fingerprint: Callable[[], str],
        secret: bytes | None,
        store: PartitionStore | None = None,
        tls: TlsConfig | None = None,
        timeout: float = CHECK_TIMEOUT,
    ) -> None:
        self.tls = tls
        self.store = store  # its structure memfds: a replica maps them
        self.part_id = part_id
        self.instance = instance
        self.fingerprint = fingerprint
        self.secret = secret
        self.timeout = timeout

    async def __call__(self, a: AddReplicaArgs, peer: str | None) -> None:
        """Return when ``a`` is a proven replica; ``ReplicaProofError`` saying why not."""
        from asyncgraph.net.connection import Connection
        from asyncgraph.protocol.info import ServerInfo

        mine = await asyncio.to_thread(self.fingerprint)
        if a.fingerprint != mine:
            raise ReplicaProofError(
                f"add_replica: the announced server presents partition fingerprint {a.fingerprint!r}, "
                f"this partition's is {mine!r}; only a server of this partition may register"
            )
        host = ((peer or "127.0.0.1").rpartition(":")[0] or "127.0.0.1").strip("[]")
        where = f"{host}:{a.port}"
        if not _this_host(host) or a.pid == os.getpid():
            raise ReplicaProofError(
                f"add_replica: a replica runs on its primary's host as its own process; {where} "
                f"(pid {a.pid}) is not one"
            )
        try:
            conn = await Connection.open(
                host, a.port, graph_name=None, secret=self.secret, timeout=self.timeout,
                part_id=self.part_id, role="replica", tls=self.tls,
            )  # fmt: skip
            try:
                info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, self.timeout))
            finally:
                conn.close()
        except (AsyncGraphError, OSError) as exc:
            refused = isinstance(exc, AuthenticationError)
            what = "a replica of this server" if refused else "reachable as a server"
            raise ReplicaProofError(f"add_replica: {where} is not {what} ({exc})") from None
        if (
            info.role != "replica"
            or info.part_id != self.part_id
            or info.primary_instance != self.instance
        ):
            raise ReplicaProofError(
                f"add_replica: {where} is not a replica of this server (role {info.role!r}, "
                f"partition {info.part_id}, primary instance {info.primary_instance!r})"
            )
        why = await asyncio.to_thread(unproven, a.pid, a.port, self._memory())
        if why is not None:
            raise ReplicaProofError(f"add_replica: {where} is not a replica of this server: {why}")

    def _memory(self) -> set[int]:
        """Inodes of what every replica maps of this primary: the lock's memfd (only processes
        sent it can map it) and the structure (memfds, or the partition files served in place)."""
        if self.store is None:
            return set()
        arrays = self.store.structure_arrays.values()
        inodes = {os.fstat(a.fd).st_ino for a in arrays if isinstance(a, SharedArray) and a.array.nbytes}
        lock = self.store.lock
        if isinstance(lock, SharedRWLock):
            inodes.add(os.fstat(lock.fd).st_ino)
        return inodes


def _this_host(host: str) -> bool:
    """Whether ``host`` (an IP address) is one of this host's own addresses."""
    import psutil

    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        return False
    return any(a.address.split("%")[0] == host for addrs in psutil.net_if_addrs().values() for a in addrs)
