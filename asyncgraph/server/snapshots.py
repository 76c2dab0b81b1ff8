"""A server's state folder: checksummed snapshots of every tensor, tied to their partition.

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
place, so a folder named ``snap-<epoch>`` is complete; only then is ``wal-<epoch>`` started (writes
are held back meanwhile), so an unfinished snapshot leaves no log of its epoch, and a failed one
removes its temp folder (a restart removes any a crash left). A snapshot taken at the epoch of the
log being written (a retry on a folder where the previous release's unfinished snapshot had
started ``wal-<epoch>``) records in ``wal_offset`` how many bytes of that log it holds, and a
restore replays the log from there; a restore also skips a logged write whose request id the
snapshot holds. A snapshot whose files do not match their
checksums is skipped with a warning and the previous complete one is used. The two newest
snapshots and the logs from the older one on are kept, so falling back loses nothing: replaying
``wal-<e>`` for every ``e >=`` the restored epoch, in order, rebuilds every acknowledged write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asyncgraph import failpoints
from asyncgraph.errors import AsyncGraphError, InvalidRequestError
from asyncgraph.partition.fingerprint import partition_fingerprint
from asyncgraph.protocol.ops import MAX_EPOCH
from asyncgraph.server.live_snapshot import write_overlay
from asyncgraph.server.request_log import RequestLog
from asyncgraph.storage.filemap import is_file_backed
from asyncgraph.storage.store import PartitionStore, TensorMeta

__all__ = [
    "MAX_EPOCH_STEP",
    "Described",
    "References",
    "Snapshot",
    "SnapshotError",
    "StateDir",
    "check_epoch",
    "describe",
    "manifest_checksum",
    "partition_fingerprint",
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


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of a manifest's canonical JSON, without its own ``manifest_sha256``."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(_canonical(body)).hexdigest()


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
class Described:
    """What a snapshot holds besides the rows: the tensors, request ids and reference counts of
    one instant (the rows are streamed from the store afterwards, writes held back meanwhile)."""

    graph_name: str
    part_id: int
    tensors: list[TensorMeta]
    request_ids: list[list[Any]]
    fingerprint: str | None = None
    #: Non-persistent tensors' reference counts: tensor -> holder -> count.
    references: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Bytes of ``wal-<epoch>`` already inside the snapshot (a snapshot taken at the epoch of
    #: the log being written, which goes on after it): a restore replays that log from there.
    wal_offset: int = 0
    #: A live graph's overlay (``server/live_snapshot.py``), None when never updated.
    overlay: Any = None


References = Callable[[], dict[str, dict[str, int]]]

#: Bytes of a tensor hashed and written at a time: a snapshot's extra memory, whatever its size.
SNAPSHOT_CHUNK = 8 << 20


def describe(
    store: PartitionStore,
    requests: RequestLog,
    fingerprint: str | None = None,
    references: References | None = None,
    wal_offset: int = 0,
    overlay: Any = None,
) -> Described:
    """The tensor list, request ids and reference counts of this instant (no rows copied)."""
    refs = references() if references is not None else {}
    tensors, rids = store.list_tensors(), requests.items()
    return Described(store.graph_name, store.part_id, tensors, rids, fingerprint, refs, wal_offset, overlay)


def _stream_rows(rows: np.ndarray, path: Path) -> str:
    """Write ``rows``' raw C-order bytes to ``path`` chunk by chunk, straight from its memory;
    fsync; return their SHA-256."""
    if not rows.flags.c_contiguous:  # store tensors are; only then is a chunk ever copied
        rows = np.ascontiguousarray(rows)
    flat = rows.reshape(-1).view(np.uint8).data
    h = hashlib.sha256()
    with open(path, "wb", buffering=0) as fh:
        for start in range(0, len(flat), SNAPSHOT_CHUNK):
            if failpoints.enabled:
                failpoints.hit("snapshot.write_rows")
            piece = flat[start : start + SNAPSHOT_CHUNK]
            h.update(piece)
            view = piece
            while len(view):
                view = view[fh.write(view) :]
        os.fsync(fh.fileno())
    return h.hexdigest()


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
        wal_offset: int = 0,
        overlay: Any = None,
    ) -> Path:
        """Write every tensor's rows atomically as ``snap-<epoch>``; returns its folder."""
        final = self.snapshot_path(epoch)
        if final.exists():
            read_snapshot(final)  # already taken (a retried SNAPSHOT): keep it if it verifies
            return final
        described = describe(store, requests, fingerprint, references, wal_offset, overlay)
        return self.write_streamed(store, described, epoch)

    def write_streamed(self, store: PartitionStore, described: Described, epoch: int) -> Path:
        """Write ``described``'s tensors as ``snap-<epoch>`` (temp folder, fsync, rename),
        streaming their rows from the store under its read lock; the caller keeps the store's
        own writes from changing it meanwhile. On an error before the rename (a full disk) the
        temp folder is removed and the error raised: nothing is left behind."""
        final = self.snapshot_path(epoch)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            self._write_temp(store, described, epoch, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        os.rename(tmp, final)
        _fsync_dir(self.path)
        if failpoints.enabled:
            failpoints.hit("snapshot.renamed")
        return final

    def discard(self, epoch: int) -> None:
        """Remove snapshot ``epoch`` again (its next log could not be opened): renamed back to a
        temp name first, so a crash midway leaves nothing a restore would load."""
        final = self.snapshot_path(epoch)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.rename(final, tmp)
        _fsync_dir(self.path)
        shutil.rmtree(tmp, ignore_errors=True)

    def remove_temp(self) -> None:
        """Remove what unfinished snapshots left (``snap-<e>.tmp``): a restore never loads them."""
        for p in self.path.glob("*.tmp"):
            if p.is_dir():
                log.warning("state folder %s: removing the unfinished snapshot %s", self.path, p.name)
            shutil.rmtree(p, ignore_errors=True)

    def _write_temp(self, store: PartitionStore, described: Described, epoch: int, tmp: Path) -> None:
        tmp.mkdir()
        entries = []
        with store.lock.read():
            for i, meta in enumerate(described.tensors):
                file = f"t{i}.bin"
                rows = store.local_rows(meta.name)
                digest = _stream_rows(rows, tmp / file)
                entries.append(
                    {
                        **meta.to_dict(),
                        "file": file,
                        "nbytes": int(rows.nbytes),
                        "local_rows": int(rows.shape[0]),
                        "sha256": digest,
                        # rows still those of the partition file (issue 34): a restore keeps
                        # serving the file instead of copying them into memory
                        "from_file": is_file_backed(store.stored(meta.name).data),
                    }
                )
        manifest = {
            "format": _FORMAT,
            "graph_name": described.graph_name,
            "part_id": described.part_id,
            "epoch": epoch,
            "created": time.time(),
            "tensors": entries,
            "request_ids": described.request_ids,
            "fingerprint": described.fingerprint,
            "references": described.references,
            "wal_offset": described.wal_offset,
        }
        if described.overlay is not None:
            manifest["overlay"] = write_overlay(tmp, described.overlay)
        if failpoints.enabled:
            failpoints.hit("snapshot.rows_written")
        manifest["manifest_sha256"] = manifest_checksum(manifest)
        with open(tmp / "manifest.json", "w") as fh:
            json.dump(manifest, fh)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if failpoints.enabled:
            failpoints.hit("snapshot.temp_synced")

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
