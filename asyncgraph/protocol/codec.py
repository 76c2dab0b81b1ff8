"""msgpack values with zero-copy numpy arrays, encoded as one length-prefixed frame.

Body layout (offsets measured from the start of the body, i.e. after the 4-byte frame prefix)::

    [H: 4-byte big-endian header length][msgpack header: H bytes][zero padding to 64]
    [array payload][zero padding to 64][array payload]...

The data region starts at ``align64(4 + H)``. Each numpy array inside the value is written in the
header as ``ExtType(2, ref)``, ``ref`` a fixed big-endian struct::

    [dtype.str: 4 bytes, NUL-padded][ndim: u8][3 zero bytes][offset: u64][nbytes: u64][ndim x u64]

with ``offset`` relative to the data region, so the header is packed once (its length never
feeds back into it). The raw bytes go out as separate pieces, so the encoder never copies a
C-contiguous array and the decoder returns views over the body. Frames of protocol version 1
wrote ``ExtType(1, msgpack([dtype.str, shape, absolute offset, nbytes]))``; those still decode
(write-ahead logs of an older release replay), but are no longer written. Nothing is ever
pickled. Anything malformed on the decode side raises ``ProtocolError`` only.
"""

from __future__ import annotations

import math
import re
import struct
import threading
from typing import Any

import msgpack
import numpy as np

from asyncgraph.arrays import WIRE_DTYPE_KINDS as _ARRAY_KINDS
from asyncgraph.errors import FrameTooLargeError, ProtocolError

__all__ = [
    "ALIGNMENT",
    "ARRAY_EXT_CODE",
    "LEGACY_ARRAY_EXT_CODE",
    "decode_frame",
    "encode_frame",
    "encode_frame_bytes",
    "frame_size",
]

ARRAY_EXT_CODE: int = 2
"""msgpack ExtType code of an out-of-band numpy array (fixed-struct reference, relative offset)."""

LEGACY_ARRAY_EXT_CODE: int = 1
"""ExtType code of protocol version 1's array reference (nested msgpack, absolute offset); decoded only."""

ALIGNMENT: int = 64
"""Every array payload starts at a multiple of this many bytes from the start of the body."""

_HEADER_LEN = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">II")  # length prefix (framing.LENGTH_PREFIX) + header length
_ZEROS = bytes(ALIGNMENT)
_MAX_BODY = (1 << 32) - 1  # what a 4-byte length prefix can declare
_MAX_NDIM = 32
# An array reference: dtype tag, ndim, 3 zero bytes, offset, nbytes (24 bytes), then ndim dims.
_REF_HEAD_SIZE = struct.calcsize(">4sB3sQQ")
_REF_PAD = bytes(3)
_REF_STRUCTS = tuple(struct.Struct(f">4sB3xQQ{n}Q") for n in range(_MAX_NDIM + 1))  # encoder
_REF_DECODE = tuple(struct.Struct(f">4sB3sQQ{n}Q") for n in range(_MAX_NDIM + 1))  # pad checked
# Canonical ``dtype.str`` of bool/int/uint/float dtypes only: no object, void, structured,
# string, datetime or subarray dtypes can even reach np.dtype() on the decode side. At most 4
# characters (e.g. "<f16"), so it fits the reference's 4-byte tag.
_DTYPE_RE = re.compile(r"[<>|][biuf][0-9]{1,2}\Z")
# A msgpack Timestamp (ext type -1) can only appear where one of these byte pairs occurs:
# fixext4/fixext8 with type -1, or an ext8/16/32 of length 12 with type -1.
_TIMESTAMP_RE = re.compile(rb"\xd6\xff|\xd7\xff|\x0c\xff")
# A header this long leaves its thread's reusable Packer with a buffer worth dropping.
_KEEP_PACKER_BELOW = 1 << 20

