"""Bounded fault soak: servers are SIGKILLed and restarted under load; no acknowledged write lost.

2 servers (``--state-dir`` + ``--wal``), ``--clients`` clients in this process (each its own
connections, reconnect window 30 s) running a mixed load (pull, push-add of known deltas,
neighbour sampling) for ``--seconds``; every ``--kill-every`` seconds a random server is killed
with SIGKILL and restarted on its port from its state folder. At the end the tensor is compared
with the model of acknowledged adds. Prints and writes (``benchmarks/results/faults.json``)
requests done, retried and failed, acknowledged writes lost (must be 0), and latency p50/p99
outside and during recovery (a request is "during recovery" when it started between a kill and
one second after the restarted server was ready).

    python -m benchmarks.faults --graph examples/data/cora.npz --seconds 45 --kill-every 10

``--abuse`` (issue 22) adds abusers to the same run, each in its own client: NaN/inf gradients,
pushes into and deletes of the partition's own data, optimizer state for features, snapshot
epochs of 2^64-1, ``add_replica`` of port 9, uint16 IDs, floods of tiny tensors up to
``--max-tensors``, of connections up to ``--max-connections``, of silent or huge-header
clients on the metrics port, and (issue 32) 1 MiB tensor and barrier names, a holder with a
newline, a barrier that never times out, and a client holding one holder's key only (as the
launcher's trainers do) that invents 20 holders a round against ``--max-connections-per-holder
4`` (``benchmarks/faults_holders.py``; with ``--abuse`` the servers have a secret and
``--require-holder-keys``). It reports the refusals by error type (every
abuse must be refused with its typed error), errors the normal load saw, and each server's RSS
every second (``rss_growth``: the last quarter's mean over the first quarter's, target within
10%). Hostile input to the partitioner and the stager is its own list:
``python -m benchmarks.faults_inputs``.

    python -m benchmarks.faults --graph examples/data/cora.npz --seconds 60 --kill-every 15 --abuse \
        --out benchmarks/results/faults-abuse.json

``--failpoints`` (issue 32; on with ``--abuse``) arms a failure point of the snapshot and WAL
protocol on each server, restarts a server that died at one with the next point armed, snapshots
every ``--snapshot-every`` seconds, and at the end SIGKILLs and restores both servers and compares
the restored tensor with the model too (``benchmarks/faults_points.py``): no acknowledged write
lost, none applied twice (``rows_above_model``, ``restored_rows_above_model``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph import failpoints
from asyncgraph.client import AsyncClient
from asyncgraph.errors import AsyncGraphError, ServerUnavailableError
from asyncgraph.protocol.ops import AddReplicaArgs, BarrierArgs, Op, ReleaseTensorsArgs
from asyncgraph.testing import ServerGroup, start_servers
from benchmarks.common import RESULTS, add_graph_options, graph_npz, partitioned
from benchmarks.faults_holders import invented_holders
from benchmarks.faults_points import PointCrashes, keep_crashing, restored_after_kill, snapshotter

WIDTH = 8


class Soak:
    """Shared counters, the acknowledged-writes model and the recovery windows."""

    def __init__(self, num_nodes: int) -> None:
        self.acked = np.zeros((num_nodes, WIDTH))
        self.unacked = np.zeros((num_nodes, WIDTH))
        self.done = 0
        self.failed = 0
        self.latencies: list[tuple[float, float]] = []  # (start, seconds)
        self.windows: list[tuple[float, float]] = []
        self.kills = 0
        self.errors: list[str] = []

    def in_recovery(self, t: float) -> bool:
        return any(a <= t <= b for a, b in self.windows)


async def worker(client: AsyncClient, soak: Soak, seed: int, until: float) -> None:
    rng = np.random.default_rng(seed)
    n = client.book.num_nodes
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        ids = rng.integers(0, n, 128)
        kind = rng.integers(0, 3)
        t0 = time.monotonic()
        try:
            if kind == 0:
                await client.pull_numpy("soak", ids)
            elif kind == 1:
                vals = rng.integers(1, 4, (128, WIDTH)).astype(np.float64)
                try:
                    await client.push("soak", ids, vals, op="add")
                except AsyncGraphError:
                    np.add.at(soak.unacked, ids, vals)
                    raise
                np.add.at(soak.acked, ids, vals)
            else:
                await client.sample_neighbors(ids[:32], 10)
        except AsyncGraphError as exc:
            soak.failed += 1
            soak.errors.append(f"{type(exc).__name__}: {exc}")
            continue
        soak.done += 1
        soak.latencies.append((t0, time.monotonic() - t0))


def killer(group: ServerGroup, soak: Soak, every: float, until: float, stop: threading.Event) -> None:
    rng = random.Random(0)
    while not stop.wait(every) and time.monotonic() + 5 < until:
        victim = rng.randrange(len(group.procs))
        t0 = time.monotonic()
        group.kill(victim, signal.SIGKILL)
        group.restart(victim)
        soak.kills += 1
        soak.windows.append((t0, time.monotonic() + 1.0))


class Abuse:
    """What the abusers tried, what the servers answered, and the servers' RSS over time."""

    def __init__(self) -> None:
        self.refused: dict[str, int] = {}  # typed refusals, by error type
        self.accepted: list[str] = []  # abuses a server did NOT refuse (must stay empty)
        self.rss: list[list[tuple[int, int]]] = []  # per second: each server's (pid, RSS bytes)

    def note(self, what: str, exc: BaseException | None) -> None:
        if exc is None:
            self.accepted.append(what)
            return
        key = type(exc).__name__
        self.refused[key] = self.refused.get(key, 0) + 1


