"""The soak's identity abuse (issue 32 item 6): a trainer's seat, holding one holder's key only.

Each round the abuser, given the key of holder ``abuser-a`` (what the launcher gives a trainer)
but not the cluster secret, opens connections as 20 invented holders (its key, then a key made
up for each), once with its key as if it were the cluster secret, and then ``per_holder + 1``
connections as its own holder. Every invented hello must be refused (``AuthenticationError``)
and the connection past the cap told so; anything else is an accepted abuse.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from asyncgraph.errors import AsyncGraphError, AuthenticationError, ServerUnavailableError
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.handshake import holder_key
from asyncgraph.protocol.ops import Op

__all__ = ["INVENTED_PER_ROUND", "invented_holders"]

#: Invented holders tried per round (the issue's attack: 20 of them against a cap of 4).
INVENTED_PER_ROUND = 20

Note = Callable[[str, "BaseException | None"], None]


async def _attempt(host: str, port: int, what: str, note: Note, **credentials: object) -> None:
    """One hello that must be refused with ``AuthenticationError``; a server being killed is neither."""
    try:
        conn = await Connection.open(host, port, graph_name=None, timeout=5.0, **credentials)  # type: ignore[arg-type]
    except AuthenticationError as exc:
        note(what, exc)
        return
    except (ServerUnavailableError, OSError):
        return
    conn.close()
    note(what, None)


async def invented_holders(
    addresses: list[tuple[str, int]], secret: bytes, per_holder: int, note: Note, until: float
) -> None:
    """Rounds of the attack above on server 0 until ``until`` (the loop's clock)."""
    loop = asyncio.get_running_loop()
    host, port = addresses[0]
    mine = holder_key(secret, "abuser-a")
    rnd = 0
    while loop.time() < until:
        rnd += 1
        for i in range(INVENTED_PER_ROUND):
            invented = f"invented-{rnd}-{i}"
            await _attempt(host, port, "invented holder", note, holder=invented, holder_key=mine)
            await _attempt(host, port, "invented holder", note, holder=invented, holder_key=bytes(32))
        await _attempt(host, port, "holder key as the secret", note, secret=mine)
        opened: list[Connection] = []
        try:
            for _ in range(per_holder + 1):
                with contextlib.suppress(ServerUnavailableError, OSError):
                    opened.append(await Connection.open(host, port, graph_name=None, timeout=5.0,
                                                        holder="abuser-a", holder_key=mine))  # fmt: skip
            if len(opened) == per_holder + 1:  # all opened: the last must be told the cap
                try:
                    for conn in opened:
                        await conn.call(Op.PING, {}, 5.0)
                    note("past the per-holder cap", None)
                except ServerUnavailableError as exc:
                    if "--max-connections-per-holder" in str(exc):
                        note("past the per-holder cap", exc)
                except AsyncGraphError:
                    pass
        finally:
            for conn in opened:
                conn.close()
        await asyncio.sleep(0.2)