# Filled only with dtypes that passed the checks, so both stay bounded by the few valid dtypes.
_ENCODE_TAGS: dict[np.dtype[Any], bytes] = {}  # dtype -> its 4-byte wire tag
_DECODE_DTYPES: dict[bytes, np.dtype[Any]] = {}  # 4-byte wire tag -> dtype
_new_ext = tuple.__new__  # ExtType is a namedtuple: skip its Python-level argument checks


def _check_array_dtype(dtype: np.dtype[Any]) -> None:
    """Reject dtypes the wire format cannot carry, with a message naming the dtype."""
    if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or not _DTYPE_RE.match(dtype.str):
        raise TypeError(
            f"cannot encode a numpy array of dtype {dtype} ({dtype.str!r}): only bool, int, uint "
            f"and float arrays are supported"
        )


def _encode_tag(dtype: np.dtype[Any]) -> bytes:
    """The wire tag of a dtype seen for the first time: checked, then cached."""
    _check_array_dtype(dtype)
    tag = dtype.str.encode("ascii").ljust(4, b"\0")
    _ENCODE_TAGS[dtype] = tag
    return tag


def _decode_dtype(tag: bytes) -> np.dtype[Any]:
    """The dtype of a wire tag seen for the first time: validated strictly, then cached."""
    text = tag.rstrip(b"\0")
    try:
        dtype_str = text.decode("ascii")
    except UnicodeDecodeError:
        dtype_str = ""
    dtype = _checked_dtype(dtype_str) if b"\0" not in text and dtype_str else None
    if dtype is None:
        raise ProtocolError(f"unsupported array dtype {tag!r}")
    _DECODE_DTYPES[tag] = dtype
    return dtype


def _checked_dtype(dtype_str: object) -> np.dtype[Any] | None:
    """The dtype of a canonical bool/int/uint/float ``dtype.str``, else None."""
    if type(dtype_str) is not str or not _DTYPE_RE.match(dtype_str):
        return None
    try:
        dtype = np.dtype(dtype_str)
    except Exception:
        return None
    if dtype.kind not in _ARRAY_KINDS or dtype.str != dtype_str:
        return None
    return dtype


def _byte_view(arr: np.ndarray[Any, Any], view: memoryview) -> memoryview:
    """``view`` (a C-contiguous, non-empty array's own buffer) as flat bytes, without a copy."""
    try:
        return view.cast("B")
    except (TypeError, ValueError, NotImplementedError):  # formats memoryview cannot cast
        flat: memoryview = arr.reshape(-1).view(np.uint8).data
        return flat


