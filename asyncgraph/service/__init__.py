"""One partition's operations, reachable the same way wherever the partition lives.

``Partition`` is the interface the client scatters over; ``PartitionService`` runs the ops on an
in-process store (the server answers every request with it). The client's implementations are
``asyncgraph.client.remote.RemotePartition`` (over a socket) and
``asyncgraph.client.local.LocalPartition`` (over a ``PartitionService`` in this process).
"""

from asyncgraph.service.base import Partition
from asyncgraph.service.local import PartitionService, boot_id

__all__ = ["Partition", "PartitionService", "boot_id"]
