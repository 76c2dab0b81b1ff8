"""A snapshot streams tensors to disk from the store's memory, off the event loop (issue 22
item 10): no copy of a tensor (the server's RSS grows by a chunk, not by the tensor), reads keep
being answered, and a write issued meanwhile is held back until the rows are on disk, so it is
in the next log and not in the snapshot (kill -9 + restart applies the add exactly once).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.testing import start_servers

PER_SERVER_BYTES = 128 << 20  # of the big tensor, on each of the two servers


class RssPeak:
    """Samples a process's RSS every millisecond in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.001)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@pytest.mark.timeout(120)
async def test_snapshot_streams_without_a_copy_serves_reads_and_holds_writes(cora2, tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ["--log-level", "WARNING", "--state-dir", str(state), "--wal"]
    group = start_servers(cora2.part_config, tmp_path / "run", num_parts=2, extra_args=args)
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        n = client.book.num_nodes
        width = PER_SERVER_BYTES * 2 // (4 * n)
        await client.create_tensor("big", "node", [n, width], "float32", init={"kind": "uniform", "seed": 3})
        await client.create_tensor("acc", "node", [n, 2], "float64")
        lo, hi = client.book.node_range(0)
        ids = np.arange(lo, hi)
        probe = np.arange(lo, min(hi, lo + 16))
        expected = await client.pull_numpy("big", probe)
        await asyncio.sleep(0.3)  # the fill's temporaries are freed

        rss = RssPeak(group.procs[0].pid)
        base = psutil.Process(group.procs[0].pid).memory_info().rss
        snap = asyncio.ensure_future(client.snapshot())
        tmp_snap = state / "part0" / "snap-00000001.tmp"
        for _ in range(5000):  # server 0 is writing the rows
            if tmp_snap.exists() or snap.done():
                break
            await asyncio.sleep(0.001)
        assert not snap.done(), "the snapshot finished before the test could write during it"
        push = asyncio.ensure_future(client.push("acc", ids, np.ones((ids.size, 2)), op="add"))
        latencies = []
        while not snap.done():  # reads keep being answered meanwhile
            t0 = time.perf_counter()
            np.testing.assert_array_equal(await client.pull_numpy("big", probe), expected)
            latencies.append(time.perf_counter() - t0)
        epoch = await snap
        await push
        peak = rss.stop()
        assert latencies and max(latencies) < 1.0, f"pull latencies during the snapshot: {latencies}"
        extra = peak - base
        print(
            f"snapshot of {PER_SERVER_BYTES >> 20} MiB/server: RSS +{extra / 2**20:.1f} MiB, "
            f"{len(latencies)} pulls, max {max(latencies) * 1e3:.1f} ms"
        )
        assert extra < PER_SERVER_BYTES // 4, (
            f"server RSS grew by {extra / 2**20:.0f} MiB during the snapshot of a "
            f"{PER_SERVER_BYTES / 2**20:.0f} MiB tensor (a copy of it?)"
        )

        # the held-back push is not in the snapshot, and is in the next log
        folder = state / "part0" / f"snap-{epoch:08d}"
        manifest = json.loads((folder / "manifest.json").read_text())
        (entry,) = [e for e in manifest["tensors"] if e["name"].endswith("acc")]
        np.testing.assert_array_equal(np.fromfile(folder / entry["file"], np.float64), 0.0)
        assert (state / "part0" / f"wal-{epoch:08d}.log").stat().st_size > 0
        await client.close()

        group.kill(0)
        group.restart(0)
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        np.testing.assert_array_equal(await client.pull_numpy("acc", ids), np.ones((ids.size, 2)))
        np.testing.assert_array_equal(await client.pull_numpy("big", probe), expected)
        await client.close()
    finally:
        group.stop()
