"""Fixed cost per request: sequential remote calls against a bare echo round trip of the same bytes.

One server pair is started here (``asyncgraph.testing``); the client reaches partition 1 over the
socket only (no shared memory). Measured one after the other in the same run:

* sequential 1-row and 1k-row ``pull`` of the feature tensor from partition 1,
* sequential ``sample_neighbors`` of 1,024 seeds of partition 1, fanout 10,
* the 1-row pull again through the blocking facade (``Client.pull``: the hop to the client's loop
  thread and back included),
* 64 concurrent 1-row pulls (``asyncio.gather``, ``--concurrent``) per round: the round's time,
  pulls per second and the client's socket writes per round (``Connection.writes``: requests
  issued in one loop tick go out in one write), against the echo of 64 requests written at once,
* for each, a bare echo: a uvloop server in a child process that answers a request of the same
  number of bytes with a reply of the same number of bytes as the real call's frames (sizes
  computed with the protocol's own encoder), driven by a blocking-socket client.

The ratio ``call / echo`` is the figure to read (issue 9's targets: 1 row <= 3x, 1k rows <= 1.6x).
On a loaded machine both sides slow down; compare only figures of one run.

Run: ``.venv/bin/python -m benchmarks.fixed_cost [--scale 17] [--calls 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.client import Client
from asyncgraph.protocol.codec import frame_size
from asyncgraph.protocol.messages import Request, Response, encode_message
from asyncgraph.protocol.ops import Op, PullArgs, SampleArgs
from asyncgraph.testing import start_servers
from benchmarks.common import (
    RESULTS,
    add_graph_options,
    graph_npz,
    median_time,
    partitioned,
    wait_for_sampler,
)

_ECHO_SERVER = r"""
import asyncio, socket, struct, sys
import uvloop

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
    def data_received(self, data):
        buf = self.buf
        buf += data
        out = []
        while len(buf) >= 8:
            size, reply = struct.unpack_from("!II", buf)
            if len(buf) < 8 + size:
                break
            del buf[: 8 + size]
            out.append(bytes(reply))
        if out:
            self.t.writelines(out)  # the replies to one read in one write, as our server does

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(3600)

uvloop.run(main())
"""


def echo_round_trip(port: int, request: int, reply: int, calls: int, batch: int = 1) -> float:
    """Median seconds of ``calls`` blocking round trips of ``request`` bytes out, ``reply`` back;
    with ``batch`` > 1 each round trip sends that many requests in one write and reads all
    their replies (the bare form of ``batch`` concurrent calls written together)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = (struct.pack("!II", max(request - 8, 0), reply) + bytes(max(request - 8, 0))) * batch
        total = reply * batch
        view = memoryview(bytearray(max(total, 1)))
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            s.sendall(payload)
            got = 0
            while got < total:
                got += s.recv_into(view[got:], total - got)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def call_round_trip(client: Client, fn: Callable[[], Any], calls: int) -> float:
    """Median seconds of ``calls`` sequential awaits of ``fn()`` on the client's loop."""

    async def run() -> list[float]:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await fn()
            times.append(time.perf_counter() - t0)
        return times

    client.loop.run(run())  # warm-up
    return float(np.median(client.loop.run(run())))


def sync_round_trip(fn: Callable[[], Any], calls: int) -> float:
    """Median seconds of ``calls`` sequential blocking calls ``fn()`` from this thread (the sync
    facade: each call hops to the client's loop thread and back)."""
    return median_time(fn, calls, warmup=min(calls, 200))


def concurrent_case(
    client: Client, echo_port: int, ids: np.ndarray, batch: int, rounds: int, request: int, reply: int
) -> dict[str, Any]:
    """``batch`` concurrent 1-row pulls to partition 1 (``asyncio.gather``) per round: median
    round time, pulls per second, and the client's socket writes per round (when the connection
    counts them) against the bare echo of ``batch`` requests written at once."""
    aio = client.async_client
    conn = aio.partitions[1].conn  # type: ignore[attr-defined]

    async def gathered() -> Any:
        return await asyncio.gather(*(aio.pull_numpy("node:feat", ids) for _ in range(batch)))

    call = call_round_trip(client, gathered, rounds)
    writes = getattr(conn, "writes", None)
    if writes is not None:
        for _ in range(10):
            client.loop.run(gathered())
        writes = (conn.writes - writes) / 10
    bare = echo_round_trip(echo_port, request, reply, rounds, batch=batch)
    print(
        f"pull_1_row_x{batch:<7d} call {call * 1e6:9.1f} us  echo {bare * 1e6:9.1f} us  "
        f"ratio {call / bare:5.2f}  ({batch / call:,.0f} pulls/s; "
        f"{'?' if writes is None else f'{writes:g}'} client writes per round)",
        flush=True,
    )
    return {
        "call_us": round(call * 1e6, 1),
        "echo_us": round(bare * 1e6, 1),
        "call_over_echo": round(call / bare, 2),
        "pulls_per_s": round(batch / call),
        "client_writes_per_round": writes,
    }


