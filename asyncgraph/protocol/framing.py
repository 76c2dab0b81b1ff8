"""Length-prefixed framing as a pure, incremental state machine (no sockets, no asyncio).

A frame is a 4-byte big-endian unsigned body length followed by the body. ``FrameReader`` is
shaped after ``asyncio.BufferedProtocol``: the transport asks ``get_buffer`` for memory, the
kernel writes received bytes straight into it, and ``buffer_updated`` reports how many arrived.

Small frames land in one reusable scratch buffer and are copied out (cheap). Once the length
prefix of a large frame is known, the reader allocates a fresh, uninitialised byte array for
exactly that body (``np.empty``: no zero fill, and numpy asks for transparent huge pages on big
allocations, so the kernel writing the bytes in faults ~1/500th of the pages a ``bytearray``
would) and hands out its still-empty tail, so a big body is received with no extra copy. A body
returned to the caller is never written to again, because decoded arrays are views over it.
"""

from __future__ import annotations

import struct

import numpy as np

from asyncgraph.errors import FrameTooLargeError, ProtocolError

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "LENGTH_PREFIX", "FrameReader"]

LENGTH_PREFIX: struct.Struct = struct.Struct(">I")
"""The 4-byte big-endian unsigned length that precedes every frame body."""

DEFAULT_MAX_FRAME_SIZE: int = 1 << 30
"""Largest body a reader accepts unless told otherwise (1 GiB)."""

_PREFIX = LENGTH_PREFIX.size
# Bodies up to this size go through the scratch buffer; larger ones get their own bytearray.
_SMALL_BODY = 64 * 1024
# The scratch holds several small frames; a pending partial small frame (< _PREFIX +
# _SMALL_BODY bytes) always leaves at least _MIN_FREE bytes free after compaction.
_SCRATCH_SIZE = 4 * _SMALL_BODY
_MIN_FREE = _SMALL_BODY


class FrameReader:
    """Incremental frame parser built for asyncio.BufferedProtocol (kernel writes straight into our buffers).

    Feed it with ``get_buffer``/``buffer_updated`` (or ``feed`` for plain bytes); each call
    returns the frame bodies completed by those bytes, in order, as memoryviews over buffers
    that the reader never touches again. After any error the reader refuses further use.
    """

    __slots__ = (
        "_body",
        "_body_view",
        "_broken",
        "_end",
        "_filled",
        "_offered",
        "_scratch",
        "_scratch_view",
        "_start",
        "max_frame_size",
    )

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        """Create a reader that rejects any frame whose declared body exceeds ``max_frame_size``."""
        if max_frame_size < 0:
            raise ValueError(f"max_frame_size must be >= 0, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        # Fixed-size scratch: never resized, because the transport may still hold the
        # memoryview from get_buffer while buffer_updated runs (resizing would raise BufferError).
        self._scratch = bytearray(_SCRATCH_SIZE)
        self._scratch_view = memoryview(self._scratch)
        self._start = 0  # first unconsumed byte in scratch
        self._end = 0  # one past the last received byte in scratch
        self._body: np.ndarray | None = None  # large body (uint8) being received in place
        self._body_view: memoryview | None = None
        self._filled = 0  # bytes of _body received so far
        self._offered = 0  # size of the last buffer handed out by get_buffer
        self._broken: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a returned frame (length prefixes included)."""
        if self._body is not None:
            return _PREFIX + self._filled
        return self._end - self._start

    @property
    def needed(self) -> int:
        """Bytes still missing from the frame in progress, its length prefix included.

        A reader that must not consume past one frame (the fd-passing socket, where the bytes
        after a reply carry file descriptors) receives at most this many at a time.
        """
        if self._body is not None:
            return len(self._body) - self._filled
        pending = self._end - self._start
        if pending < _PREFIX:
            return _PREFIX - pending
        length: int = LENGTH_PREFIX.unpack_from(self._scratch, self._start)[0]
        return _PREFIX + length - pending

    def get_buffer(self, sizehint: int) -> memoryview:
        """A writable, non-empty region to receive into; ``sizehint`` is advisory and ignored."""
        self._check_usable()
        if self._body_view is not None:
            view = self._body_view[self._filled :]
        else:
            if len(self._scratch) - self._end < _MIN_FREE:
                self._compact()
            view = self._scratch_view[self._end :]
        self._offered = len(view)
        return view

    def buffer_updated(self, nbytes: int) -> list[memoryview]:
        """Account for ``nbytes`` written into the last buffer; return the bodies now complete."""
        self._check_usable()
        if not 0 <= nbytes <= self._offered:
            raise ValueError(
                f"buffer_updated({nbytes}) but the last buffer offered was {self._offered} bytes"
            )
        self._offered = 0
        if self._body is not None:
            self._filled += nbytes
            if self._filled < len(self._body):
                return []
            done = self._body_view
            assert done is not None
            self._body = None
            self._body_view = None
            self._filled = 0
            return [done]
        self._end += nbytes
        return self._parse_scratch()

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        """Copy ``data`` in through get_buffer/buffer_updated; for tests and non-buffered transports."""
        self._check_usable()
        src = memoryview(data)
        if src.ndim != 1 or src.format != "B":
            src = src.cast("B")
        frames: list[memoryview] = []
        pos = 0
        total = len(src)
        while pos < total:
            buf = self.get_buffer(total - pos)
            n = min(len(buf), total - pos)
            buf[:n] = src[pos : pos + n]
            # ``buf`` stays alive across buffer_updated, exactly like in asyncio's transports.
            frames.extend(self.buffer_updated(n))
            pos += n
        return frames

    def _check_usable(self) -> None:
        """Refuse use after an earlier error: the stream position is lost for good."""
        if self._broken is not None:
            raise ProtocolError(f"frame reader is unusable after an earlier error: {self._broken}")

    def _fail(self, exc: ProtocolError) -> ProtocolError:
        """Mark the reader broken and drop its buffers; returns ``exc`` for raising."""
        self._broken = str(exc)
        self._body = None
        self._body_view = None
        self._start = self._end = self._filled = 0
        return exc

    def _compact(self) -> None:
        """Move the pending partial frame to the front of the scratch buffer (same-size copy)."""
        pending = self._end - self._start
        if self._start and pending:
            self._scratch[:pending] = self._scratch[self._start : self._end]
        self._start = 0
        self._end = pending

    def _parse_scratch(self) -> list[memoryview]:
        """Cut complete frames out of the scratch; switch to in-place receive for a large body."""
        frames: list[memoryview] = []
        view = self._scratch_view
        pos = self._start
        end = self._end
        while end - pos >= _PREFIX:
            (length,) = LENGTH_PREFIX.unpack_from(self._scratch, pos)
            if length > self.max_frame_size:
                raise self._fail(
                    FrameTooLargeError(
                        f"frame declares a body of {length} bytes, over the limit of "
                        f"{self.max_frame_size} bytes"
                    )
                )
            have = end - pos - _PREFIX
            if have >= length:
                body_start = pos + _PREFIX
                frames.append(memoryview(bytearray(view[body_start : body_start + length])))
                pos = body_start + length
                continue
            if length > _SMALL_BODY:
                body = np.empty(length, dtype=np.uint8)
                body_view = memoryview(body.data)
                body_view[:have] = view[pos + _PREFIX : end]
                self._body = body
                self._body_view = body_view
                self._filled = have
                pos = end
            break
        if pos == end:
            self._start = self._end = 0
        else:
            self._start = pos
        return frames
