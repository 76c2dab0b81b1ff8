"""Issue 34: a server serves its partition's files in place (no copy at start), co-located
processes are sent read-only descriptors of those files, and the partitioner records each part's
fingerprint so a server need not rehash the structure at start (``--verify`` does). Real server
processes (Cora, 2 partitions) on loopback ports; real partitioner output."""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.errors import MemoryBudgetError, ReadOnlyTensorError
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.ops import CreateTensorArgs, Op, PullArgs, PushArgs, SampleArgs
from asyncgraph.testing import ServerGroup, start_servers

T = 10.0
FEAT = "node:feat"


def _copy(cora2: Any, tmp_path: Path) -> Path:
    """A private copy of the Cora partitioning (tests change files or the config); its config."""
    src = Path(cora2.part_config).parent
    shutil.copytree(src, tmp_path / "cora")
    return tmp_path / "cora" / Path(cora2.part_config).name


def _mapped_rss(pid: int, path: Path) -> tuple[int, int]:
    """``(mapped bytes, resident bytes)`` of every mapping of file ``path`` in process ``pid``."""
    size = rss = 0
    current = False
    target = str(path.resolve())
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            current = len(fields) >= 6 and fields[5] == target
        elif current and fields[:1] == ["Size:"]:
            size += int(fields[1]) * 1024
        elif current and fields[:1] == ["Rss:"]:
            rss += int(fields[1]) * 1024
    return size, rss


async def _open(group: ServerGroup, p: int = 0) -> Connection:
    return await Connection.open(*group.addresses[p], graph_name="cora", timeout=T)