class _Encoder:
    """Packs a value once, turning each array into a reference relative to the data region.

    The ``default`` hook appends each new payload (and the zero padding before it) to
    ``pieces``, whose first item ``encode_frame`` replaces by the frame head. One encoder (with
    its msgpack Packer) is kept per thread and reused; ``busy`` makes a re-entrant call (e.g.
    from a signal handler) use a fresh one instead.
    """

    __slots__ = ("busy", "data_end", "packer", "pieces", "refs")

    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = [b""]  # frame head placeholder, then payloads
        self.refs: dict[int, msgpack.ExtType] = {}  # id(original array) -> its reference (dedup)
        self.data_end = 0  # end of the last payload, relative to the data region
        self.busy = False
        self.packer = msgpack.Packer(default=self.default, use_bin_type=True, datetime=False)

    def reset(self) -> None:
        """Forget the last value's arrays (so that they are not kept alive by this thread)."""
        self.pieces = [b""]
        self.refs.clear()
        self.data_end = 0

    def default(self, value: Any) -> Any:
        """msgpack ``default`` hook: arrays become ExtType references, numpy scalars Python ones."""
        if isinstance(value, np.ndarray):
            return self.array(value)
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

    def array(self, value: np.ndarray[Any, Any]) -> msgpack.ExtType:
        """Register ``value`` as a payload (once per object) and return its header reference."""
        key = id(value)  # the value is alive inside the packed object: its id is not reused
        ref = self.refs.get(key)
        if ref is not None:
            return ref
        arr = value
        if type(arr) is not np.ndarray:
            if isinstance(arr, np.ma.MaskedArray):
                raise TypeError("cannot encode a numpy masked array")
            arr = np.asarray(arr)
        tag = _ENCODE_TAGS.get(arr.dtype)
        if tag is None:
            tag = _encode_tag(arr.dtype)
        ndim = arr.ndim
        if ndim > _MAX_NDIM:
            raise TypeError(f"cannot encode a numpy array of {ndim} dimensions: at most {_MAX_NDIM}")
        nbytes = arr.nbytes
        if nbytes:
            view = arr.data
            if not view.c_contiguous:
                arr = np.ascontiguousarray(arr)
                view = arr.data
            end = self.data_end
            offset = (end + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
            if offset != end:
                self.pieces.append(_ZEROS[: offset - end])
            self.pieces.append(_byte_view(arr, view))
            self.data_end = offset + nbytes
        else:
            offset = 0  # nothing to read: any aligned in-body offset will do
        ref = _new_ext(
            msgpack.ExtType, (ARRAY_EXT_CODE, _REF_STRUCTS[ndim].pack(tag, ndim, offset, nbytes, *arr.shape))
        )
        self.refs[key] = ref
        return ref


_local = threading.local()


def _thread_encoder() -> _Encoder:
    """This thread's reusable encoder (made on first use), or a fresh one while it is busy.

    Busy means a re-entrant call, e.g. from a signal handler run in the middle of an encode.
    """
    enc: _Encoder | None = getattr(_local, "encoder", None)
    if enc is None:
        enc = _local.encoder = _Encoder()
    elif enc.busy:
        enc = _Encoder()
    return enc


def encode_frame(obj: Any) -> list[bytes | memoryview]:
    """Encode ``obj`` as a whole frame (prefix included), as pieces for ``transport.writelines``.

    C-contiguous arrays are passed as byte memoryviews of their own buffers (no copy); other
    arrays get one ``np.ascontiguousarray``. Raises TypeError for unsupported values and
    OverflowError for ints outside [-2**63, 2**64).
    """
    current: _Encoder | None = getattr(_local, "encoder", None)
    enc = _thread_encoder() if current is None or current.busy else current
    enc.busy = True
    try:
        header: bytes = enc.packer.pack(obj)
        hlen = len(header)
        if hlen >= _KEEP_PACKER_BELOW and getattr(_local, "encoder", None) is enc:
            del _local.encoder  # drop the grown buffer with this encoder
        pieces = enc.pieces
        header_end = 4 + hlen  # after the 4-byte header length
        if len(pieces) == 1:  # no payload
            body_len = header_end
            if enc.refs:  # only empty arrays: the (empty) data region starts after the padding
                body_len = (header_end + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
            if body_len > _MAX_BODY:
                _check_body_len(body_len)
            return [_FRAME_HEAD.pack(body_len, hlen) + header + _ZEROS[: body_len - header_end]]
        data_start = (header_end + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
        body_len = data_start + enc.data_end
        if body_len > _MAX_BODY:
            _check_body_len(body_len)
        pieces[0] = _FRAME_HEAD.pack(body_len, hlen) + header + _ZEROS[: data_start - header_end]
        return pieces
    finally:
        enc.reset()
        enc.busy = False


def _check_body_len(body_len: int) -> None:
    """A body must fit the 4-byte length prefix."""
    if body_len > _MAX_BODY:
        raise FrameTooLargeError(f"encoded body of {body_len} bytes exceeds the wire limit of {_MAX_BODY}")


def frame_size(pieces: list[bytes | memoryview]) -> int:
    """Total bytes of a frame given as pieces (length prefix included)."""
    total = 0
    for p in pieces:
        total += p.nbytes if type(p) is memoryview else len(p)
    return total


def encode_frame_bytes(obj: Any) -> bytes:
    """``encode_frame`` joined into one bytes object; for tests and small messages."""
    return b"".join(encode_frame(obj))


class _ArrayHook:
    """msgpack ``ext_hook`` that turns array references into views over the frame body."""

    __slots__ = ("body", "data_start", "size")

    def __init__(self, body: memoryview, data_start: int, size: int) -> None:
        self.body = body
        self.data_start = data_start
        self.size = size

    def __call__(self, code: int, data: bytes) -> np.ndarray[Any, Any]:
        """Validate one array reference and return the zero-copy view it describes."""
        if code != ARRAY_EXT_CODE:
            if code == LEGACY_ARRAY_EXT_CODE:
                return self.legacy(data)
            raise ProtocolError(f"unknown msgpack ext type code {code}")
        dims_len = len(data) - _REF_HEAD_SIZE
        if dims_len < 0 or dims_len & 7 or dims_len > 8 * _MAX_NDIM:
            raise ProtocolError(
                f"malformed array reference of {len(data)} bytes: needs {_REF_HEAD_SIZE} + 8 * ndim "
                f"bytes, ndim at most {_MAX_NDIM}"
            )
        tag, ndim, pad, offset, nbytes, *shape = _REF_DECODE[dims_len >> 3].unpack(data)
        if ndim != dims_len >> 3 or pad != _REF_PAD:
            raise ProtocolError(
                f"malformed array reference: ndim {ndim} for {dims_len >> 3} dimensions, padding {pad!r}"
            )
        dtype = _DECODE_DTYPES.get(tag)
        if dtype is None:
            dtype = _decode_dtype(tag)
        if math.prod(shape) * dtype.itemsize != nbytes:
            need = math.prod(shape) * dtype.itemsize
            raise ProtocolError(
                f"array of shape {tuple(shape)} and dtype {dtype.str} needs {need} bytes, header: {nbytes}"
            )
        start = self.data_start + offset
        if offset % ALIGNMENT or start + nbytes > self.size:
            raise ProtocolError(
                f"array payload at data offset {offset} (+{nbytes} bytes) is misaligned or outside the "
                f"data region [{self.data_start}, {self.size}) of the body"
            )
        try:
            return np.ndarray(shape, dtype, self.body, start)
        except Exception as exc:
            raise ProtocolError(
                f"cannot view array of shape {tuple(shape)} and dtype {dtype.str}: {exc}"
            ) from exc

    def legacy(self, data: bytes) -> np.ndarray[Any, Any]:
        """Protocol version 1's reference: msgpack ``[dtype.str, shape, absolute offset, nbytes]``."""
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
        dtype = _checked_dtype(dtype_str)
        if dtype is None:
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
        size = self.size
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
    """Decode a frame body; arrays are views over it (writable iff body is).

    Raises ProtocolError, and nothing else, for any malformed body; allocation stays bounded
    by the body size because every msgpack length limit is capped by the header length.
    """
    if type(body) is bytes or type(body) is bytearray:
        view = memoryview(body)  # always flat, contiguous bytes
    else:
        try:
            view = memoryview(body)
            if not view.c_contiguous:
                raise ValueError("not C-contiguous")
            if view.ndim != 1 or view.format != "B":
                view = view.cast("B")
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"frame body is not a contiguous byte buffer: {exc}") from exc
    size = len(view)
    if size < _HEADER_LEN.size:
        if size == 0:
            raise ProtocolError("empty frame body")
        raise ProtocolError(f"frame body of {size} bytes is too short for a header length")
    (hlen,) = _HEADER_LEN.unpack_from(view, 0)
    header_end = _HEADER_LEN.size + hlen
    if hlen == 0 or header_end > size:
        raise ProtocolError(f"header length {hlen} does not fit a body of {size} bytes")
    data_start = (header_end + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
    if size > header_end:
        pad_end = data_start if data_start < size else size
        if view[header_end:pad_end] != _ZEROS[: pad_end - header_end]:
            raise ProtocolError("non-zero bytes in the padding after the header")
    header = view[_HEADER_LEN.size : header_end]
    try:
        obj = msgpack.unpackb(
            header,
            ext_hook=_ArrayHook(view, data_start, size),
            raw=False,  # the default, as are use_list=True and timestamp=0
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
    if _TIMESTAMP_RE.search(header) is not None:
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
