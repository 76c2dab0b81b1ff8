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
from pathlib import Path
from typing import Any, Literal

from asyncgraph.errors import AsyncGraphError
from asyncgraph.protocol.codec import decode_frame, encode_frame
from asyncgraph.protocol.framing import LENGTH_PREFIX

__all__ = ["FsyncPolicy", "WalCorruptError", "WriteAheadLog", "scan_records"]

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


def _record_end(data: bytes, pos: int) -> int | None:
    """The end of a record starting at ``pos`` whose length fits and whose CRC matches, or None."""
    n = len(data)
    if pos + _HEAD > n:
        return None
    (crc,) = _CRC.unpack_from(data, pos)
    (body_len,) = LENGTH_PREFIX.unpack_from(data, pos + _CRC.size)
    end: int = pos + _HEAD + int(body_len)
    if end > n or zlib.crc32(memoryview(data)[pos + _CRC.size : end]) != crc:
        return None
    return end


def _next_record(data: bytes, start: int) -> int | None:
    """The first offset after ``start`` where a whole, CRC-valid record begins, or None.

    Only offsets whose bytes look like a record header (``_RECORD_MARK``) are checked, so a
    torn tail of a large record costs one ``bytes.find`` pass, not a CRC per byte.
    """
    idx = data.find(_RECORD_MARK, start + _MARK_AT)
    while idx >= 0:
        if _record_end(data, idx - _MARK_AT) is not None:
            return idx - _MARK_AT
        idx = data.find(_RECORD_MARK, idx + 1)
    return None


def scan_records(data: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """Split a log's bytes into valid record spans, corrupt spans (each followed by a valid
    record) and the offset where a torn tail starts (``len(data)`` when there is none)."""
    good: list[tuple[int, int]] = []
    bad: list[tuple[int, int]] = []
    pos, n = 0, len(data)
    while pos < n:
        end = _record_end(data, pos)
        if end is not None:
            good.append((pos, end))
            pos = end
            continue
        nxt = _next_record(data, pos)
        if nxt is None:
            return good, bad, pos
        bad.append((pos, nxt))
        pos = nxt
    return good, bad, n


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
        pieces = encode_frame({"op": op, "args": dict(args), "rid": rid, "t": time.time()})
        crc = 0
        for p in pieces:
            crc = zlib.crc32(p, crc)
        self._fh.write(_CRC.pack(crc))
        for p in pieces:
            self._fh.write(p)
        self._fh.flush()  # in the kernel now: survives kill -9
        self.appended += 1
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

    @staticmethod
    def records(path: Path, *, last: bool = True, recover: bool = False) -> Iterator[dict[str, Any]]:
        """The log's records in order (see the module docstring for torn tails and corruption).

        The whole file is checked before the first record is returned, so a ``WalCorruptError``
        comes before anything is replayed. ``last``: this is the newest log, the only one a crash
        can leave with a torn tail (in an older log that is corruption too). ``recover``: move a
        corrupt log aside and keep the records that verify, instead of refusing.
        """
        data = path.read_bytes()
        n = len(data)
        good, bad, tail = scan_records(data)
        decoded = []
        for start, end in good:
            try:
                decoded.append(decode_frame(memoryview(data)[start + _HEAD : end]))
            except AsyncGraphError as exc:  # a valid CRC over an undecodable frame
                bad.append((start, end))
                log.warning("write-ahead log %s: record at offset %d does not decode: %s", path, start, exc)
        bad.sort()
        if tail < n and not last:
            bad.append((tail, n))
        if bad:
            skipped = ", ".join(f"{a}..{b}" for a, b in bad)
            if not recover:
                first = bad[0][0]
                after = sum(1 for s0, _ in good if s0 > first)
                raise WalCorruptError(
                    f"write-ahead log {path} is corrupt at byte offset {first} "
                    f"(bad bytes {skipped} of {n}; {after} valid records follow, so this is not a "
                    "torn tail): refusing to start. The file is left as it is; start with "
                    "--wal-recover to move it aside and replay only the records that verify",
                    path,
                    first,
                )
            kept = [span for span, rec in zip(good, decoded, strict=True) if span not in bad]
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.rename(path, aside)
            with open(path, "wb") as fh:
                for start, end in kept:
                    fh.write(memoryview(data)[start:end])
                fh.flush()
                os.fsync(fh.fileno())
            log.warning(
                "write-ahead log %s: --wal-recover skipped bytes %s (%d bytes), kept %d records%s; "
                "the original log is kept as %s",
                path,
                skipped,
                sum(b - a for a, b in bad),
                len(kept),
                f", dropped a torn tail of {n - tail} bytes at offset {tail}" if tail < n and last else "",
                aside,
            )
            yield from (rec for span, rec in zip(good, decoded, strict=True) if span not in bad)
            return
        yield from decoded
        if tail < n:
            log.warning(
                "write-ahead log %s: dropping a torn tail of %d bytes at offset %d", path, n - tail, tail
            )
            with open(path, "r+b") as fh:
                fh.truncate(tail)
                os.fsync(fh.fileno())
