"""msgpack values with zero-copy numpy arrays, encoded as one length-prefixed frame.

Body layout (offsets measured from the start of the body, i.e. after the 4-byte frame prefix)::

    [H: 4-byte big-endian header length][msgpack header: H bytes][zero padding to 64]
    [array payload][zero padding to 64][array payload]...

Each numpy array inside the value is written in the header as ``ExtType(1, msgpack([dtype.str,
shape, offset, nbytes]))`` and its raw bytes go out as a separate piece, so the encoder never
copies a C-contiguous array and the decoder returns ``np.frombuffer`` views over the body.
Nothing is ever pickled. Anything malformed on the decode side raises ``ProtocolError`` only.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import msgpack
import numpy as np

from asyncgraph.arrays import WIRE_DTYPE_KINDS as _ARRAY_KINDS
from asyncgraph.errors import FrameTooLargeError, ProtocolError
from asyncgraph.protocol.framing import LENGTH_PREFIX

__all__ = [
    "ALIGNMENT",
    "ARRAY_EXT_CODE",
    "decode_frame",
    "encode_frame",
    "encode_frame_bytes",
    "frame_size",
]

ARRAY_EXT_CODE: int = 1
"""msgpack ExtType code that marks an out-of-band numpy array."""

ALIGNMENT: int = 64
"""Every array payload starts at a multiple of this many bytes from the start of the body."""

_HEADER_LEN = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_MAX_BODY = (1 << 32) - 1  # what a 4-byte length prefix can declare
_MAX_NDIM = 32
# Canonical ``dtype.str`` of bool/int/uint/float dtypes only: no object, void, structured,
# string, datetime or subarray dtypes can even reach np.dtype() on the decode side.
_DTYPE_RE = re.compile(r"[<>|][biuf][0-9]{1,2}\Z")
# A msgpack Timestamp (ext type -1) can only appear where one of these byte pairs occurs:
# fixext4/fixext8 with type -1, or an ext8/16/32 of length 12 with type -1.
_TIMESTAMP_MARKERS = (b"\xd6\xff", b"\xd7\xff", b"\x0c\xff")


def _align(n: int) -> int:
    """Round ``n`` up to the next multiple of ALIGNMENT."""
    return (n + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def _check_array_dtype(dtype: np.dtype[Any]) -> None:
    """Reject dtypes the wire format cannot carry, with a message naming the dtype."""
    if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or not _DTYPE_RE.match(dtype.str):
        raise TypeError(
            f"cannot encode a numpy array of dtype {dtype} ({dtype.str!r}): only bool, int, uint "
            f"and float arrays are supported"
        )


class _Encoder:
    """Packs a value twice: first to learn the header length, then with final array offsets.

    The second pass meets the same array objects again and finds them in ``index``.

    Array metadata is written with fixed-width (uint64) offset and nbytes, so the header has
    the same length in both passes and the second pass only changes the offset bytes.
    """

    __slots__ = ("arrays", "data_end", "data_start", "index", "meta_prefix", "offsets")

    def __init__(self) -> None:
        self.arrays: list[np.ndarray[Any, Any]] = []  # C-contiguous payloads, in body order
        self.offsets: list[int] = []  # offset of each payload relative to the data region
        self.meta_prefix: list[bytes] = []  # msgpack of the fixarray marker, dtype and shape
        self.index: dict[int, int] = {}  # id(original array) -> payload index (dedups repeats)
        self.data_start = 0
        self.data_end = 0  # end of the last payload, relative to the data region

    def default(self, value: Any) -> Any:
        """msgpack ``default`` hook: arrays become ExtType references, numpy scalars Python ones."""
        if isinstance(value, np.ndarray):
            return self._array(value)
        if isinstance(value, np.generic):
            item = value.item() if value.dtype.kind in _ARRAY_KINDS else value
            if isinstance(item, np.generic):  # no Python equivalent (e.g. longdouble, complex)
                raise TypeError(f"cannot encode numpy scalar of dtype {value.dtype}")
            return item
        if isinstance(value, int):  # msgpack hands over ints it cannot pack
            raise OverflowError(f"integer {value} is outside the 64-bit range the wire format carries")
        module = type(value).__module__
        if module == "torch" or module.startswith("torch."):
            raise TypeError("cannot encode a torch tensor; convert it with .numpy() first")
        raise TypeError(
            f"cannot encode a value of type {type(value).__qualname__}: supported are None, bool, "
            f"int, float, str, bytes, list, tuple, dict with str keys and numeric numpy arrays"
        )

    def _array(self, value: np.ndarray[Any, Any]) -> msgpack.ExtType:
        """Register ``value`` as a payload (once per object) and return its header reference."""
        key = id(value)
        i = self.index.get(key)
        if i is None:
            if isinstance(value, np.ma.MaskedArray):
                raise TypeError("cannot encode a numpy masked array")
            _check_array_dtype(value.dtype)
            arr = np.asarray(value)
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            i = len(self.arrays)
            self.index[key] = i
            self.arrays.append(arr)
            if arr.nbytes:
                offset = _align(self.data_end)
                self.data_end = offset + arr.nbytes
            else:
                offset = 0  # nothing to read: any aligned in-body offset will do
            self.offsets.append(offset)
            self.meta_prefix.append(b"\x94" + msgpack.packb(arr.dtype.str) + msgpack.packb(list(arr.shape)))
        arr = self.arrays[i]
        data = (
            self.meta_prefix[i]
            + b"\xcf"
            + _U64.pack(self.data_start + self.offsets[i])
            + b"\xcf"
            + _U64.pack(arr.nbytes)
        )
        return msgpack.ExtType(ARRAY_EXT_CODE, data)

    def pack(self, obj: Any) -> bytes:
        """msgpack ``obj`` with this encoder's hook."""
        packed: bytes = msgpack.packb(obj, default=self.default, use_bin_type=True, datetime=False)
        return packed