def request_bytes(op: str, args: dict[str, Any]) -> int:
    """Bytes of the real request frame (the protocol's own encoder)."""
    return frame_size(encode_message(Request(1, op, args)))


def reply_bytes(result: Any) -> int:
    """Bytes of the real reply frame carrying ``result``."""
    return frame_size(encode_message(Response(1, result)))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fixed_cost", description=__doc__.split("\n\n")[0])
    add_graph_options(p, default_scale=17)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--concurrent", type=int, default=64, help="pulls per round of the concurrent case")
    p.add_argument("--out", type=Path, default=RESULTS / "fixed_cost.json")
    args = p.parse_args()
    part_config = partitioned(graph_npz(args), 2, balance=True)
    echo = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    rows: dict[str, Any] = {}
    try:
        assert echo.stdout is not None
        echo_port = int(echo.stdout.readline())
        with tempfile.TemporaryDirectory(prefix="fixed-cost-") as tmp:
            group = start_servers(part_config, Path(tmp), num_parts=2)
            try:
                wait_for_sampler(group.addresses)
                client = Client.connect(group.addresses, use_shared_memory=False)
                try:
                    aio = client.async_client
                    lo, hi = client.book.node_range(1)
                    rng = np.random.default_rng(0)
                    meta = client.loop.run(aio.tensor_meta("node:feat"))
                    one = np.array([lo + 1], dtype=np.int64)
                    thousand = np.sort(rng.choice(np.arange(lo, hi), 1000, replace=False))
                    seeds = np.sort(rng.choice(np.arange(lo, hi), 1024, replace=False))
                    sampled = client.loop.run(aio.sample_neighbors(seeds, 10, seed=1))
                    row_bytes = int(np.dtype(meta.dtype).itemsize * int(np.prod(meta.row_shape)))
                    cases: dict[str, tuple[Callable[[], Any], int, int]] = {
                        "pull_1_row": (
                            lambda: aio.pull_numpy("node:feat", one),
                            request_bytes(Op.PULL, PullArgs("node:feat", one).encode()),
                            reply_bytes(np.zeros((1, *meta.row_shape), meta.dtype)),
                        ),
                        "pull_1k_rows": (
                            lambda: aio.pull_numpy("node:feat", thousand),
                            request_bytes(Op.PULL, PullArgs("node:feat", thousand).encode()),
                            reply_bytes(np.zeros((1000, *meta.row_shape), meta.dtype)),
                        ),
                        "sample_1024_seeds": (
                            lambda: aio.sample_neighbors(seeds, 10, seed=1),
                            request_bytes(Op.SAMPLE, SampleArgs(seeds, 10, seed=1).encode()),
                            reply_bytes(dict(zip(("src", "dst", "eids"), sampled, strict=True))),
                        ),
                    }
                    sync_case = cases["pull_1_row"]
                    for name, (fn, request, reply) in [*cases.items(), ("pull_1_row_sync", sync_case)]:
                        if name.endswith("_sync"):
                            call = sync_round_trip(lambda: client.pull("node:feat", one), args.calls)
                        else:
                            call = call_round_trip(client, fn, args.calls)
                        bare = echo_round_trip(echo_port, request, reply, args.calls)
                        rows[name] = {
                            "call_us": round(call * 1e6, 1),
                            "echo_us": round(bare * 1e6, 1),
                            "call_over_echo": round(call / bare, 2),
                            "request_bytes": request,
                            "reply_bytes": reply,
                        }
                        print(
                            f"{name:18s} call {call * 1e6:9.1f} us  echo {bare * 1e6:9.1f} us  "
                            f"ratio {call / bare:5.2f}  ({request} B out, {reply} B back)",
                            flush=True,
                        )
                    rows[f"pull_1_row_x{args.concurrent}"] = concurrent_case(
                        client, echo_port, one, args.concurrent, max(args.calls // 8, 50),
                        cases["pull_1_row"][1], cases["pull_1_row"][2],
                    )  # fmt: skip
                    rows["row_bytes"] = row_bytes
                finally:
                    client.close()
            finally:
                group.stop()
    finally:
        echo.kill()
        echo.wait(timeout=10)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
