"""Issue 22, second red team: data that came back wrong or was lost, work one client made
unbounded. Real server processes (Cora, 2 partitions, a secret) on loopback, real ``kill -9``.
"""

from __future__ import annotations

import signal
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import NonFiniteError
from asyncgraph.protocol.ops import Op, SparseUpdateArgs
from asyncgraph.testing import ServerGroup, start_servers

SECRET = b"issue22-secret"


@pytest.fixture
def wal_servers(cora2, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        secret=SECRET,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"],
    )
    yield group
    group.stop()


@pytest.fixture(scope="module")
def shared_servers(cora2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    """One pair of logged servers for the tests of this module that restart nothing."""
    tmp = tmp_path_factory.mktemp("abuse")
    group = start_servers(
        cora2.part_config,
        tmp / "run",
        num_parts=2,
        secret=SECRET,
        extra_args=["--log-level", "WARNING", "--state-dir", str(tmp / "state"), "--wal"],
    )
    yield group
    group.stop()


async def connect(group: ServerGroup) -> AsyncClient:
    return await AsyncClient.connect(group.addresses, secret=SECRET, use_shared_memory=False)


def record_offsets(path: Path) -> list[int]:
    """Start offsets of the records of a write-ahead log (crc32 + length-prefixed frame)."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        (body_len,) = struct.unpack_from(">I", data, pos + 4)
        pos += 8 + body_len
    return out


# --- item 3: a corrupt byte in the middle of the WAL ----------------------------------------------
@pytest.mark.timeout(120)
async def test_corrupt_wal_record_refuses_start_and_recover_keeps_the_rest(
    wal_servers: ServerGroup, tmp_path: Path
) -> None:
    group = wal_servers
    client = await connect(group)
    n = client.book.num_nodes
    lo, _ = client.book.node_range(0)
    await client.create_tensor("acc", "node", [n, 1], "float64")
    ids = lo + np.arange(10)
    for i in range(10):  # 10 acknowledged pushes, one row each
        await client.push("acc", ids[i : i + 1], np.full((1, 1), i + 1.0))
    await client.close()
    group.kill(0, signal.SIGKILL)

    wal = tmp_path / "state" / "part0" / "wal-00000000.log"
    offsets = record_offsets(wal)
    assert len(offsets) == 11  # the create, then the 10 pushes
    data = bytearray(wal.read_bytes())
    hit = offsets[5] + 40  # inside the 5th push's record (the 5 after it are intact)
    data[hit] ^= 0xFF
    wal.write_bytes(bytes(data))

    with pytest.raises(RuntimeError, match="corrupt at byte offset"):
        group.restart(0, timeout=30)
    text = group.log_text(0)
    assert str(wal) in text and f"offset {offsets[5]}" in text and "--wal-recover" in text
    assert wal.read_bytes() == bytes(data)  # the file is kept exactly as it was

    group.argvs[0].append("--wal-recover")
    group.restart(0)
    aside = list(wal.parent.glob("wal-00000000.log.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)  # moved aside, never deleted
    assert "skipped bytes" in group.log_text(0)
    client = await connect(group)
    got = (await client.pull("acc", ids)).numpy()[:, 0]
    expected = np.arange(1.0, 11.0)
    expected[4] = 0.0  # the one corrupt record (the 5th push) is the only write missing
    np.testing.assert_array_equal(got, expected)
    await client.close()


# --- item 5: NaN and inf gradients --------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["adagrad", "adam"])
async def test_non_finite_gradients_are_refused_and_change_nothing(
    shared_servers: ServerGroup, kind: str
) -> None:
    client = await connect(shared_servers)
    n = client.book.num_nodes
    name = f"emb_{kind}"
    init = {"kind": "uniform", "low": -1, "high": 1}
    await client.create_tensor(name, "node", [n, 4], "float32", init=init)
    spec = {"kind": kind, "lr": 0.1}
    ids = np.array([0, 5, n - 1])
    await client.sparse_update(name, ids, np.ones((3, 4), np.float32), spec)  # state exists now
    names = sorted(m.name for m in await client.refresh_tensors() if m.name.startswith(name))
    assert len(names) == (2 if kind == "adagrad" else 4)
    before = {m: (await client.pull(m, np.arange(n))).numpy().copy() for m in names}
    for bad in (np.nan, np.inf, -np.inf):
        grads = np.ones((3, 4), np.float32)
        grads[1, 2] = bad
        with pytest.raises(NonFiniteError, match="ID 5 is not finite"):
            await client.sparse_update(name, ids, grads, spec)
        # a client that skips the check: the server refuses too (raw request, no client checks)
        owner = client.partitions[int(client.book.nid2partid(np.array([5]))[0])]
        with pytest.raises(NonFiniteError, match="not finite"):
            await owner.conn.call(  # type: ignore[attr-defined]
                Op.SPARSE_UPDATE, SparseUpdateArgs(name, ids[1:2], grads[1:2], spec).encode(), 10.0
            )
    huge = np.full((3, 4), 3e38, np.float32)  # finite, but its square overflows float32
    with pytest.raises(NonFiniteError, match="overflows"):
        await client.sparse_update(name, ids, huge, spec)
    for m in names:
        np.testing.assert_array_equal((await client.pull(m, np.arange(n))).numpy(), before[m])
    await client.close()
