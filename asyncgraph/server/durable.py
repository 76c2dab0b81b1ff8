"""Durable server state: snapshots of every tensor (``server/snapshots.py``: the state folder's
layout, checksums and fingerprints) and a write-ahead log of acknowledged writes
(``server/wal.py``), restored and replayed at start.

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
import errno
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncgraph import failpoints
from asyncgraph.errors import AsyncGraphError, SnapshotFailedError, StorageFullError
from asyncgraph.server.request_log import RequestLog
from asyncgraph.server.snapshot_restore import read_overlay, restore_rows
from asyncgraph.server.snapshots import (
    MAX_EPOCH_STEP,
    References,
    SnapshotError,
    StateDir,
    check_epoch,
    describe,
    partition_fingerprint,
    read_snapshot,
)
from asyncgraph.server.wal import FsyncPolicy, WriteAheadLog
from asyncgraph.storage.store import PartitionStore

if TYPE_CHECKING:
    from asyncgraph.service.live import LiveStructure

__all__ = [
    "MAX_EPOCH_STEP",
    "DurableState",
    "FsyncPolicy",
    "RequestLog",
    "SnapshotError",
    "StateDir",
    "WriteAheadLog",
    "partition_fingerprint",
    "read_snapshot",
]

log = logging.getLogger("asyncgraph.server")


def snapshot_failed(epoch: int, where: Path, exc: OSError) -> SnapshotFailedError:
    """The typed error for a snapshot that could not be written (``StorageFullError`` when the
    disk or quota is full); the message names the epoch, the folder and the OS error."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    cls = StorageFullError if full else SnapshotFailedError
    log.error(
        "snapshot %d in %s failed (%s); nothing changed, the log still holds every write", epoch, where, exc
    )
    return cls(
        f"snapshot {epoch} could not be written in {where}: {exc}"
        + (" (the disk is full)" if full else "")
        + "; its partial files were removed and this server's epoch and log are unchanged"
    )


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
        #: Set while a snapshot streams the store to disk: writes wait for it (``held``).
        self._hold: asyncio.Future[None] | None = None
        #: The reference counts of non-persistent tensors, read at each snapshot (set by the
        #: server's handlers; ``None``: none are kept).
        self.references: References | None = None
        #: The partition's live structure (issue 35), whose overlay a snapshot keeps (set by the
        #: server's handlers; None: not kept).
        self.live: LiveStructure | None = None

    def restore(
        self,
        store: PartitionStore,
        apply: Any,
        load_references: Callable[[Mapping[str, Mapping[str, int]]], None] | None = None,
    ) -> tuple[int, int]:
        """Load the newest verified snapshot (rows, request ids, and reference counts given to
        ``load_references``), then replay the logs after it with ``apply(op, args)``.

        A logged write whose request id the snapshot already holds is in it: it is skipped, not
        applied twice. Returns ``(snapshot epoch, records replayed)`` and opens the newest log
        for new writes (appending, so a later replay keeps their order); the epoch is that log's.
        """
        if self.fingerprint is not None:
            self.dir.check_partition(store.graph_name, self.fingerprint, self.part_config)
        self.dir.remove_temp()
        snap = self.dir.latest_snapshot()
        base = 0
        if snap is not None:
            restore_rows(store, snap, self.fingerprint)
            self._restore_overlay(snap)
            self.requests.load(snap.manifest.get("request_ids", []))
            if load_references is not None:
                load_references(snap.manifest.get("references", {}))
            base = snap.epoch
        replayed = skipped = 0
        epochs = [e for e in self.dir.wal_epochs() if e >= base]
        inside = int(snap.manifest.get("wal_offset", 0)) if snap is not None else 0
        for e in epochs:
            path = self.dir.wal_path(e)
            start = inside if e == base else 0
            for record in WriteAheadLog.records(
                path, last=e == epochs[-1], recover=self.recover, start=start
            ):
                rid = record.get("rid")
                if rid and str(rid) in self.requests:
                    skipped += 1  # applied before the snapshot (or earlier in the log)
                    continue
                try:
                    apply(str(record["op"]), record["args"])
                except AsyncGraphError as exc:
                    if not self.recover:
                        raise
                    log.warning("--wal-recover: skipping a %s record of %s: %s", record["op"], path, exc)
                    continue
                if rid:
                    self.requests.add(str(rid), float(record.get("t", time.time())))
                replayed += 1
        if skipped:
            log.warning(
                "state %s: %d logged writes were already in the snapshot: skipped", self.dir.path, skipped
            )
        self.epoch = max([base, *epochs])
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
        """``snapshot`` with the files written on a worker thread, so reads keep being served.

        Writes are held back (``held``) from the moment the tensor list, request ids and
        reference counts are read until the snapshot is in place and its log opened: the worker
        thread streams the rows in chunks straight from the store's memory under its read lock
        (co-located writers wait too), and the next log is opened on the event loop once the
        snapshot is renamed into place, so a logged write is in the snapshot or in the next
        log, never both, and no copy of a tensor is made. A crash before the rename leaves the
        older snapshot and its log (the epoch is not advanced); a failure removes the temp
        folder and raises ``SnapshotFailedError`` (``StorageFullError`` for a full disk).
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            final = self._check_epoch(epoch)
            if final.exists():
                await asyncio.to_thread(read_snapshot, final)
                return final
            if failpoints.enabled:
                failpoints.hit("snapshot.begin")
            hold = asyncio.get_running_loop().create_future()
            self._hold = hold
            try:
                try:
                    self.sync()
                    offset = self._wal_offset(epoch)
                    described = describe(
                        store, self.requests, self.fingerprint, self.references, offset, self._overlay()
                    )
                    path = await asyncio.to_thread(self.dir.write_streamed, store, described, epoch)
                except OSError as exc:
                    raise snapshot_failed(epoch, self.dir.path, exc) from None
                self._next_log(epoch)
            finally:
                self._hold = None
                hold.set_result(None)
            self._prune(epoch)
            return path

    def _overlay(self) -> Any:
        return self.live.state() if self.live is not None else None

    def _restore_overlay(self, snap: Any) -> None:
        state = read_overlay(snap)
        if state is not None and self.live is not None:
            self.live.load(*state)

    def exclusive(self) -> asyncio.Lock:
        """The lock a snapshot holds while it is written (a compaction holds it from its log
        record to its swap, so no snapshot falls in between)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def held(self) -> asyncio.Future[None] | None:
        """While a snapshot is being written: a future done when it is (await it before
        changing the store from the event loop); otherwise None."""
        return self._hold

    def _check_epoch(self, epoch: int) -> Path:
        """The folder of snapshot ``epoch``, which must not be older than this server's epoch.

        An equal epoch is a retry: of a finished snapshot (its folder is kept), or of one a crash
        interrupted before its rename (then its log ``wal-<epoch>`` may already hold later
        writes, so the new snapshot records how much of that log it holds: ``wal_offset``)."""
        check_epoch(epoch, self.epoch)
        return self.dir.snapshot_path(epoch)

    def _wal_offset(self, epoch: int) -> int:
        """Bytes of the current log the snapshot of ``epoch`` will hold: all of it when the
        snapshot is of this server's own epoch (its log goes on after it), else none (a new log)."""
        if self.wal is None or epoch != self.epoch:
            return 0
        self.wal.sync()
        return self.wal.size()

    def _next_log(self, epoch: int) -> None:
        """Start log ``epoch`` once snapshot ``epoch`` is in place; if it cannot be opened, it
        and the snapshot are removed again (the old log goes on) and ``SnapshotFailedError``
        raised. Writes are held back meanwhile, so the new log is still empty."""
        if self.use_wal and epoch != self.epoch:  # an equal epoch's log goes on (``wal_offset``)
            path = self.dir.wal_path(epoch)
            new = None
            try:
                new = WriteAheadLog(path, self.fsync, self.fsync_interval)
                if failpoints.enabled:
                    failpoints.hit("snapshot.log_opened")
            except OSError as exc:
                if new is not None:
                    new.close()
                path.unlink(missing_ok=True)
                self.dir.discard(epoch)
                raise snapshot_failed(epoch, self.dir.path, exc) from None
            old, self.wal = self.wal, new
            if old is not None:
                try:
                    old.close()
                except OSError as exc:  # its writes are in the snapshot now
                    log.warning("state %s: closing the previous log failed: %s", self.dir.path, exc)
        self.epoch = epoch

    def _prune(self, epoch: int) -> None:
        try:
            self.dir.prune(epoch)
        except OSError as exc:  # the snapshot is taken; what is left is removed next time
            log.warning("state %s: removing older snapshots and logs failed: %s", self.dir.path, exc)
        if failpoints.enabled:
            failpoints.hit("snapshot.pruned")

    def snapshot(self, store: PartitionStore, epoch: int) -> Path:
        """Write snapshot ``epoch`` and start its log (the previous logs are pruned later)."""
        final = self._check_epoch(epoch)
        if final.exists():
            read_snapshot(final)
            return final
        self.sync()
        try:
            offset = self._wal_offset(epoch)
            path = self.dir.write_snapshot(
                store, epoch, self.requests, self.fingerprint, self.references, offset, self._overlay()
            )
        except OSError as exc:
            raise snapshot_failed(epoch, self.dir.path, exc) from None
        self._next_log(epoch)
        self._prune(epoch)
        return path

    def sync(self) -> None:
        if self.wal is not None:
            self.wal.sync()

    def close(self) -> None:
        if self.wal is not None:
            self.wal.close()
            self.wal = None
