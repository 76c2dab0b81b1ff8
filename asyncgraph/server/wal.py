"""The write-ahead log of acknowledged writes (one file per snapshot epoch).

A record is ``crc32 (4 bytes, big endian) + one protocol frame`` (``encode_frame``: msgpack
header, arrays as raw bytes, never pickle) holding ``{"op", "args", "rid", "t"}``; records written
by a protocol-1 release (ExtType-1 array references) still decode, so its logs replay. Reading stops
at the first torn or corrupt record (the tail a crash cut short) and truncates the log there.
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

__all__ = ["FsyncPolicy", "WriteAheadLog"]

log = logging.getLogger("asyncgraph.server")

FsyncPolicy = Literal["always", "interval"]
_CRC = struct.Struct(">I")


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
    def records(path: Path) -> Iterator[dict[str, Any]]:
        """The log's intact records in order; truncates a torn or corrupt tail."""
        data = path.read_bytes()
        pos, n = 0, len(data)
        head = _CRC.size + LENGTH_PREFIX.size
        while pos < n:
            if pos + head > n:
                break
            (crc,) = _CRC.unpack_from(data, pos)
            (body_len,) = LENGTH_PREFIX.unpack_from(data, pos + _CRC.size)
            end = pos + head + body_len
            if end > n or zlib.crc32(memoryview(data)[pos + _CRC.size : end]) != crc:
                break
            try:
                record = decode_frame(memoryview(data)[pos + head : end])
            except AsyncGraphError:
                break
            yield record
            pos = end
        if pos < n:
            log.warning(
                "write-ahead log %s: dropping a torn tail of %d bytes at offset %d", path, n - pos, pos
            )
            with open(path, "r+b") as fh:
                fh.truncate(pos)
                os.fsync(fh.fileno())
