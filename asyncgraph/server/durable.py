"""Durable server state: snapshots of every tensor and a write-ahead log of acknowledged writes.

Layout of a server's state folder (``--state-dir DIR``; one sub-folder per partition)::

    DIR/part<p>/snap-<epoch>/manifest.json   every tensor's meta, file, size and SHA-256; the
    DIR/part<p>/snap-<epoch>/t<i>.bin        epoch; recent request ids. Raw C-order rows.
    DIR/part<p>/wal-<epoch>.log              writes acknowledged after snapshot <epoch>
    DIR/part<p>/partition.json               the fingerprint of the partition this state is of

State is tied to what it describes: the partition's fingerprint (SHA-256 of its config and its
structure files, ``partition_fingerprint``) is recorded in ``partition.json`` and in every
manifest, and a server loading another partition (re-partitioned under the same graph name, the
wrong ``--part-id``) refuses the folder, naming both. Every manifest carries the SHA-256 of its
own canonical JSON (``manifest_sha256``): an edited manifest is corrupt, and the previous
snapshot is used instead, as for a bad data file.

A snapshot is written into ``snap-<epoch>.tmp`` (files fsynced, manifest last) and renamed into
place, so a folder named ``snap-<epoch>`` is complete; a snapshot whose files do not match their
checksums is skipped with a warning and the previous complete one is used. The two newest
snapshots and the logs from the older one on are kept, so falling back loses nothing: replaying
``wal-<e>`` for every ``e >=`` the restored epoch, in order, rebuilds every acknowledged write.

A log record is ``crc32 (4 bytes, big endian) + one protocol frame`` (``encode_frame``: msgpack
header, arrays as raw bytes, never pickle) holding ``{"op", "args", "rid"}``. Replay drops a torn
tail (an incomplete last record: what a crash leaves) and refuses a corrupt record followed by
valid ones (``WalCorruptError``; ``--wal-recover`` moves the log aside and replays what verifies).

Fsync policy (``--wal-fsync``): ``always`` fsyncs the log before a write is acknowledged (survives
power loss); ``interval`` fsyncs at most every ``fsync_interval`` seconds (an acknowledged write
survives a process crash, ``kill -9`` included, since it is in the kernel's page cache, but up to
that interval of writes may be lost on power loss or a kernel crash).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph.errors import AsyncGraphError, InvalidRequestError
from asyncgraph.protocol.ops import MAX_EPOCH
from asyncgraph.server.wal import FsyncPolicy, WriteAheadLog
from asyncgraph.storage.store import PartitionStore, TensorMeta

__all__ = [
    "DurableState",
    "FsyncPolicy",
    "RequestLog",
    "SnapshotError",
    "StateDir",
    "WriteAheadLog",
    "read_snapshot",
]

log = logging.getLogger("asyncgraph.server")

_FORMAT = 2
#: Format-1 manifests (no checksum, no fingerprint) are still read, with a warning.
_OLD_FORMATS = (1,)
_FINGERPRINT_FILE = "partition.json"
#: Most a snapshot request may move this server's epoch forward: epochs only grow, by bounded
#: steps, and stay below ``MAX_EPOCH``, so no client can exhaust them or make them overflow
#: (servers snapshotting on their own, ``--snapshot-interval``, drift apart by far less).
MAX_EPOCH_STEP = 1 << 24


def check_epoch(epoch: int, current: int) -> None:
    """``InvalidRequestError`` unless ``current <= epoch <= min(current + MAX_EPOCH_STEP, MAX_EPOCH)``."""
    if epoch < current:
        raise SnapshotError(f"snapshot epoch {epoch} is older than this server's epoch {current}")
    if epoch > MAX_EPOCH or epoch - current > MAX_EPOCH_STEP:
        raise InvalidRequestError(
            f"snapshot epoch {epoch} is out of bounds: this server is at epoch {current}, and an epoch "
            f"may move forward by at most {MAX_EPOCH_STEP} and never past {MAX_EPOCH}"
        )


class SnapshotError(AsyncGraphError):
    """A state folder holds no usable snapshot (missing, incomplete or corrupt files)."""

    code = "snapshot"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


class RequestLog:
    """Client request ids of applied non-idempotent writes, remembered for ``window`` seconds.

    A retried write whose id is here was applied before (its reply was lost): it is acknowledged
    again without being applied twice. Persisted with the WAL and the snapshot's manifest.
    """

    def __init__(self, window: float = 600.0, max_entries: int = 1 << 20) -> None:
        self.window = window
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, rid: str) -> bool:
        return rid in self._seen

    def add(self, rid: str, when: float | None = None) -> None:
        now = time.time() if when is None else when
        self._seen[rid] = now
        self._seen.move_to_end(rid)
        cutoff = time.time() - self.window
        while self._seen and (len(self._seen) > self.max_entries or next(iter(self._seen.values())) < cutoff):
            self._seen.popitem(last=False)

    def items(self) -> list[list[Any]]:
        return [[rid, t] for rid, t in self._seen.items()]

    def load(self, items: Any) -> None:
        for rid, when in items:
            self.add(str(rid), float(when))


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of a manifest's canonical JSON, without its own ``manifest_sha256``."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(_canonical(body)).hexdigest()


def partition_fingerprint(part_config: Path, part_id: int) -> str:
    """SHA-256 of partition ``part_id``: its config (canonical JSON) and structure files.

    A re-partitioned graph gets another fingerprint even under the same name, so state written
    for the old partition is refused instead of serving old rows against the new structure.
    """
    from asyncgraph.partition.config import PartitionConfig
    from asyncgraph.partition.layout import PartFiles

    h = hashlib.sha256()
    h.update(_canonical(json.loads(Path(part_config).read_text())))
    h.update(f"|part {part_id}|".encode())
    files = PartFiles(PartitionConfig.load(Path(part_config)).part_dir(part_config, part_id))
    for path in (files.indptr, files.indices, files.eids):
        h.update(path.name.encode())
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


# --- snapshots ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """A verified snapshot on disk."""

    path: Path
    epoch: int
    manifest: dict[str, Any]


def read_snapshot(path: Path, *, verify: bool = True) -> Snapshot:
    """Read and (by default) checksum-verify one ``snap-<epoch>`` folder; SnapshotError if bad."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"snapshot {path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in (_FORMAT, *_OLD_FORMATS):
        raise SnapshotError(f"snapshot {path}: not a format-{_FORMAT} manifest")
    if manifest["format"] == _FORMAT:
        if manifest.get("manifest_sha256") != manifest_checksum(manifest):
            raise SnapshotError(
                f"snapshot {path}: manifest.json does not match its checksum (edited or corrupt)"
            )
    else:
        log.warning(
            "snapshot %s: format-%d manifest, without a checksum or fingerprint", path, manifest["format"]
        )
    if verify:
        for entry in manifest["tensors"]:
            file = path / entry["file"]
            try:
                size = file.stat().st_size
            except OSError:
                raise SnapshotError(f"snapshot {path}: file {entry['file']} is missing") from None
            if size != entry["nbytes"]:
                raise SnapshotError(
                    f"snapshot {path}: {entry['file']} has {size} bytes, manifest says {entry['nbytes']}"
                )
            if _sha256(file) != entry["sha256"]:
                raise SnapshotError(
                    f"snapshot {path}: checksum mismatch in {entry['file']} ({entry['name']})"
                )
    return Snapshot(path, int(manifest["epoch"]), manifest)


@dataclass(frozen=True)
class Captured:
    """A point-in-time copy of a store's tensors and the remembered request ids."""

    graph_name: str
    part_id: int
    copies: list[tuple[TensorMeta, np.ndarray]]
    request_ids: list[list[Any]]
    fingerprint: str | None = None
    #: Non-persistent tensors' reference counts: tensor -> holder -> count.
    references: dict[str, dict[str, int]] = field(default_factory=dict)


References = Callable[[], dict[str, dict[str, int]]]


def capture(
    store: PartitionStore,
    requests: RequestLog,
    fingerprint: str | None = None,
    references: References | None = None,
) -> Captured:
    """Copy every tensor's rows under the store's read lock (co-located writers wait), with the
    request ids and the reference counts of the same instant."""
    with store.lock.read():
        copies = [(meta, np.array(store.local_rows(meta.name), copy=True)) for meta in store.list_tensors()]
    refs = references() if references is not None else {}
    return Captured(store.graph_name, store.part_id, copies, requests.items(), fingerprint, refs)


class StateDir:
    """One partition's snapshots and write-ahead logs under ``root/part<p>``."""

    def __init__(self, root: Path, part_id: int) -> None:
        self.path = Path(root) / f"part{part_id}"
        self.path.mkdir(parents=True, exist_ok=True)
        self.part_id = part_id

    def check_partition(self, graph_name: str, fingerprint: str, part_config: str = "") -> None:
        """Refuse a folder written for another partition; adopt (record) it when it names none."""
        path = self.path / _FINGERPRINT_FILE
        mine = {"graph_name": graph_name, "part_id": self.part_id, "fingerprint": fingerprint}
        if path.exists():
            try:
                have = json.loads(path.read_text())
                theirs = str(have["fingerprint"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise SnapshotError(
                    f"state folder {self.path}: unreadable {_FINGERPRINT_FILE} ({exc})"
                ) from None
            if theirs != fingerprint:
                raise SnapshotError(
                    f"state folder {self.path} holds state of graph {have.get('graph_name')!r} partition "
                    f"{have.get('part_id')} with fingerprint {theirs} (config {have.get('part_config')}), "
                    f"but this server loads graph {graph_name!r} partition {self.part_id} with fingerprint "
                    f"{fingerprint} (config {part_config}): the partition was rebuilt or another one "
                    "was named; refusing its state (use a fresh --state-dir for the new partition)"
                )
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({**mine, "part_config": part_config}))
        os.replace(tmp, path)
        _fsync_dir(self.path)

    def _epochs(self, prefix: str, suffix: str = "") -> list[int]:
        out = []
        for p in self.path.iterdir():
            name = p.name
            if name.startswith(prefix) and name.endswith(suffix) and not name.endswith(".tmp"):
                core = name[len(prefix) : len(name) - len(suffix)]
                if core.isdigit():
                    out.append(int(core))
        return sorted(out)

    def snapshot_path(self, epoch: int) -> Path:
        return self.path / f"snap-{epoch:08d}"

    def wal_path(self, epoch: int) -> Path:
        return self.path / f"wal-{epoch:08d}.log"

    def snapshot_epochs(self) -> list[int]:
        return self._epochs("snap-")

    def wal_epochs(self) -> list[int]:
        return self._epochs("wal-", ".log")

    def latest_epoch(self) -> int:
        """The newest epoch with a snapshot or a log (0 when empty)."""
        return max([0, *self.snapshot_epochs(), *self.wal_epochs()])

    # --- writing -------------------------------------------------------------------------
    def write_snapshot(
        self,
        store: PartitionStore,
        epoch: int,
        requests: RequestLog,
        fingerprint: str | None = None,
        references: References | None = None,
    ) -> Path:
        """Write every tensor's rows atomically as ``snap-<epoch>``; returns its folder."""
        final = self.snapshot_path(epoch)
        if final.exists():
            read_snapshot(final)  # already taken (a retried SNAPSHOT): keep it if it verifies
            return final
        return self.write_captured(capture(store, requests, fingerprint, references), epoch)

    def write_captured(self, captured: Captured, epoch: int) -> Path:
        """Write captured rows as ``snap-<epoch>`` (temp folder, fsync, rename); no store access."""
        final = self.snapshot_path(epoch)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        entries = []
        for i, (meta, rows) in enumerate(captured.copies):
            file = f"t{i}.bin"
            raw = np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data
            with open(tmp / file, "wb") as fh:
                fh.write(raw)
                fh.flush()
                os.fsync(fh.fileno())
            entries.append(
                {
                    **meta.to_dict(),
                    "file": file,
                    "nbytes": int(rows.nbytes),
                    "local_rows": int(rows.shape[0]),
                    "sha256": hashlib.sha256(raw).hexdigest(),
                }
            )
        manifest = {
            "format": _FORMAT,
            "graph_name": captured.graph_name,
            "part_id": captured.part_id,
            "epoch": epoch,
            "created": time.time(),
            "tensors": entries,
            "request_ids": captured.request_ids,
            "fingerprint": captured.fingerprint,
            "references": captured.references,
        }
        manifest["manifest_sha256"] = manifest_checksum(manifest)
        with open(tmp / "manifest.json", "w") as fh:
            json.dump(manifest, fh)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(self.path)
        return final

    def prune(self, keep_from_epoch: int) -> None:
        """Delete snapshots older than the two newest and logs older than the older kept one."""
        snaps = self.snapshot_epochs()
        kept = snaps[-2:]
        oldest = min(kept) if kept else keep_from_epoch
        for e in snaps[:-2]:
            shutil.rmtree(self.snapshot_path(e), ignore_errors=True)
        for e in self.wal_epochs():
            if e < oldest:
                self.wal_path(e).unlink(missing_ok=True)
        for p in self.path.glob("*.tmp"):
            shutil.rmtree(p, ignore_errors=True)

    # --- reading -------------------------------------------------------------------------
    def latest_snapshot(self) -> Snapshot | None:
        """The newest snapshot that verifies; older ones are tried in turn, with a warning each."""
        epochs = self.snapshot_epochs()
        errors = []
        for e in reversed(epochs):
            try:
                return read_snapshot(self.snapshot_path(e))
            except SnapshotError as exc:
                log.warning("%s; trying an older snapshot", exc)
                errors.append(str(exc))
                bad = self.snapshot_path(e)
                bad.rename(bad.with_name(f"{bad.name}.corrupt-{int(time.time())}"))
        if epochs:
            if 0 in self.wal_epochs():  # the full history is still logged: replay it all
                log.warning("no snapshot verifies; replaying every write-ahead log from the start")
                return None
            raise SnapshotError(
                f"state folder {self.path} has no usable snapshot and no complete log: " + "; ".join(errors)
            )
        return None


def restore_rows(store: PartitionStore, snap: Snapshot, fingerprint: str | None = None) -> None:
    """Make ``store`` hold exactly the snapshot's tensors and rows (partition files are the base)."""
    manifest = snap.manifest
    if manifest["graph_name"] != store.graph_name or manifest["part_id"] != store.part_id:
        raise SnapshotError(
            f"snapshot {snap.path} is of graph {manifest['graph_name']!r} partition {manifest['part_id']}, "
            f"not graph {store.graph_name!r} partition {store.part_id}"
        )
    theirs = manifest.get("fingerprint")
    if fingerprint is not None and theirs is not None and theirs != fingerprint:
        raise SnapshotError(
            f"snapshot {snap.path} is of the partition with fingerprint {theirs}, this server loads "
            f"fingerprint {fingerprint}: refusing state written for another partition"
        )
    wanted = {e["name"] for e in manifest["tensors"]}
    for meta in store.list_tensors():
        if meta.name not in wanted:
            store.delete_tensor(meta.name)
    for entry in manifest["tensors"]:
        meta = TensorMeta.from_dict(entry)
        if store.has_tensor(meta.name) and store.tensor_meta(meta.name) != meta:
            store.delete_tensor(meta.name)
        store.create_tensor(meta.name, meta.policy, meta.shape, meta.dtype, None)
        rows = store.local_rows(meta.name)
        if rows.nbytes != entry["nbytes"]:
            raise SnapshotError(
                f"snapshot {snap.path}: tensor {meta.name!r} has {entry['nbytes']} bytes, "
                f"this partition holds {rows.nbytes}"
            )
        data = np.fromfile(snap.path / entry["file"], dtype=meta.dtype).reshape(rows.shape)
        with store.lock.write():
            rows[...] = data


class DurableState:
    """A server's snapshots, write-ahead log and remembered request ids, in one state folder."""

    def __init__(
        self,
        root: Path,
        part_id: int,
        *,
        wal: bool,
        fsync: FsyncPolicy = "always",
        fsync_interval: float = 0.05,
        requests: RequestLog | None = None,
        recover: bool = False,
        fingerprint: str | None = None,
        part_config: str = "",
    ) -> None:
        self.dir = StateDir(root, part_id)
        #: ``--wal-recover``: replay a corrupt log's valid records (moved aside first) instead of
        #: refusing to start; a record that no longer applies is skipped with a warning.
        self.recover = recover
        #: ``partition_fingerprint`` of the partition served: state of another one is refused.
        self.fingerprint = fingerprint
        self.part_config = part_config
        self.use_wal = wal
        self.fsync: FsyncPolicy = fsync
        self.fsync_interval = fsync_interval
        self.requests = requests if requests is not None else RequestLog()
        self.epoch = 0
        self.wal: WriteAheadLog | None = None
        self._lock: asyncio.Lock | None = None
        #: The reference counts of non-persistent tensors, read at each snapshot (set by the
        #: server's handlers; ``None``: none are kept).
        self.references: References | None = None

    def restore(
        self,
        store: PartitionStore,
        apply: Any,
        load_references: Callable[[Mapping[str, Mapping[str, int]]], None] | None = None,
    ) -> tuple[int, int]:
        """Load the newest verified snapshot (rows, request ids, and reference counts given to
        ``load_references``), then replay the logs after it with ``apply(op, args)``.

        Returns ``(snapshot epoch, records replayed)`` and opens the log for new writes.
        """
        if self.fingerprint is not None:
            self.dir.check_partition(store.graph_name, self.fingerprint, self.part_config)
        snap = self.dir.latest_snapshot()
        base = 0
        if snap is not None:
            restore_rows(store, snap, self.fingerprint)
            self.requests.load(snap.manifest.get("request_ids", []))
            if load_references is not None:
                load_references(snap.manifest.get("references", {}))
            base = snap.epoch
        replayed = 0
        epochs = [e for e in self.dir.wal_epochs() if e >= base]
        for e in epochs:
            path = self.dir.wal_path(e)
            for record in WriteAheadLog.records(path, last=e == epochs[-1], recover=self.recover):
                try:
                    apply(str(record["op"]), record["args"])
                except AsyncGraphError as exc:
                    if not self.recover:
                        raise
                    log.warning("--wal-recover: skipping a %s record of %s: %s", record["op"], path, exc)
                    continue
                if record.get("rid"):
                    self.requests.add(str(record["rid"]), float(record.get("t", time.time())))
                replayed += 1
        self.epoch = self.dir.latest_epoch()
        if self.use_wal:
            self.wal = WriteAheadLog(self.dir.wal_path(self.epoch), self.fsync, self.fsync_interval)
        return base, replayed

    def log(self, op: str, args: Mapping[str, Any], rid: str | None) -> Awaitable[None] | None:
        """Append a write to the log. Under ``--wal-fsync always`` on a running event loop the
        fsync is shared with the writes around it (group commit): await the result before
        acknowledging. Elsewhere (``interval``, or no loop) nothing is left to wait for."""
        if self.wal is None:
            return None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.wal.append(op, args, rid)
            return None
        record = self.wal.append(op, args, rid, defer_sync=True)
        if self.wal.fsync != "always":
            return None
        return self.wal.wait_durable(record)

    async def snapshot_async(self, store: PartitionStore, epoch: int) -> Path:
        """``snapshot`` with the files written on a worker thread, so requests keep being served.

        The rows are copied and the new log started at once (on the event loop, so no write
        falls between the two); a crash before the rename leaves the older snapshot plus both
        logs, which a restore replays.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            check_epoch(epoch, self.epoch)
            final = self.dir.snapshot_path(epoch)
            if final.exists():
                await asyncio.to_thread(read_snapshot, final)
                return final
            captured = capture(store, self.requests, self.fingerprint, self.references)
            self._next_log(epoch)
            path = await asyncio.to_thread(self.dir.write_captured, captured, epoch)
            self.dir.prune(epoch)
            return path

    def _next_log(self, epoch: int) -> None:
        if self.wal is not None:
            self.wal.sync()
        if epoch != self.epoch and self.use_wal:
            old = self.wal
            self.wal = WriteAheadLog(self.dir.wal_path(epoch), self.fsync, self.fsync_interval)
            if old is not None:
                old.close()
        self.epoch = epoch

    def snapshot(self, store: PartitionStore, epoch: int) -> Path:
        """Write snapshot ``epoch`` and start its log (the previous logs are pruned later)."""
        check_epoch(epoch, self.epoch)
        path = self.dir.write_snapshot(store, epoch, self.requests, self.fingerprint, self.references)
        self._next_log(epoch)
        self.dir.prune(epoch)
        return path

    def sync(self) -> None:
        if self.wal is not None:
            self.wal.sync()

    def close(self) -> None:
        if self.wal is not None:
            self.wal.close()
            self.wal = None