async def _try(abuse: Abuse, what: str, call: Any) -> None:
    try:
        await call
    except ServerUnavailableError:
        return  # a server being killed: neither refused nor accepted
    except AsyncGraphError as exc:
        abuse.note(what, exc)
        return
    abuse.note(what, None)


async def abuser(client: AsyncClient, abuse: Abuse, until: float, max_tensors: int) -> None:
    """One round of every request-level abuse per iteration (issue 22 items 5, 6, 8, 9, 11, 13;
    issue 32 item 6: acting as another holder)."""
    loop = asyncio.get_running_loop()
    n = client.book.num_nodes
    feat = await client.tensor_meta("node:feat")
    await client.create_tensor("abuse_emb", "node", [n, 4], "float32")
    conn = client.partitions[0].conn  # type: ignore[attr-defined]
    rnd = 0
    while loop.time() < until:
        rnd += 1
        ids = np.arange(8)
        bad = np.ones((8, 4), np.float32)
        bad[3, 1] = np.nan
        await _try(
            abuse, "nan gradient", client.sparse_update("abuse_emb", ids, bad, {"kind": "adam", "lr": 0.1})
        )
        rows = np.zeros((8, *feat.shape[1:]), feat.dtype)
        await _try(abuse, "push into node:feat", client.push("node:feat", ids, rows))
        await _try(abuse, "delete node:label", client.delete_tensor("node:label"))
        await _try(
            abuse,
            "optimizer on node:feat",
            client.sparse_update("node:feat", ids, rows.astype(np.float32), {"kind": "adagrad", "lr": 1.0}),
        )
        await _try(abuse, "epoch 2^64-1", conn.call(Op.SNAPSHOT, {"epoch": 2**64 - 1}, 10.0))
        await _try(
            abuse, "add_replica port 9", conn.call(Op.ADD_REPLICA, AddReplicaArgs(9, 1).encode(), 10.0)
        )
        other = ReleaseTensorsArgs("another-client", [], True).encode()  # issue 32 item 6
        await _try(abuse, "release another holder's references", conn.call(Op.RELEASE_TENSORS, other, 10.0))
        posing = BarrierArgs("abuse", 1.0, "another-client").encode()
        await _try(abuse, "barrier as another holder", conn.call(Op.BARRIER, posing, 10.0))
        await _try(
            abuse,
            "uint16 ids",
            conn.call(Op.PULL, {"name": "node:feat", "ids": np.zeros(32768, np.uint16)}, 10.0),
        )
        # issue 32 (9): names are bounded and printable; every barrier wait ends
        await _try(abuse, "1 MiB tensor name", client.create_tensor("n" * (1 << 20), "node", [n], "int8"))
        forged = ReleaseTensorsArgs("x\n@asyncgraph-agent forged", ["abuse_emb"]).encode()
        await _try(abuse, "holder with a newline", conn.call(Op.RELEASE_TENSORS, forged, 10.0))
        endless = BarrierArgs("endless", float("inf"), client.holder).encode()
        await _try(abuse, "barrier without end", conn.call(Op.BARRIER, endless, 10.0))
        await _try(abuse, "1 MiB barrier name", client.barrier("b" * (1 << 20), timeout=5.0))
        made = []
        for i in range(max_tensors + 1):  # a tensor flood: refused at the cap, then cleaned up
            try:
                await client.create_tensor(f"flood{rnd}_{i}", "node", [n], "int8")
                made.append(f"flood{rnd}_{i}")
            except AsyncGraphError as exc:
                abuse.note("tensor flood", exc)
                break
        for name in made:
            with contextlib.suppress(AsyncGraphError):
                await client.delete_tensor(name)
        await asyncio.sleep(0.05)


