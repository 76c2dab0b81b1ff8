"""The failure-point part of ``benchmarks.faults`` (``--failpoints``, on with ``--abuse``).

Each server runs with one failure point of the snapshot and write-ahead-log protocol armed
(``ASYNCGRAPH_FAILPOINTS``, ``asyncgraph/failpoints.py``): it dies there (``os._exit``, what
``kill -9`` at that instant leaves) after a random 0-3 passes, and is restarted from its state
folder with the next point of the list, round and round; a client snapshots every
``--snapshot-every`` seconds so the snapshot points are reached under the load. The soak then
SIGKILLs both servers once more, restarts them without points and compares the restored tensor
with the model too (``restored_lost_rows`` / ``restored_rows_above_model``: both must be 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time
from typing import Any

from asyncgraph import failpoints
from asyncgraph.client import AsyncClient
from asyncgraph.errors import AsyncGraphError
from asyncgraph.testing import ServerGroup

__all__ = ["PointCrashes", "keep_crashing", "snapshotter"]


class PointCrashes:
    """Which failure points were armed, which crashed a server, and the snapshots taken."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.order = [p for p in failpoints.POINTS if p not in failpoints.START_POINTS]  # request-driven
        self.next_index = 0
        self.armed: dict[int, str] = {}  # server index -> the point it runs with
        self.crashed: dict[str, int] = {}
        self.other_exits: list[int] = []
        self.snapshots = 0
        self.snapshot_errors: dict[str, int] = {}

    def next_spec(self, index: int) -> str:
        point = self.order[self.next_index % len(self.order)]
        self.next_index += 1
        self.armed[index] = point
        passes = self.rng.randrange(4)
        return f"{point}={passes}*off->crash" if passes else f"{point}=crash"

    def restart(self, group: ServerGroup, index: int, spec: str) -> None:
        os.environ[failpoints.ENV] = spec
        try:
            group.restart(index)
        finally:
            del os.environ[failpoints.ENV]

    def summary(self) -> dict[str, Any]:
        return {
            "failpoint_crashes": sum(self.crashed.values()),
            "failpoint_crashes_by_point": dict(sorted(self.crashed.items())),
            "failpoints_never_reached": [p for p in self.order if p not in self.crashed],
            "other_exits": self.other_exits,
            "snapshots_taken": self.snapshots,
            "snapshot_errors_by_type": self.snapshot_errors,
        }


def keep_crashing(
    group: ServerGroup,
    points: PointCrashes,
    windows: list[tuple[float, float]],
    kill_every: float,
    until: float,
    stop: threading.Event,
) -> int:
    """Restart every server that died at its failure point (with the next point armed), and
    SIGKILL a random one every ``kill_every`` seconds as ``faults.killer`` does; returns the
    number of SIGKILLs."""
    rng = random.Random(1)
    kills = 0
    next_kill = time.monotonic() + kill_every
    while not stop.wait(0.05):
        for i, proc in enumerate(group.procs):
            code = proc.poll()
            if code is None:
                continue
            t0 = time.monotonic()
            if code == failpoints.CRASH_EXIT:
                point = points.armed.get(i, "?")
                points.crashed[point] = points.crashed.get(point, 0) + 1
            else:
                points.other_exits.append(code)
            points.restart(group, i, points.next_spec(i))
            windows.append((t0, time.monotonic() + 1.0))
        if time.monotonic() >= next_kill and time.monotonic() + 5 < until:
            victim = rng.randrange(len(group.procs))
            t0 = time.monotonic()
            group.kill(victim, signal.SIGKILL)
            points.restart(group, victim, points.next_spec(victim))
            windows.append((t0, time.monotonic() + 1.0))
            kills += 1
            next_kill = time.monotonic() + kill_every
    return kills


async def snapshotter(client: AsyncClient, points: PointCrashes, every: float, until: float) -> None:
    """Snapshot every server every ``every`` seconds (the calls ride through crashes)."""
    loop = asyncio.get_running_loop()
    while loop.time() + every < until:
        await asyncio.sleep(every)
        try:
            await client.snapshot()
        except AsyncGraphError as exc:
            key = type(exc).__name__
            points.snapshot_errors[key] = points.snapshot_errors.get(key, 0) + 1
            continue
        points.snapshots += 1


async def restored_after_kill(
    group: ServerGroup, name: str, num_nodes: int, secret: bytes | None = None
) -> Any:
    """SIGKILL every server, restart each without failure points, and pull ``name`` whole."""
    import numpy as np

    for i in range(len(group.procs)):
        group.kill(i, signal.SIGKILL)
        group.restart(i)
    client = await AsyncClient.connect(group.addresses, secret=secret, use_shared_memory=False)
    try:
        return await client.pull_numpy(name, np.arange(num_nodes))
    finally:
        with contextlib.suppress(AsyncGraphError, OSError):
            await client.close()
