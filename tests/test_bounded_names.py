"""Issue 32, item 9: names have a length limit, barrier waits end, waiting barriers count against
the memory budget and are freed when they time out. Real server processes on loopback."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import (
    BarrierTimeoutError,
    InvalidNameError,
    InvalidRequestError,
    MemoryBudgetError,
)
from asyncgraph.protocol.ops import (
    BarrierArgs,
    CreateTensorArgs,
    Op,
    PullArgs,
    ReleaseTensorsArgs,
    SampleArgs,
)
from asyncgraph.testing import ServerGroup, start_servers

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"issue32-names"
BAD_NAMES = {"257 bytes": "x" * 257, "1 MiB": "n" * (1 << 20), "newline": "a\n@asyncgraph-agent x",
             "nul": "a\x00b", "empty": ""}  # fmt: skip


@pytest.fixture(scope="module")
def servers(cora2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(cora2.part_config, tmp_path_factory.mktemp("names"), num_parts=2, num_clients=2,
                          secret=SECRET, extra_args=["--log-level", "WARNING"])  # fmt: skip
    yield group
    group.stop()


async def connect(group: ServerGroup) -> AsyncClient:
    return await AsyncClient.connect(group.addresses, secret=SECRET, use_shared_memory=False)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", sorted(BAD_NAMES))
async def test_long_or_unprintable_names_are_refused(case: str, servers: ServerGroup) -> None:
    bad = BAD_NAMES[case]
    client = await connect(servers)
    conn = client.connections[0]
    try:
        n = client.book.num_nodes
        with pytest.raises(InvalidNameError, match="must be 1 to 256 bytes of printable text"):
            await client.create_tensor(bad, "node", [n, 2], "float32")
        assert bad not in {m.name for m in await client.refresh_tensors()}
        refused = [
            (Op.PULL, PullArgs(bad, np.arange(3)).encode()),
            (Op.CREATE_TENSOR, CreateTensorArgs("ok", "node", [n, 2], "float32", None, bad).encode()),
            (Op.RELEASE_TENSORS, ReleaseTensorsArgs(bad, ["ok"]).encode()),
            (Op.RELEASE_TENSORS, ReleaseTensorsArgs(client.holder, [bad]).encode()),
            (Op.BARRIER, BarrierArgs(bad, 5.0, client.holder).encode()),
            (Op.SAMPLE, SampleArgs(np.arange(3), 2, features=(bad,)).encode()),
        ]
        for op, args in refused:
            with pytest.raises(InvalidNameError):
                await conn.call(op, args, 30.0)
        assert "ok" not in {m.name for m in await client.refresh_tensors()}
        await client.create_tensor("y" * 256, "node", [n, 2], "float32")  # at the limit: fine
        await client.delete_tensor("y" * 256)
        assert (await client.pull("node:feat", np.arange(4))).shape[0] == 4  # still serving
    finally:
        await client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [math.inf, math.nan, 1e9, -1.0, 0.0])
async def test_barrier_timeouts_are_finite_and_bounded(timeout: float, servers: ServerGroup) -> None:
    client = await connect(servers)
    try:
        with pytest.raises(InvalidRequestError, match=r"timeout must be in \(0, 604800\] seconds"):
            await client.connections[0].call(Op.BARRIER, BarrierArgs("t", timeout, client.holder).encode(),
                                                   30.0)  # fmt: skip
    finally:
        await client.close()


async def _arrive(client: AsyncClient, names: list[str], timeout: float) -> list[BaseException | None]:
    conn = client.connections[0]
    calls = [conn.call(Op.BARRIER, BarrierArgs(n, timeout, client.holder).encode(), 60.0) for n in names]
    results = await asyncio.gather(*calls, return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


@pytest.mark.timeout(120)
async def test_waiting_barriers_count_against_the_budget_and_are_freed(tmp_path: Path) -> None:
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    cfg = tmp_path / "one" / "cora.json"
    cora = Graph.from_npz(ROOT / "examples/data/cora.npz")
    partition_graph(cora, "cora", 1, cfg.parent, part_method="random")
    # what the partition's own tensors hold, from the budget's own refusal
    quiet = ["--log-level", "WARNING"]
    probe = [*quiet, "--memory-budget", "1"]  # every new tensor refused, naming what is held
    group = start_servers(cfg, tmp_path / "probe", num_parts=1, num_clients=2, extra_args=probe)
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        with pytest.raises(MemoryBudgetError) as info:
            await client.create_tensor("huge", "node", [client.book.num_nodes, 1], "float32")
        held = int(re.search(r"hold (\d+) of its", str(info.value))[1])  # type: ignore[index]
        await client.close()
    finally:
        group.stop()
    headroom = 64 << 10  # room for about 28 waiting arrivals of 2 KiB and a 200-byte name
    budget = ["--memory-budget", str(held + headroom), "--max-inflight", "1000"]
    group = start_servers(cfg, tmp_path / "run", num_parts=1, num_clients=2, extra_args=quiet + budget)
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        names = [f"b{i:03d}-" + "x" * 195 for i in range(60)]
        results = await _arrive(client, names, 2.0)
        timed_out = [r for r in results if isinstance(r, BarrierTimeoutError)]
        refused = [r for r in results if isinstance(r, MemoryBudgetError)]
        assert len(timed_out) + len(refused) == 60, results
        assert 20 <= len(timed_out) <= 30, (len(timed_out), refused[:1])
        assert "a waiting barrier arrival needs" in str(refused[0])
        # timed out: freed, so as many wait again (a second round of other names)
        again = await _arrive(client, [n.replace("b", "c", 1) for n in names], 2.0)
        assert sum(isinstance(r, BarrierTimeoutError) for r in again) == len(timed_out)
        # while they wait, a tensor that would fit the headroom alone does not
        waiting = asyncio.ensure_future(_arrive(client, names[: len(timed_out)], 3.0))
        await asyncio.sleep(1.0)
        cols = (headroom // 2) // (4 * client.book.num_nodes)
        with pytest.raises(MemoryBudgetError, match="tensors and waiting barriers hold"):
            await client.create_tensor("half", "node", [client.book.num_nodes, cols], "float32")
        await waiting
        await client.create_tensor("half", "node", [client.book.num_nodes, cols], "float32")  # room again
        await client.close()
    finally:
        group.stop()