async def connection_flood(
    addresses: list[tuple[str, int]], abuse: Abuse, until: float, cap: int, secret: bytes | None
) -> None:
    """Open connections past ``--max-connections``, hold them a moment, close them; repeat (each
    as its own holder, its key derived from the secret: past the per-holder cap, to this one)."""
    from asyncgraph.net.connection import Connection

    loop = asyncio.get_running_loop()
    host, port = addresses[0]
    while loop.time() < until:
        conns = []
        for i in range(cap + 4):
            try:
                c = await Connection.open(
                    host, port, graph_name=None, timeout=5.0, secret=secret, holder=f"f{i}"
                )
                await c.call(Op.PING, {}, 5.0)
                conns.append(c)
            except AsyncGraphError as exc:
                abuse.note("connection flood", exc)
            except OSError:
                pass
        await asyncio.sleep(0.5)
        for c in conns:
            c.close()
        await asyncio.sleep(0.5)


def metrics_abuse(port_of: Any, abuse: Abuse, until: float, stop: threading.Event) -> None:
    """Silent clients and 4 MiB headers at server 0's metrics port (a thread: plain sockets)."""
    import socket

    while not stop.is_set() and time.monotonic() < until:
        try:
            port = port_of()
        except (OSError, ValueError, KeyError):  # server 0 is restarting: its ready file is gone
            stop.wait(0.5)
            continue
        idle = []
        try:
            for _ in range(40):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (4 << 20) + b"\r\n\r\n")
                reply = s.recv(64)
            key = "metrics 431" if reply.startswith(b"HTTP/1.1 431") else "metrics refused (reset)"
            abuse.refused[key] = abuse.refused.get(key, 0) + 1
        except OSError:
            key = "metrics refused (reset)"
            abuse.refused[key] = abuse.refused.get(key, 0) + 1
        stop.wait(2.0)
        for s in idle:
            s.close()


def sample_rss(group: ServerGroup, abuse: Abuse, stop: threading.Event) -> None:
    import psutil

    while not stop.wait(1.0):
        row = []
        for proc in group.procs:
            try:
                row.append((proc.pid, psutil.Process(proc.pid).memory_info().rss))
            except psutil.Error:
                row.append((proc.pid, 0))
        abuse.rss.append(row)