@pytest.fixture
def plain(cora2: Any, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(cora2.part_config, tmp_path / "run", num_parts=2)
    yield group
    group.stop()


# --- item 1: served in place ---------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_server_maps_its_files_and_reads_none_of_their_rows_at_start(
    cora2: Any, plain: ServerGroup
) -> None:
    """Each server maps its structure and feature files (they are in its smaps) and has faulted
    in almost none of their pages: start-up read headers, not rows. Before: the files were
    copied into memfds (every byte read) and no longer mapped."""
    part = Path(cora2.part_config).parent / "part0"
    pid = plain.procs[0].pid
    for path in (part / "node_feat" / "feat.npy", part / "indices.npy", part / "eids.npy"):
        size, rss = _mapped_rss(pid, path)
        assert size >= path.stat().st_size - 4096, f"{path} is not mapped by the server"
        assert rss <= max(256 << 10, path.stat().st_size // 8), f"{path}: {rss} of {size} bytes resident"


@pytest.mark.timeout(60)
async def test_a_co_located_process_gets_read_only_descriptors_of_the_files(
    cora2: Any, plain: ServerGroup
) -> None:
    """What a co-located trainer is sent for base data is the partition file itself, opened
    read-only: mapping it writable, write(2) and numpy writes all fail; an attached store refuses
    a push of it (ReadOnlyTensorError); the server's rows are unchanged."""
    from asyncgraph.protocol.info import ServerInfo
    from asyncgraph.storage.fdpass import attach_store, fetch_catalog

    feat_file = Path(cora2.part_config).parent / "part0" / "node_feat" / "feat.npy"
    conn = await _open(plain)
    fds: list[int] = []
    try:
        ids = np.arange(8)
        before = await conn.call(Op.PULL, PullArgs(FEAT, ids).encode(), T)
        info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, T))
        assert info.shm is not None
        desc, fds = await asyncio.to_thread(fetch_catalog, info.shm.address, info.shm.token, T)
        entry = next(t for t in desc["tensors"] if t["meta"]["name"] == FEAT)
        assert entry["file"] and entry["read_only"] and entry["offset"] > 0
        fd = fds[entry["fd_index"]]
        assert os.fstat(fd).st_ino == feat_file.stat().st_ino  # the file itself: no copy
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        with pytest.raises(PermissionError):
            mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.pwrite(fd, b"\xff" * 16, entry["offset"])
        store = await asyncio.to_thread(attach_store, info.shm.address, info.shm.token)
        try:
            rows = store.local_rows(FEAT)
            np.testing.assert_array_equal(rows[:8], before)
            with pytest.raises(ValueError):
                rows[0, 0] = 1.0
            with pytest.raises(ValueError):
                rows.flags.writeable = True
            assert not store.indices.flags.writeable
            with pytest.raises(ReadOnlyTensorError):
                store.push(FEAT, np.array([0]), np.ones((1, rows.shape[1]), dtype=rows.dtype))
        finally:
            store.close()
        after = await conn.call(Op.PULL, PullArgs(FEAT, ids).encode(), T)
        np.testing.assert_array_equal(after, before)
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        return bool(np.array_equal(x, y)) and x.dtype == y.dtype
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.timeout(120)
async def test_results_are_identical_with_the_files_and_with_the_copy(cora2: Any, tmp_path: Path) -> None:
    """Pulls of every row and seeded samples (with features) are the same from servers serving
    the files in place and from servers that copied them (``--copy-partition-data``), whose
    copies are memfds sealed against writing, even reopened by /proc (issue 32)."""
    files = start_servers(cora2.part_config, tmp_path / "files", num_parts=2)
    try:
        copied = start_servers(
            cora2.part_config, tmp_path / "copied", num_parts=2, extra_args=["--copy-partition-data"]
        )
    except BaseException:
        files.stop()
        raise
    conns: list[Connection] = []
    try:
        for p, (lo, hi) in enumerate(((0, 1354), (1354, 2708))):
            a, b = await _open(files, p), await _open(copied, p)
            conns += [a, b]
            ranges = [(m["name"], m) for m in await a.call(Op.LIST_TENSORS, {}, T)]
            assert ranges == [(m["name"], m) for m in await b.call(Op.LIST_TENSORS, {}, T)]
            book = json.loads(Path(cora2.part_config).read_text())["parts"][p]["node_range"]
            ids = np.arange(book[0], book[1])
            for name in ("node:feat", "node:label", "node:train_mask"):
                x = await a.call(Op.PULL, PullArgs(name, ids).encode(), T)
                y = await b.call(Op.PULL, PullArgs(name, ids).encode(), T)
                assert _same(x, y), name
            seeds = ids[:: max(1, len(ids) // 200)]
            for fanout in (3, 10, -1):
                args = SampleArgs(seeds, fanout, seed=7, features=("node:feat",)).encode()
                x = await a.call(Op.SAMPLE, args, T)
                y = await b.call(Op.SAMPLE, args, T)
                assert _same(x, y), fanout
            assert lo >= 0 and hi > lo
        await _sealed_copy(copied)
    finally:
        for c in conns:
            c.close()
        files.stop()
        copied.stop()


async def _sealed_copy(group: ServerGroup) -> None:
    """``node:feat`` of a copying server is a memfd no process it is sent to can write."""
    from asyncgraph.protocol.info import ServerInfo
    from asyncgraph.storage.fdpass import fetch_catalog

    conn = await _open(group)
    fds: list[int] = []
    try:
        info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, T))
        assert info.shm is not None
        desc, fds = await asyncio.to_thread(fetch_catalog, info.shm.address, info.shm.token, T)
        entry = next(t for t in desc["tensors"] if t["meta"]["name"] == FEAT)
        assert not entry["file"] and entry["offset"] == 0
        fd = fds[entry["fd_index"]]
        reopened = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                mmap.mmap(reopened, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(reopened)
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(60)
async def test_writable_partition_data_writes_memory_not_the_files(cora2: Any, tmp_path: Path) -> None:
    """With ``--writable-partition-data`` a push to ``node:feat`` is served back (over TCP and
    through shared memory, where the tensor is now a writable memfd) and the ``.npy`` file on
    disk keeps every byte."""
    from asyncgraph.protocol.info import ServerInfo
    from asyncgraph.storage.fdpass import attach_store

    config = _copy(cora2, tmp_path)
    feat_file = config.parent / "part0" / "node_feat" / "feat.npy"
    digest = _sha(feat_file)
    group = start_servers(config, tmp_path / "run", num_parts=2, extra_args=["--writable-partition-data"])
    conn = await _open(group)
    try:
        ids = np.array([0, 5, 9])
        rows = await conn.call(Op.PULL, PullArgs(FEAT, ids).encode(), T)
        new = np.full_like(rows, 3.5)
        await conn.call(Op.PUSH, PushArgs(FEAT, ids, new).encode(), T)
        np.testing.assert_array_equal(await conn.call(Op.PULL, PullArgs(FEAT, ids).encode(), T), new)
        info = ServerInfo.from_wire(await conn.call(Op.INFO, {}, T))
        assert info.shm is not None
        store = await asyncio.to_thread(attach_store, info.shm.address, info.shm.token)
        try:
            np.testing.assert_array_equal(store.pull(FEAT, ids), new)
            store.push(FEAT, np.array([1]), np.full((1, rows.shape[1]), 7.0, dtype=rows.dtype))
        finally:
            store.close()
        got = await conn.call(Op.PULL, PullArgs(FEAT, np.array([1])).encode(), T)
        assert float(got[0, 0]) == 7.0
    finally:
        conn.close()
        group.stop()
    assert _sha(feat_file) == digest


@pytest.mark.timeout(60)
async def test_the_memory_budget_counts_memory_not_the_files_served(cora2: Any, tmp_path: Path) -> None:
    """``--memory-budget`` below the partition's feature bytes: a 1 MiB tensor is created when
    the files are served in place (page cache is not counted), refused when they were copied."""
    budget = str(4 << 20)  # a part's node:feat is ~7.7 MB
    shape = [2708, 64]  # ~0.35 MB of this part's rows
    for extra, refused in (([], False), (["--copy-partition-data"], True)):
        args = ["--memory-budget", budget, *extra]
        group = start_servers(cora2.part_config, tmp_path / f"run{len(extra)}", num_parts=2, extra_args=args)
        conn = await _open(group)
        try:
            create = CreateTensorArgs("emb", "node", shape, "float32").encode()
            if refused:
                with pytest.raises(MemoryBudgetError):
                    await conn.call(Op.CREATE_TENSOR, create, T)
            else:
                await conn.call(Op.CREATE_TENSOR, create, T)
        finally:
            conn.close()
            group.stop()


# --- item 2: the fingerprint is the partitioner's ----------------------------------------------
def test_a_fresh_config_records_the_fingerprint_servers_compute(cora2: Any, tmp_path: Path) -> None:
    """Every part of a fresh config records its fingerprint, equal to what a server computes by
    hashing (the config without fingerprints, then the structure files); a config stripped of
    them (as older asyncgraph wrote) hashes to the same value."""
    from asyncgraph.partition.fingerprint import partition_fingerprint

    raw = json.loads(Path(cora2.part_config).read_text())
    recorded = [p["fingerprint"] for p in raw["parts"]]
    assert all(isinstance(f, str) and len(f) == 64 for f in recorded)
    assert len(set(recorded)) == 2
    config = _copy(cora2, tmp_path)
    for p in raw["parts"]:
        del p["fingerprint"]
    config.write_text(json.dumps(raw))
    for p in range(2):
        assert partition_fingerprint(cora2.part_config, p) == recorded[p]
        assert partition_fingerprint(config, p) == recorded[p]


def _flip_last_byte(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.timeout(90)
def test_verify_refuses_a_flipped_structure_byte(cora2: Any, tmp_path: Path) -> None:
    """A flipped byte in ``indices.npy`` (size and header intact): a server started with
    ``--verify`` refuses it (FingerprintMismatchError); one without starts (cheap checks only)."""
    config = _copy(cora2, tmp_path)
    _flip_last_byte(config.parent / "part0" / "indices.npy")
    with pytest.raises(RuntimeError, match=r"FingerprintMismatchError|hash to"):
        start_servers(config, tmp_path / "verify", num_parts=1, extra_args=["--verify"])
    group = start_servers(config, tmp_path / "trust", num_parts=1)
    group.stop()
    clean = start_servers(cora2.part_config, tmp_path / "clean", num_parts=1, extra_args=["--verify"])
    clean.stop()


@pytest.mark.timeout(90)
def test_without_verify_a_server_does_not_hash_the_structure(
    cora2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rehash is a failpoint that crashes the server: one with durable state (which needs
    the fingerprint at start) starts on a fresh config, trusting the recorded fingerprint; on a
    config without fingerprints (older asyncgraph) it hashes, and so crashes here."""
    monkeypatch.setenv("ASYNCGRAPH_FAILPOINTS", "partition.rehash=crash")
    group = start_servers(
        cora2.part_config, tmp_path / "fresh", num_parts=1, extra_args=["--state-dir", str(tmp_path / "s1")]
    )
    group.stop()
    old = _copy(cora2, tmp_path)
    raw = json.loads(old.read_text())
    for p in raw["parts"]:
        del p["fingerprint"]
    old.write_text(json.dumps(raw))
    with pytest.raises(RuntimeError, match="status 86"):
        start_servers(old, tmp_path / "old", num_parts=1, extra_args=["--state-dir", str(tmp_path / "s2")])


@pytest.mark.timeout(120)
def test_the_out_of_core_partitioner_records_the_same_fingerprints(tmp_path: Path) -> None:
    """The chunked pipeline computes each part's fingerprint where the part is built (its
    check task) and records the value a server computes by hashing the finished output."""
    from _partition_helpers import make_graph

    from asyncgraph.partition.chunked_write import write_chunked
    from asyncgraph.partition.fingerprint import partition_fingerprint
    from asyncgraph.partition.stream import partition_chunked

    meta = write_chunked(make_graph("cora"), tmp_path / "chunks", 2, "numpy", "cora")
    partition_chunked(meta, 2, tmp_path / "out", part_method="random", seed=1, workers=1)
    config = tmp_path / "out" / "cora.json"
    recorded = [p["fingerprint"] for p in json.loads(config.read_text())["parts"]]
    assert recorded == [partition_fingerprint(config, p) for p in range(2)]


def _open_files(folder: str) -> list[str]:
    """The files under ``folder`` this process holds descriptors of (one entry per descriptor)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder + "/"):
            out.append(target)
    return sorted(out)


def test_a_store_of_files_holds_one_descriptor_each_and_closes_them(cora2: Any, tmp_path: Path) -> None:
    """A store served from files (standalone mode's) holds one read-only descriptor per array
    and mapping per file, and closing it releases every descriptor (the mappings go with the
    last view); none of its arrays is writable, a push copies the tensor into memory first.
    On a private copy of the partition: other tests' stores of ``cora2`` may still be open."""
    import gc

    from asyncgraph.partition import load_partition
    from asyncgraph.storage.filemap import FileArray
    from asyncgraph.storage.store import PartitionStore

    shutil.copytree(Path(cora2.part_config).parent, tmp_path / "cora")
    cora2 = dataclasses.replace(cora2, part_config=tmp_path / "cora" / Path(cora2.part_config).name)
    folder = str((Path(cora2.part_config).parent / "part0").resolve())
    assert _open_files(folder) == []
    store = PartitionStore.from_partition(load_partition(cora2.part_config, 0))
    gc.collect()
    feat = store.stored(FEAT).data
    assert isinstance(feat, FileArray) and not store.local_rows(FEAT).flags.writeable
    assert isinstance(store.structure_arrays["indices"], FileArray)
    held = _open_files(folder)
    assert len(held) == len(set(held)) == 3 + len(store.tensor_names())  # one each, no duplicates
    digest = _sha(Path(cora2.part_config).parent / "part0" / "node_feat" / "feat.npy")
    row = np.full((1, store.local_rows(FEAT).shape[1]), 2.0, dtype=np.float32)
    store.push(FEAT, np.array([3]), row)  # standalone stores take writes: into a copy
    np.testing.assert_array_equal(store.pull(FEAT, np.array([3])), row)
    assert not isinstance(store.stored(FEAT).data, FileArray)
    assert _sha(Path(cora2.part_config).parent / "part0" / "node_feat" / "feat.npy") == digest
    store.close()
    gc.collect()
    assert _open_files(folder) == []
    maps = Path("/proc/self/maps").read_text()
    assert str((Path(cora2.part_config).parent / "part0" / "indices.npy").resolve()) not in maps


def _mapped_rss_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.parametrize("populate", [True, False])
def test_a_co_located_mapping_of_a_file_is_faulted_in_ahead_of_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, populate: bool
) -> None:
    """What a co-located process maps from a served file has its page tables filled by a
    background thread (a random gather then takes no fault per 4 KiB page), unless
    ``ASYNCGRAPH_POPULATE_FILES=0``; nothing is read on the caller's thread."""
    from asyncgraph.storage.filemap import npy_layout
    from asyncgraph.storage.memfd import SharedArray

    monkeypatch.setenv("ASYNCGRAPH_POPULATE_FILES", "1" if populate else "0")
    path = (tmp_path / "feat.npy").resolve()
    np.save(path, np.arange(4 << 20, dtype=np.float32).reshape(-1, 64))  # 16 MiB
    with open(path, "rb") as fh:
        offset, shape, dtype = npy_layout(fh, path)
    arr = SharedArray.from_fd(os.open(path, os.O_RDONLY), shape, dtype, writable=False, offset=offset)
    try:
        deadline = time.monotonic() + 20
        while populate and _mapped_rss_kib(path) < 16 << 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        if populate:
            assert _mapped_rss_kib(path) >= 16 << 10
        else:
            time.sleep(0.5)
            assert _mapped_rss_kib(path) < 1 << 10
        assert float(arr.array[12345, 7]) == 12345 * 64 + 7
    finally:
        arr.close()
