"""Events a protocol session hands to its transport, besides the messages themselves.

Requests (server side) and responses (client side) are delivered as the ``Request``,
``Response`` and ``ErrorResponse`` message objects, so the per-call path builds nothing extra;
the two events below mark the ends of a connection's life.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncgraph.errors import AsyncGraphError
from asyncgraph.protocol.messages import ClientHello, ErrorResponse, Request, Response, ServerHello

__all__ = [
    "CONNECTION_ERROR_ID",
    "ClientEvent",
    "ConnectionFailed",
    "HandshakeComplete",
    "ServerEvent",
]

CONNECTION_ERROR_ID: int = 0
"""Request id of an ErrorResponse that concerns the whole connection, not one request."""


@dataclass(frozen=True, slots=True)
class HandshakeComplete:
    """The handshake succeeded; ``peer_hello`` is the hello the other side sent."""

    peer_hello: ServerHello | ClientHello


@dataclass(frozen=True, slots=True)
class ConnectionFailed:
    """The connection is over: write the session's pending data (the reason, for the peer), then close.

    ``error`` is the typed error every pending and later call on this connection should see.
    """

    error: AsyncGraphError


ServerEvent = Request | HandshakeComplete | ConnectionFailed
ClientEvent = Response | ErrorResponse | HandshakeComplete | ConnectionFailed
