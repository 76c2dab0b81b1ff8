"""A lean open-loop generator for ``serve_bench`` (``--generator frames``, the default).

Every request frame (``serve/wire.py``'s ``infer``, one node) is encoded before the clock starts
and written at its scheduled time straight to one of ``connections`` sockets (an
``asyncio.BufferedProtocol``: no task or future per request); answers are matched by ``id`` as they are
parsed. Latency runs from the request's scheduled time to its answer being parsed
(coordinated-omission-correct), as with ``--generator client`` (``AsyncInferenceClient``, one
task per request), which costs the generator ~0.25 of a core at 1,000 requests/s on the same
two cores as the service, and adds its own loop's delays to every figure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from asyncgraph.protocol.codec import decode_frame, encode_frame_bytes
from asyncgraph.protocol.framing import FrameReader


@dataclass
class Offered:
    """What one rate's requests got: per request the latency and how late it was sent (seconds,
    NaN where it failed or was not sent), errors by code, the seconds the rate took, and when
    its first request was scheduled (``perf_counter``)."""

    latencies: np.ndarray
    late: np.ndarray
    errors: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    elapsed: float = 0.0
    start: float = 0.0


class _Answers(asyncio.BufferedProtocol):
    """One connection's answers: frames parsed as they arrive (the graph servers' incremental
    ``FrameReader``), each recorded by its ``id``."""

    def __init__(self, offered: Offered, scheduled: np.ndarray, out_dim: int, done: asyncio.Event) -> None:
        self.offered, self.scheduled, self.out_dim, self.done = offered, scheduled, out_dim, done
        self.frames = FrameReader()
        self.pending = 0
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.done.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.frames.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        now = time.perf_counter()
        for body in self.frames.buffer_updated(nbytes):
            self._answer(decode_frame(body), now)

    def _answer(self, msg: Any, now: float) -> None:
        k = int(msg["id"])
        self.pending -= 1
        offered = self.offered
        output = msg.get("output")
        if msg.get("ok") and isinstance(output, np.ndarray) and output.shape == (1, self.out_dim):
            offered.latencies[k] = now - self.scheduled[k]
        else:
            code = str(msg.get("code", "malformed answer"))
            offered.errors[code] = offered.errors.get(code, 0) + 1
        if self.pending == 0:
            self.done.set()


async def offer_frames(
    host: str, port: int, rate: float, seconds: float, connections: int, nodes: np.ndarray, out_dim: int
) -> Offered:
    """Offer ``nodes`` (one request each) at ``rate`` per second over ``connections`` sockets."""
    loop = asyncio.get_running_loop()
    total = int(rate * seconds)
    offered = Offered(np.full(total, np.nan), np.full(total, np.nan))
    frames = [
        encode_frame_bytes({"op": "infer", "id": k, "nodes": nodes[k : k + 1], "timeout_ms": 5000.0})
        for k in range(total)
    ]
    t0 = time.perf_counter() + 0.05
    scheduled = t0 + np.arange(total) / rate
    offered.start = t0
    done = asyncio.Event()
    conns: list[_Answers] = []
    for _ in range(connections):
        _, proto = await loop.create_connection(
            lambda: _Answers(offered, scheduled, out_dim, done), host, port
        )
        conns.append(proto)
    max_pending = 4096 // connections
    for k in range(total):
        delay = scheduled[k] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = conns[k % connections]
        if conn.pending >= max_pending or conn.transport is None or conn.transport.is_closing():
            offered.dropped += 1
            continue
        offered.late[k] = time.perf_counter() - scheduled[k]
        conn.pending += 1
        conn.transport.write(frames[k])
    end = time.perf_counter() + 30

    def waiting() -> bool:  # answers still to come on an open connection
        return any(c.pending and not c.lost.done() for c in conns)

    while waiting() and time.perf_counter() < end:
        done.clear()
        if waiting():
            try:
                await asyncio.wait_for(done.wait(), end - time.perf_counter())
            except TimeoutError:
                break
    offered.elapsed = time.perf_counter() - t0
    unanswered = sum(c.pending for c in conns)
    if unanswered:
        offered.errors["unanswered"] = unanswered
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    await asyncio.gather(*(c.lost for c in conns))
    return offered
