"""Which client connection the request being handled came from.

Handlers see only a request's arguments; state that belongs to a client (a barrier arrival, the
connections of a tensor holder) also needs the connection it came over, which a client cannot
forge. The transport sets ``CURRENT_CONNECTION`` around each synchronous handler call;
``current_connection()`` reads it (None in process, e.g. handlers driven by a test or a replay).
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["CURRENT_CONNECTION", "current_connection"]

#: The ``ServerConnection`` whose request is being handled, while its handler runs.
CURRENT_CONNECTION: ContextVar[object | None] = ContextVar("asyncgraph_connection", default=None)


def current_connection() -> object | None:
    """The connection of the request being handled, or None outside a request."""
    return CURRENT_CONNECTION.get()
