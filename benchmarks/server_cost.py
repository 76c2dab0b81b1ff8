"""The server's fixed CPU cost per request (issue 9), in three views, one after the other:

* in-process: ``PartitionStore.pull`` and ``PartitionService.pull`` (with a server's limits) of
  1 and 1,000 rows of ``node:feat`` on a shared-memory store (best of 5 timeit runs),
* server CPU: a ``ServerConnection`` over a stand-in transport fed whole request frames (what the
  event loop runs per request: session decode, handler, store, encode, write; no syscalls), median
  per 1-row pull, 1-row push and 16-seed sample,
* served: sequential 1-row pulls from a real server over one blocking socket driven by
  ``ClientSession`` (no client library work besides the protocol), median round trip.

Compare figures of one run only (the machine's load moves them). Run:
``.venv/bin/python -m benchmarks.server_cost [--part-config CONFIG.json] [--calls 3000]``.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
import timeit
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.partition import load_partition
from asyncgraph.protocol import ClientSession
from asyncgraph.protocol.messages import Response
from asyncgraph.server.handlers import RequestHandlers
from asyncgraph.server.transport import ServerConnection
from asyncgraph.service.limits import WorkLimits
from asyncgraph.service.local import PartitionService
from asyncgraph.storage.store import PartitionStore
from asyncgraph.testing import start_servers
from benchmarks.common import RESULTS, add_graph_options, graph_npz, partitioned


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} us"


def in_process(store: PartitionStore, lo: int, hi: int) -> dict[str, float]:
    service = PartitionService(store, limits=WorkLimits())
    out: dict[str, float] = {}
    one = np.array([lo + 1], dtype=np.int64)
    many = np.random.default_rng(0).integers(lo, hi, 1000)
    for label, fn, number in (
        ("store.pull    1 row ", lambda: store.pull("node:feat", one), 20000),
        ("service.pull  1 row ", lambda: service.pull("node:feat", one), 20000),
        ("store.pull    1k rows", lambda: store.pull("node:feat", many), 2000),
        ("service.pull  1k rows", lambda: service.pull("node:feat", many), 2000),
    ):
        best = min(timeit.repeat(fn, number=number, repeat=5)) / number
        print(f"in-process   {label}  {_us(best)}", flush=True)
        out[" ".join(label.split())] = round(best * 1e6, 2)
    return out


class _Transport:
    """What ``ServerConnection`` uses of an asyncio transport; replies are dropped."""

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 0)

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def writelines(self, pieces: Any) -> None:
        self.last = pieces

    def close(self) -> None:
        pass


def _join(pieces: Any) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def server_cpu(store: PartitionStore, lo: int, hi: int, calls: int) -> dict[str, float]:
    handlers = RequestHandlers(store, num_clients=1, limits=WorkLimits())
    conn = ServerConnection(
        handlers, graph_name=store.graph_name, part_id=store.part_id, secret=None, max_frame_size=1 << 30
    )
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    client = ClientSession(graph_name=None, secret=None)
    client.receive_data(_join(transport.last))  # server hello
    hello = _join(client.data_to_send())
    buf = conn.get_buffer(len(hello))
    buf[: len(hello)] = hello
    conn.buffer_updated(len(hello))
    client.receive_data(_join(transport.last))  # hello result
    rng = np.random.default_rng(0)
    row = np.ones((1, *store.tensor_meta("node:feat").row_shape), store.tensor_meta("node:feat").dtype)
    cases = {
        "pull 1 row ": lambda: ("pull", {"name": "node:feat", "ids": rng.integers(lo, hi, 1)}),
        "push 1 row ": lambda: (
            "push",
            {"name": "node:feat", "ids": rng.integers(lo, hi, 1), "values": row, "rid": uuid.uuid4().hex},
        ),
        "sample 16x10": lambda: ("sample", {"seeds": rng.integers(lo, hi, 16), "fanout": 10, "seed": 1}),
    }
    out: dict[str, float] = {}
    for label, make in cases.items():
        frames = [_join(client.send_request(*make())[1]) for _ in range(calls)]
        times = []
        for frame in frames:
            buf = conn.get_buffer(len(frame))
            t0 = time.perf_counter()
            buf[: len(frame)] = frame
            conn.buffer_updated(len(frame))
            times.append(time.perf_counter() - t0)
        print(f"server CPU   {label}          {_us(statistics.median(times))} (median)", flush=True)
        out[" ".join(label.split())] = round(statistics.median(times) * 1e6, 2)
    return out


def served(part_config: Path, calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="server-cost-") as tmp:
        group = start_servers(
            part_config, Path(tmp), num_parts=load_partition(part_config, 0).book.num_partitions()
        )
        try:
            sock = socket.create_connection(group.addresses[0], timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = ClientSession(graph_name=None, secret=None)

            def receive() -> list[Any]:
                buf = session.get_buffer(1 << 16)
                n = sock.recv_into(buf)
                if not n:
                    raise ConnectionError("server closed the connection")
                return session.buffer_updated(n)

            while session.state.value != "ready":
                receive()
                sock.sendall(_join(session.data_to_send()))
            rng = np.random.default_rng(0)
            lo, hi = load_partition(part_config, 0).book.node_range(0)
            times = []
            for i in range(calls + 200):
                rid, pieces = session.send_request(
                    "pull", {"name": "node:feat", "ids": rng.integers(lo, hi, 1)}
                )
                t0 = time.perf_counter()
                sock.sendall(_join(pieces))
                while not any(type(ev) is Response and ev.id == rid for ev in receive()):
                    pass
                if i >= 200:  # the first calls warm up
                    times.append(time.perf_counter() - t0)
            sock.close()
        finally:
            group.stop()
    print(
        f"served       pull 1 row round trip  {_us(statistics.median(times))} (median of {calls})", flush=True
    )
    return {"pull 1 row round trip": round(statistics.median(times) * 1e6, 2)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.server_cost", description=__doc__.split("\n\n")[0])
    add_graph_options(p, default_scale=17)
    p.add_argument("--part-config", type=Path, help="an existing partition config (else --graph/--scale)")
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--out", type=Path, default=RESULTS / "server_cost.json")
    args = p.parse_args()
    part_config = args.part_config or partitioned(graph_npz(args), 2, balance=True)
    part = load_partition(part_config, 0)
    lo, hi = part.book.node_range(0)
    with PartitionStore.from_partition(part, shared=True) as store:
        results = {
            "in_process_us": in_process(store, lo, hi),
            "server_cpu_us": server_cpu(store, lo, hi, args.calls),
        }
    del part
    results["served_us"] = served(part_config, args.calls)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"part_config": str(part_config), "calls": args.calls, **results}, indent=2) + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
