"""Which client connection the request being handled came from.

Handlers see only a request's arguments; state that belongs to a client (a barrier arrival, the
connections of a tensor holder) also needs the connection it came over, which a client cannot
forge. The transport sets ``CURRENT_CONNECTION`` around each synchronous handler call;
``current_connection()`` reads it (None in process, e.g. handlers driven by a test or a replay).
"""

from __future__ import annotations

from contextvars import ContextVar

from asyncgraph.errors import HolderError

__all__ = ["CURRENT_CONNECTION", "bound_holder", "current_connection"]

#: The ``ServerConnection`` whose request is being handled, while its handler runs.
CURRENT_CONNECTION: ContextVar[object | None] = ContextVar("asyncgraph_connection", default=None)


def current_connection() -> object | None:
    """The connection of the request being handled, or None outside a request."""
    return CURRENT_CONNECTION.get()


def bound_holder(op: str, named: str | None) -> str | None:
    """The holder a request acts as: its connection's (bound by the hello, issue 32).

    A request may repeat its connection's holder or name none (then it acts as its connection's,
    None for an anonymous one); naming another raises ``HolderError`` and changes nothing.
    Outside a connection (a replay, in-process use) the named holder stands.
    """
    connection = current_connection()
    if connection is None:
        return named
    mine: str | None = getattr(connection, "holder", None)
    if named is not None and named != mine:
        raise HolderError(
            f"{op}: this connection is holder {mine!r} (named in its hello) and may not act as "
            f"holder {named[:128]!r}; one connection is one client, and acts only as itself"
        )
    return mine
