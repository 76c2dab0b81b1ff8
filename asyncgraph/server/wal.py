"""The write-ahead log of acknowledged writes (one file per snapshot epoch).

A record is ``crc32 (4 bytes, big endian) + one protocol frame`` (``encode_frame``: msgpack
header, arrays as raw bytes, never pickle) holding ``{"op", "args", "rid", "t"}``; records written
by a protocol-1 release (ExtType-1 array references) still decode, so its logs replay.

Reading tells a torn tail from corruption. A crash can only cut the *last* record short, so a bad
record with nothing valid after it is a torn tail: it is dropped (the file truncated there) with a
warning. A bad record followed by a valid one is corruption (a flipped byte, a bad sector): every
later record was acknowledged, so reading refuses (``WalCorruptError`` naming the file and the
offset) and leaves the file as it is, unless asked to recover (``--wal-recover``): then the log is
moved aside (``<name>.corrupt-<time>``, never deleted), the records that verify are written back
in order and the skipped byte ranges are logged.
A log is read as a stream, one record at a time (a first pass of lengths and CRCs, then the
replay), so restoring a log of any size takes about one record's memory.
``always`` fsyncs before a write is acknowledged; ``interval`` at most every ``fsync_interval``
seconds (see ``asyncgraph.server.durable`` for what each survives).
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from asyncgraph import failpoints
from asyncgraph.errors import AsyncGraphError
from asyncgraph.protocol.codec import decode_frame, encode_frame
from asyncgraph.protocol.framing import LENGTH_PREFIX

__all__ = ["FsyncPolicy", "WalCorruptError", "WriteAheadLog"]

log = logging.getLogger("asyncgraph.server")

FsyncPolicy = Literal["always", "interval"]
_CRC = struct.Struct(">I")
_HEAD = _CRC.size + LENGTH_PREFIX.size
#: Every record's frame starts with a 4-byte header length, then the msgpack map
#: ``{"op": ..., "args": ..., "rid": ..., "t": ...}`` (fixmap of 4, key "op" first).
_RECORD_MARK = b"\x84\xa2op"
_MARK_AT = _HEAD + 4


class WalCorruptError(AsyncGraphError):
    """A write-ahead log has a bad record followed by valid ones (not a torn tail).

    Start-up refuses: the records after it were acknowledged. ``--wal-recover`` moves the log
    aside and replays the records that verify.
    """

    code = "wal_corrupt"

    def __init__(self, message: str, path: Path, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


#: Bytes read at a time while checking a record or looking for the next one: with one record
#: decoded at a time, what replaying a log of any size keeps in memory besides that record.
_BLOCK = 1 << 20


def _record_end(fh: BinaryIO, pos: int, size: int) -> int | None:
    """The end of a record starting at ``pos`` whose length fits and whose CRC matches, or None
    (the CRC is computed block by block: a corrupt length costs no allocation of that size)."""
    if pos + _HEAD > size:
        return None
    fh.seek(pos)
    head = fh.read(_HEAD)
    (crc,) = _CRC.unpack_from(head)
    (body_len,) = LENGTH_PREFIX.unpack_from(head, _CRC.size)
    end: int = pos + _HEAD + int(body_len)
    if end > size:
        return None
    got = zlib.crc32(head[_CRC.size :])
    left = int(body_len)
    while left:
        block = fh.read(min(_BLOCK, left))
        if not block:
            return None
        got = zlib.crc32(block, got)
        left -= len(block)
    return end if got == crc else None


def _next_record(fh: BinaryIO, start: int, size: int) -> int | None:
    """The first offset after ``start`` where a whole, CRC-valid record begins, or None.

    Only offsets whose bytes look like a record header (``_RECORD_MARK``) are checked, so a
    torn tail of a large record costs one pass of block-wise ``bytes.find``, not a CRC per byte.
    """
    at = start + _MARK_AT + 1
    keep = len(_RECORD_MARK) - 1
    while at < size:
        fh.seek(at)
        block = fh.read(_BLOCK + keep)
        idx = block.find(_RECORD_MARK)
        while idx >= 0:
            cand = at + idx - _MARK_AT
            if _record_end(fh, cand, size) is not None:
                return cand
            idx = block.find(_RECORD_MARK, idx + 1)
        at += _BLOCK
    return None


def _decode_at(fh: BinaryIO, path: Path, start: int, end: int, recover: bool) -> dict[str, Any] | None:
    """The record at ``start``; one whose CRC is valid but whose frame does not decode is
    refused (``WalCorruptError``: start-up stops, what was replayed goes with the process), or
    skipped with a warning under ``--wal-recover`` (None)."""
    fh.seek(start + _HEAD)
    try:
        record: dict[str, Any] = decode_frame(memoryview(fh.read(end - start - _HEAD)))
    except AsyncGraphError as exc:
        if not recover:
            raise WalCorruptError(
                f"write-ahead log {path}: the record at byte offset {start} has a valid checksum but "
                f"does not decode ({exc}): refusing to start; --wal-recover skips it",
                path,
                start,
            ) from None
        log.warning(
            "write-ahead log %s: --wal-recover skips the undecodable record at %d: %s", path, start, exc
        )
        return None
    return record


@dataclass
class _Scan:
    """What a pass over a log found: corrupt byte spans (each followed by a valid record), where
    a torn tail starts (the size when there is none), and the valid records after the first bad span."""

    bad: list[tuple[int, int]] = field(default_factory=list)
    tail: int = 0
    after_first_bad: int = 0


def _scan(fh: BinaryIO, path: Path, size: int) -> _Scan:
    """Check every record's length and CRC, one at a time; nothing but the bad spans is kept."""
    scan = _Scan()
    pos = 0
    while pos < size:
        end = _record_end(fh, pos, size)
        if end is not None:
            scan.after_first_bad += bool(scan.bad)
            pos = end
            continue
        nxt = _next_record(fh, pos, size)
        if nxt is None:
            scan.tail = pos
            return scan
        scan.bad.append((pos, nxt))
        pos = nxt
    scan.tail = size
    return scan


