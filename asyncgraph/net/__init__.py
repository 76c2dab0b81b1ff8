"""The asyncio connection to a server, below both sides: the client's partitions and a replica
server's link to its primary use it, so ``server/`` never imports ``client/``.

``Connection`` multiplexes requests over one authenticated socket (the protocol is the sans-I/O
``asyncgraph.protocol.ClientSession``); ``open_retrying`` opens one to a server that may still be
starting.
"""

from asyncgraph.net.connection import COALESCE_BYTES, COALESCE_REQUESTS, Connection, ConnectionState
from asyncgraph.net.dial import ATTEMPT_TIMEOUT, MAX_BACKOFF, open_retrying

__all__ = [
    "ATTEMPT_TIMEOUT",
    "COALESCE_BYTES",
    "COALESCE_REQUESTS",
    "MAX_BACKOFF",
    "Connection",
    "ConnectionState",
    "open_retrying",
]