def rss_growth(rss: list[list[tuple[int, int]]]) -> list[float | None]:
    """Per server: mean RSS of the last quarter over the first quarter of its longest-lived
    process (a restarted server starts afresh), after a 10% warm-up."""
    out: list[float | None] = []
    for i in range(len(rss[0]) if rss else 0):
        runs: dict[int, list[int]] = {}
        for row in rss:
            pid, value = row[i]
            if value > 0:
                runs.setdefault(pid, []).append(value)
        series = max(runs.values(), key=len) if runs else []
        series = series[len(series) // 10 :]
        q = max(1, len(series) // 4)
        first, last = series[:q], series[-q:]
        out.append(round(float(np.mean(last) / np.mean(first)), 3) if first and last else None)
    return out


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q) * 1e3) if values else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = partitioned(graph_npz(args), 2)
    with tempfile.TemporaryDirectory(prefix="asyncgraph-faults-") as tmp:
        extra = ["--log-level", "WARNING", "--state-dir", f"{tmp}/state", "--wal", "--wal-fsync", args.fsync]
        secret = os.urandom(16).hex().encode() if args.abuse else None
        if args.abuse:
            extra += ["--max-tensors", str(args.max_tensors), "--max-connections", str(args.max_connections)]
            extra += ["--metrics-port", "0", "--require-holder-keys", "--max-connections-per-holder", "4"]
        points = PointCrashes() if args.failpoints else None
        if points is not None:  # both servers start with the first point armed
            os.environ[failpoints.ENV] = points.next_spec(0)
            points.armed[1] = points.armed[0]
        try:
            group = start_servers(config, Path(tmp) / "run", num_parts=2, extra_args=extra, secret=secret)
        finally:
            os.environ.pop(failpoints.ENV, None)
        abuse = Abuse()
        side_stop = threading.Event()
        side: list[threading.Thread] = []
        try:
            clients = [
                await AsyncClient.connect(
                    group.addresses, secret=secret, use_shared_memory=False, reconnect_window=30.0
                )
                for _ in range(args.clients)
            ]
            n = clients[0].book.num_nodes
            await clients[0].create_tensor("soak", "node", [n, WIDTH], "float64")
            await clients[0].snapshot()
            soak = Soak(n)
            loop = asyncio.get_running_loop()
            until = loop.time() + args.seconds
            stop = threading.Event()
            deadline = time.monotonic() + args.seconds
            if points is not None:

                def crash_keeper() -> None:
                    assert points is not None
                    soak.kills = keep_crashing(group, points, soak.windows, args.kill_every, deadline, stop)

                kill_thread = threading.Thread(target=crash_keeper)
            else:
                kill_thread = threading.Thread(
                    target=killer, args=(group, soak, args.kill_every, deadline, stop)
                )
            kill_thread.start()
            tasks = [worker(c, soak, i, until) for i, c in enumerate(clients)]
            if points is not None:
                tasks.append(snapshotter(clients[0], points, args.snapshot_every, until))
            if args.abuse:
                bad = await AsyncClient.connect(
                    group.addresses, secret=secret, use_shared_memory=False, reconnect_window=30.0
                )
                clients.append(bad)
                tasks.append(abuser(bad, abuse, until, args.max_tensors))
                tasks.append(connection_flood(group.addresses, abuse, until, args.max_connections, secret))
                assert secret is not None
                tasks.append(invented_holders(group.addresses, secret, 4, abuse.note, until))
                run_dir = Path(tmp) / "run"

                def port_of() -> int:
                    return int(json.loads((run_dir / "ready0.json").read_text())["metrics_port"])

                side.append(
                    threading.Thread(
                        target=metrics_abuse,
                        args=(port_of, abuse, time.monotonic() + args.seconds, side_stop),
                    )
                )
            side.append(threading.Thread(target=sample_rss, args=(group, abuse, side_stop)))
            for t in side:
                t.start()
            try:
                await asyncio.gather(*tasks)
            finally:
                stop.set()
                side_stop.set()
                await asyncio.to_thread(kill_thread.join)
                for t in side:
                    await asyncio.to_thread(t.join)
            got = await clients[0].pull_numpy("soak", np.arange(n))
            lost = int(np.sum(got < soak.acked - 1e-9))
            extra_applied = int(np.sum(got > soak.acked + soak.unacked + 1e-9))
            retried = sum(c.retries() for c in clients)
            for c in clients:
                await c.close()
            restored: dict[str, Any] = {}
            if points is not None:
                back = await restored_after_kill(group, "soak", n, secret)
                restored = {
                    **points.summary(),
                    "restored_lost_rows": int(np.sum(back < soak.acked - 1e-9)),
                    "restored_rows_above_model": int(np.sum(back > soak.acked + soak.unacked + 1e-9)),
                    "restored_equals_memory": bool(np.array_equal(back, got)),
                }
        finally:
            group.stop()
    during = [d for t, d in soak.latencies if soak.in_recovery(t)]
    outside = [d for t, d in soak.latencies if not soak.in_recovery(t)]
    return {
        "graph": config.stem,
        "seconds": args.seconds,
        "clients": args.clients,
        "kill_every_s": args.kill_every,
        "wal_fsync": args.fsync,
        "kills": soak.kills,
        "requests_done": soak.done,
        "requests_retried": retried,
        "requests_failed": soak.failed,
        "lost_acknowledged_rows": lost,
        "rows_above_model": extra_applied,
        "p50_ms": pct(outside, 50),
        "p99_ms": pct(outside, 99),
        "p50_recovery_ms": pct(during, 50),
        "p99_recovery_ms": pct(during, 99),
        "max_recovery_ms": (max(during) * 1e3) if during else None,
        "first_errors": soak.errors[:5],
        "errors_by_type": _by_type(soak.errors),
        "abuse": args.abuse,
        "abuses_refused_by_type": abuse.refused,
        "abuses_accepted": sorted(set(abuse.accepted)),
        "rss_mb_first_last": [[round(v / 2**20) for _, v in abuse.rss[i]] for i in (0, -1)]
        if abuse.rss
        else [],
        "rss_samples": len(abuse.rss),
        "rss_growth": rss_growth(abuse.rss),
        "failpoints": args.failpoints,
        **restored,
        "date": time.strftime("%Y-%m-%d"),
    }


def _by_type(errors: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in errors:
        key = e.split(":", 1)[0]
        out[key] = out.get(key, 0) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_options(ap, default_scale=14)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--kill-every", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--fsync", choices=("always", "interval"), default="always")
    ap.add_argument("--abuse", action="store_true", help="mix the issue-22 abuses into the load")
    ap.add_argument("--max-tensors", type=int, default=64, help="with --abuse: the servers' tensor cap")
    ap.add_argument("--max-connections", type=int, default=48, help="with --abuse: the servers' cap")
    ap.add_argument("--failpoints", action="store_true", help="arm snapshot/WAL failpoints (+ --abuse)")
    ap.add_argument("--snapshot-every", type=float, default=2.0, help="with --failpoints: seconds a snapshot")
    ap.add_argument("--out", type=Path, default=RESULTS / "faults.json")
    args = ap.parse_args()
    args.failpoints = args.failpoints or args.abuse
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result["lost_acknowledged_rows"] or result.get("restored_lost_rows"):
        raise SystemExit("acknowledged writes were lost")
    if args.failpoints and (result["rows_above_model"] or result["restored_rows_above_model"]):
        raise SystemExit("writes were applied twice")
    if result["abuses_accepted"]:
        raise SystemExit(f"abuses were accepted: {result['abuses_accepted']}")


if __name__ == "__main__":
    main()