def _spans(fh: BinaryIO, tail: int, bad: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The valid records' spans up to ``tail``, stepping over the ``bad`` ones (sorted)."""
    pos, skip = 0, 0
    while pos < tail:
        if skip < len(bad) and bad[skip][0] == pos:
            pos = bad[skip][1]
            skip += 1
            continue
        fh.seek(pos)
        (body_len,) = LENGTH_PREFIX.unpack_from(fh.read(_HEAD), _CRC.size)
        end = pos + _HEAD + int(body_len)
        yield pos, end
        pos = end


class WriteAheadLog:
    """Append-only log of acknowledged writes for one epoch (see the module docstring)."""

    def __init__(self, path: Path, fsync: FsyncPolicy, fsync_interval: float = 0.05) -> None:
        self.path = path
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self._fh = open(path, "ab")  # noqa: SIM115 - owned by this object, closed by close()
        self._last_sync = time.monotonic()
        self.appended = 0  # records appended so far
        self.synced = 0  # records known to be on disk
        self.fsyncs = 0
        self._sync_done: asyncio.Future[None] | None = None

    def append(self, op: str, args: Mapping[str, Any], rid: str | None, *, defer_sync: bool = False) -> int:
        """Log one write before it is acknowledged; returns its record number.

        Under ``always`` the record is fsynced here, unless ``defer_sync``: then the caller
        awaits ``wait_durable`` with the returned number before acknowledging (group commit).
        """
        if failpoints.enabled:
            failpoints.hit("wal.before_append")
        pieces = encode_frame({"op": op, "args": dict(args), "rid": rid, "t": time.time()})
        crc = 0
        for p in pieces:
            crc = zlib.crc32(p, crc)
        self._fh.write(_CRC.pack(crc))
        for p in pieces:
            self._fh.write(p)
        self._fh.flush()  # in the kernel now: survives kill -9
        self.appended += 1
        if failpoints.enabled:
            failpoints.hit("wal.appended")
        if self.fsync == "always":
            if not defer_sync:
                self.sync()
        elif time.monotonic() - self._last_sync >= self.fsync_interval:
            self.sync()
        return self.appended

    def sync(self) -> None:
        if self.synced < self.appended and not self._fh.closed:
            upto = self.appended
            os.fsync(self._fh.fileno())
            self.fsyncs += 1
            self.synced = upto
            if failpoints.enabled:
                failpoints.hit("wal.synced")
        self._last_sync = time.monotonic()

    async def wait_durable(self, record: int) -> None:
        """Return once record number ``record`` is on disk.

        Group commit: the fsync runs once the event loop has handled what is ready now (``call_soon``),
        so one fsync covers every write appended by the requests of that round.
        """
        while self.synced < record:
            done = self._sync_done
            if done is None or done.done():
                loop = asyncio.get_running_loop()
                done = self._sync_done = loop.create_future()
                loop.call_soon(self._sync_round, done)
            await asyncio.shield(done)

    def _sync_round(self, done: asyncio.Future[None]) -> None:
        try:
            self.sync()
        except OSError as exc:
            done.set_exception(exc)
            done.exception()  # retrieved here: every waiter still gets it, none leaves it unlogged
            return
        done.set_result(None)

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()

    def size(self) -> int:
        """Bytes in the log file now (what a snapshot of this epoch records as ``wal_offset``)."""
        self._fh.flush()
        return os.fstat(self._fh.fileno()).st_size

    @staticmethod
    def records(
        path: Path, *, last: bool = True, recover: bool = False, start: int = 0
    ) -> Iterator[dict[str, Any]]:
        """The log's records in order (see the module docstring for torn tails and corruption).

        The file is read record by record, twice: a first pass checks every record's length and
        CRC and keeps only the spans of bad ones, so a ``WalCorruptError`` for a bad record comes
        before anything is replayed; the second decodes and returns one record at a time (a
        valid CRC over a frame that does not decode, which only a bug writes, is refused there). Memory stays
        at about one record whatever the log's size. ``last``: this is the newest log, the only
        one a crash can leave with a torn tail (in an older log that is corruption too).
        ``recover``: move a corrupt log aside and keep the records that verify, instead of
        refusing. ``start``: only the records from that byte offset of the file on (those
        before are in the snapshot; the offset is of the file as it was, before a recovery).
        """
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            scan = _scan(fh, path, size)
            bad, tail = sorted(scan.bad), scan.tail
            if tail < size and not last:
                bad.append((tail, size))
            if bad and not recover:
                first = bad[0][0]
                skipped = ", ".join(f"{a}..{b}" for a, b in bad)
                raise WalCorruptError(
                    f"write-ahead log {path} is corrupt at byte offset {first} "
                    f"(bad bytes {skipped} of {size}; {scan.after_first_bad} valid records follow, so "
                    "this is not a torn tail): refusing to start. The file is left as it is; start with "
                    "--wal-recover to move it aside and replay only the records that verify",
                    path,
                    first,
                )
            if bad:
                yield from _recover(fh, path, size, tail, bad, start)
                return
            for pos, end in _spans(fh, tail, []):
                if pos >= start and (record := _decode_at(fh, path, pos, end, recover)) is not None:
                    yield record
        if tail < size:
            log.warning(
                "write-ahead log %s: dropping a torn tail of %d bytes at offset %d", path, size - tail, tail
            )
            with open(path, "r+b") as out:
                out.truncate(tail)
                os.fsync(out.fileno())


def _recover(
    fh: BinaryIO, path: Path, size: int, tail: int, bad: list[tuple[int, int]], start: int
) -> Iterator[dict[str, Any]]:
    """``--wal-recover``: move the log aside, write the records that verify back in order (one at
    a time), log the skipped byte ranges, and return the kept records from ``start`` on."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    os.rename(path, aside)
    kept = 0
    with open(path, "wb") as out:
        for pos, end in _spans(fh, tail, bad):
            fh.seek(pos)
            out.write(fh.read(end - pos))
            kept += 1
        out.flush()
        os.fsync(out.fileno())
    skipped = ", ".join(f"{a}..{b}" for a, b in bad)
    log.warning(
        "write-ahead log %s: --wal-recover skipped bytes %s (%d bytes), kept %d records%s; "
        "the original log is kept as %s",
        path,
        skipped,
        sum(b - a for a, b in bad),
        kept,
        f", dropped a torn tail of {size - tail} bytes at offset {tail}" if tail < size else "",
        aside,
    )
    for pos, end in _spans(fh, tail, bad):
        if pos >= start and (record := _decode_at(fh, path, pos, end, True)) is not None:
            yield record
