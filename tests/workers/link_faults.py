"""A client on one namespace host whose link to the servers' host a test cuts
(tests/test_multihost_faults.py). Prints JSON lines; waits for ``go`` on stdin before the fault.

``link_faults.py timeout HOST:PORT,HOST:PORT SECRET_FILE CALL_TIMEOUT``: one pull after ``go``;
reports the typed error it got (or none) and how long it took.
``link_faults.py storm HOST:PORT,HOST:PORT SECRET_FILE CALL_TIMEOUT SECONDS``: push-adds of
known deltas for SECONDS after ``go`` (a call failing with a typed error is counted as maybe
applied, and the storm goes on), then reads everything back: every acknowledged add must be
there.
``link_faults.py chunks HOST:PORT,HOST:PORT SECRET_FILE CALL_TIMEOUT``: no fault; a pull over
twice ``chunk_bytes`` goes as chunked requests across hosts (and not when chunks are turned
off); reports whether the connections are same-host, the requests each pull wrote, and whether
both pulls gave the same rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from asyncgraph.client import AsyncClient
from asyncgraph.errors import AsyncGraphError

ACC = f"acc{os.getpid()}"  # a fresh tensor per run: the servers outlive one test


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> None:
    mode, servers, secret_file, call_timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    addresses = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in servers.split(","))]
    client = await AsyncClient.connect(
        addresses,
        secret=Path(secret_file).read_bytes().strip(),
        call_timeout=call_timeout,
        use_shared_memory=False,
        reconnect_window=30.0,
    )
    n = client.book.num_nodes
    ids = np.arange(0, n, 7)
    if mode == "storm":
        await client.create_tensor(ACC, "node", [n, 2], "float64")
    say(connected=True)
    await asyncio.to_thread(sys.stdin.readline)  # "go": the test is about to cut the link
    if mode == "chunks":
        from asyncgraph.client.remote import RemotePartition

        remote = [p for p in client.partitions if isinstance(p, RemotePartition)]
        every = np.concatenate([np.arange(n), np.arange(n)[::-1]])  # 2 x 2,708 rows of 5,732 B
        sent = []
        rows = []
        for chunk in (1 << 20, 1 << 40):  # 1 MiB chunks, then none
            for p in remote:
                p.chunk_bytes = chunk
            before = sum(p.conn.requests_written for p in remote)
            rows.append(await client.pull_numpy("node:feat", every))
            sent.append(sum(p.conn.requests_written for p in remote) - before)
        say(same_host=[p.conn.same_host for p in remote], requests=sent,
            equal=bool(np.array_equal(rows[0], rows[1])), row_bytes=int(rows[0][0].nbytes))  # fmt: skip
        await client.close()
        return
    if mode == "timeout":
        t0 = time.monotonic()
        try:
            await client.pull("node:feat", ids)
            say(error=None, elapsed=time.monotonic() - t0)
        except AsyncGraphError as exc:
            say(error=type(exc).__name__, message=str(exc), elapsed=time.monotonic() - t0)
        await client.close()
        return
    seconds = float(sys.argv[5])
    acked = np.zeros((n, 2))
    maybe = np.zeros((n, 2))
    rng = np.random.default_rng(0)
    errors: list[str] = []
    gap = 0.0
    done_at = time.monotonic() + seconds
    while time.monotonic() < done_at:
        batch = rng.integers(0, n, 64)
        vals = rng.integers(1, 5, (64, 2)).astype(np.float64)
        t0 = time.monotonic()
        try:
            await client.push(ACC, batch, vals, op="add")
        except AsyncGraphError as exc:
            errors.append(type(exc).__name__)
            np.add.at(maybe, batch, vals)
            continue
        finally:
            gap = max(gap, time.monotonic() - t0)
        np.add.at(acked, batch, vals)
    got = (await client.pull(ACC, np.arange(n))).numpy()
    lost = int(np.sum(got < acked - 1e-9))
    extra = int(np.sum(got > acked + maybe + 1e-9))
    say(acked=float(acked.sum()), errors=sorted(set(errors)), failed_calls=len(errors), max_call_s=gap,
        lost_rows=lost, unexplained_rows=extra)  # fmt: skip
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