def encode_frame(obj: Any) -> list[bytes | memoryview]:
    """Encode ``obj`` as a whole frame (prefix included), as pieces for ``transport.writelines``.

    C-contiguous arrays are passed as byte memoryviews of their own buffers (no copy); other
    arrays get one ``np.ascontiguousarray``. Raises TypeError for unsupported values and
    OverflowError for ints outside [-2**63, 2**64).
    """
    enc = _Encoder()
    header = enc.pack(obj)
    hlen = len(header)
    if not enc.arrays:
        body_len = _HEADER_LEN.size + hlen
        _check_body_len(body_len)
        return [LENGTH_PREFIX.pack(body_len) + _HEADER_LEN.pack(hlen) + header]
    enc.data_start = _align(_HEADER_LEN.size + hlen)
    reencoded = enc.pack(obj)
    if len(reencoded) != hlen:  # pragma: no cover - fixed-width offsets make this impossible
        raise AssertionError("header length changed between encoder passes")
    header = reencoded
    body_len = enc.data_start + enc.data_end
    _check_body_len(body_len)
    head_pad = enc.data_start - _HEADER_LEN.size - hlen
    pieces: list[bytes | memoryview] = [
        LENGTH_PREFIX.pack(body_len) + _HEADER_LEN.pack(hlen) + header + bytes(head_pad)
    ]
    cursor = 0
    for arr, offset in zip(enc.arrays, enc.offsets, strict=True):
        if arr.nbytes == 0:
            continue
        if offset > cursor:
            pieces.append(bytes(offset - cursor))
        pieces.append(arr.reshape(-1).view(np.uint8).data)
        cursor = offset + arr.nbytes
    return pieces


def _check_body_len(body_len: int) -> None:
    """A body must fit the 4-byte length prefix."""
    if body_len > _MAX_BODY:
        raise FrameTooLargeError(f"encoded body of {body_len} bytes exceeds the wire limit of {_MAX_BODY}")


def frame_size(pieces: list[bytes | memoryview]) -> int:
    """Total bytes of a frame given as pieces (length prefix included)."""
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in pieces)


def encode_frame_bytes(obj: Any) -> bytes:
    """``encode_frame`` joined into one bytes object; for tests and small messages."""
    return b"".join(encode_frame(obj))


