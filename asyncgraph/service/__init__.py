"""One partition's operations, reachable the same way wherever the partition lives.

``Partition`` is the interface the client scatters over; ``PartitionService`` runs the ops on an
in-process store (the server answers every request with it) and ``LocalPartition`` offers it to
the client. The remote implementation is ``asyncgraph.client.remote.RemotePartition``.
"""

from asyncgraph.service.base import Partition
from asyncgraph.service.local import LocalPartition, PartitionService, boot_id

__all__ = ["LocalPartition", "Partition", "PartitionService", "boot_id"]