class _ArrayHook:
    """msgpack ``ext_hook`` that turns array references into views over the frame body."""

    __slots__ = ("body", "data_start")

    def __init__(self, body: memoryview, data_start: int) -> None:
        self.body = body
        self.data_start = data_start

    def __call__(self, code: int, data: bytes) -> np.ndarray[Any, Any]:
        """Validate one array reference and return the zero-copy view it describes."""
        if code != ARRAY_EXT_CODE:
            raise ProtocolError(f"unknown msgpack ext type code {code}")
        limit = len(data)
        try:
            meta = msgpack.unpackb(
                data,
                raw=False,
                use_list=True,
                max_str_len=limit,
                max_bin_len=limit,
                max_array_len=limit,
                max_map_len=limit,
                max_ext_len=limit,
            )
        except Exception as exc:
            raise ProtocolError(f"invalid array reference: {exc}") from exc
        if type(meta) is not list or len(meta) != 4:
            raise ProtocolError("array reference must be [dtype, shape, offset, nbytes]")
        dtype_str, shape, offset, nbytes = meta
        if type(dtype_str) is not str or not _DTYPE_RE.match(dtype_str):
            raise ProtocolError(f"unsupported array dtype {dtype_str!r}")
        try:
            dtype = np.dtype(dtype_str)
        except Exception as exc:
            raise ProtocolError(f"unsupported array dtype {dtype_str!r}") from exc
        if dtype.kind not in _ARRAY_KINDS or dtype.str != dtype_str:
            raise ProtocolError(f"unsupported array dtype {dtype_str!r}")
        if type(shape) is not list or len(shape) > _MAX_NDIM:
            raise ProtocolError(f"array shape must be a list of at most {_MAX_NDIM} sizes")
        for dim in shape:
            if type(dim) is not int or dim < 0:
                raise ProtocolError(f"invalid array dimension {dim!r}")
        if type(offset) is not int or type(nbytes) is not int:
            raise ProtocolError("array offset and nbytes must be integers")
        count = math.prod(shape)
        if count * dtype.itemsize != nbytes:
            raise ProtocolError(
                f"array of shape {shape} and dtype {dtype_str} needs {count * dtype.itemsize} bytes, "
                f"header says {nbytes}"
            )
        size = len(self.body)
        if offset % ALIGNMENT or offset < self.data_start or offset + nbytes > size:
            raise ProtocolError(
                f"array payload at offset {offset} (+{nbytes} bytes) is misaligned or outside the "
                f"data region [{self.data_start}, {size}) of the body"
            )
        try:
            return np.frombuffer(self.body, dtype=dtype, count=count, offset=offset).reshape(shape)
        except Exception as exc:
            raise ProtocolError(f"cannot view array of shape {shape} and dtype {dtype_str}: {exc}") from exc


def decode_frame(body: bytes | bytearray | memoryview) -> Any:
    """Decode a frame body; arrays are ``np.frombuffer`` views over it (writable iff body is).

    Raises ProtocolError, and nothing else, for any malformed body; allocation stays bounded
    by the body size because every msgpack length limit is capped by the header length.
    """
    try:
        view = memoryview(body)
        if not view.c_contiguous:
            raise ValueError("not C-contiguous")
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"frame body is not a contiguous byte buffer: {exc}") from exc
    size = len(view)
    if size == 0:
        raise ProtocolError("empty frame body")
    if size < _HEADER_LEN.size:
        raise ProtocolError(f"frame body of {size} bytes is too short for a header length")
    (hlen,) = _HEADER_LEN.unpack_from(view, 0)
    header_end = _HEADER_LEN.size + hlen
    if hlen == 0 or header_end > size:
        raise ProtocolError(f"header length {hlen} does not fit a body of {size} bytes")
    data_start = _align(header_end)
    if size > header_end:
        padding = view[header_end : min(data_start, size)]
        if padding.tobytes().count(0) != len(padding):
            raise ProtocolError("non-zero bytes in the padding after the header")
    header = view[_HEADER_LEN.size : header_end].tobytes()
    try:
        obj = msgpack.unpackb(
            header,
            ext_hook=_ArrayHook(view, data_start),
            raw=False,
            use_list=True,
            strict_map_key=False,
            max_str_len=hlen,
            max_bin_len=hlen,
            max_array_len=hlen,
            max_map_len=hlen,
            max_ext_len=hlen,
        )
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"invalid msgpack header: {type(exc).__name__}: {exc}") from exc
    if any(marker in header for marker in _TIMESTAMP_MARKERS):
        _reject_timestamps(obj)
    return obj


def _reject_timestamps(obj: Any) -> None:
    """msgpack decodes ext type -1 itself, bypassing ext_hook; treat it as an unknown ext code."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, msgpack.Timestamp):
            raise ProtocolError("unknown msgpack ext type code -1 (timestamp)")
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
