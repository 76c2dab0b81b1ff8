"""Tests of the pure protocol package: framing state machine, zero-copy codec, messages, handshake.

Like h11's and nats.py's parser tests, everything is driven by feeding byte strings, often
deliberately split at awkward places; no socket is involved.
"""

from __future__ import annotations

import contextlib
import gc
import struct
import tracemalloc
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from asyncgraph.errors import FrameTooLargeError, ProtocolError
from asyncgraph.protocol import (
    ALIGNMENT,
    ARRAY_EXT_CODE,
    DEFAULT_MAX_FRAME_SIZE,
    LENGTH_PREFIX,
    PROTOCOL_VERSION,
    ClientHello,
    ErrorResponse,
    FrameReader,
    HelloResult,
    Message,
    Request,
    Response,
    ServerHello,
    check_client_hello,
    check_hello_result,
    codec,
    decode_frame,
    decode_handshake,
    decode_message,
    encode_frame,
    encode_frame_bytes,
    encode_handshake,
    encode_message,
    frame_size,
    hello_proof,
    new_nonce,
)
from asyncgraph.protocol.framing import _SMALL_BODY

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- helpers


def framed(body: bytes) -> bytes:
    """Prefix ``body`` with its 4-byte length."""
    return LENGTH_PREFIX.pack(len(body)) + body


def body_of(obj: Any) -> bytes:
    """The encoded body (frame minus length prefix) of ``obj``."""
    return encode_frame_bytes(obj)[LENGTH_PREFIX.size :]


def raw_body(header: bytes, payload: bytes = b"", *, hlen: int | None = None) -> bytes:
    """Hand-build a body: header length, header, zero padding to 64, then ``payload``."""
    head = struct.pack(">I", len(header) if hlen is None else hlen) + header
    if payload:
        head += bytes(-len(head) % ALIGNMENT)
    return head + payload


def array_ref(dtype: Any, shape: Any, offset: Any, nbytes: Any, code: int = 1) -> msgpack.ExtType:
    """A protocol-1 (legacy, ext code 1) array reference: msgpack [dtype, shape, absolute offset, nbytes].

    The encoder no longer writes these, but the decoder must still read them (old write-ahead logs).
    """
    return msgpack.ExtType(code, msgpack.packb([dtype, shape, offset, nbytes]))


def ref2(
    dtype: bytes,
    shape: list[int],
    offset: int,
    nbytes: int,
    *,
    ndim: int | None = None,
    pad: bytes = bytes(3),
    tail: bytes = b"",
    code: int = ARRAY_EXT_CODE,
) -> msgpack.ExtType:
    """A protocol-2 array reference: ``ExtType(2, >4sB3sQQ + ndim x Q)``, offset relative to the data."""
    data = struct.pack(">4sB3sQQ", dtype, len(shape) if ndim is None else ndim, pad, offset, nbytes)
    return msgpack.ExtType(code, data + struct.pack(f">{len(shape)}Q", *shape) + tail)


def assert_same(expected: Any, got: Any) -> None:
    """Deep, bit-exact equality after the codec's normalisations (tuples -> lists, numpy scalars)."""
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == expected.dtype
        assert got.shape == expected.shape
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
    elif isinstance(expected, np.generic):
        assert_same(expected.item(), got)
    elif isinstance(expected, (list, tuple)):
        assert type(got) is list
        assert len(got) == len(expected)
        for e, g in zip(expected, got, strict=True):
            assert_same(e, g)
    elif isinstance(expected, dict):
        assert type(got) is dict
        assert list(got) == list(expected)
        for key in expected:
            assert_same(expected[key], got[key])
    elif isinstance(expected, float):
        assert type(got) is float
        assert struct.pack(">d", expected) == struct.pack(">d", got)
    elif isinstance(expected, (bytearray, memoryview)):
        assert got == bytes(expected)
    else:
        assert type(got) is type(expected)
        assert got == expected


def arrays_in(value: Any) -> list[np.ndarray[Any, Any]]:
    """Every ndarray inside a decoded value."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, list):
        return [a for v in value for a in arrays_in(v)]
    if isinstance(value, dict):
        return [a for v in value.values() for a in arrays_in(v)]
    return []


def feed_in_chunks(reader: FrameReader, data: bytes, sizes: list[int]) -> list[bytes]:
    """Feed ``data`` in chunks of the given sizes (cycled), emulating a BufferedProtocol transport."""
    out: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(data):
        want = max(1, sizes[i % len(sizes)]) if sizes else len(data)
        i += 1
        buf = reader.get_buffer(-1)
        assert len(buf) > 0
        n = min(want, len(buf), len(data) - pos)
        buf[:n] = data[pos : pos + n]
        out.extend(bytes(b) for b in reader.buffer_updated(n))
        pos += n
    return out


# ----------------------------------------------------------------------------- strategies

# little- and big-endian dtypes alike; big-endian ones round-trip as such, never byte-swapped
_LITTLE = ["|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"]
_BIG = [">i2", ">u4", ">i8", ">f4", ">f8"]
DTYPES = [np.dtype(s) for s in (*_LITTLE, *_BIG)]

arrays_st = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
)
# views that are not C-contiguous (strided or transposed) must still round-trip
noncontig_st = arrays_st.filter(lambda a: a.ndim >= 1).map(lambda a: a[::2] if a.ndim == 1 else a.T)

leaves_st = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | arrays_st
    | noncontig_st
)
values_st = st.recursive(
    leaves_st,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
args_st = st.dictionaries(st.text(max_size=10), values_st, max_size=5)
ids_st = st.integers(min_value=0, max_value=2**63 - 1)
messages_st = st.one_of(
    st.builds(Request, ids_st, st.text(max_size=20), args_st),
    st.builds(Response, ids_st, values_st),
    st.builds(ErrorResponse, ids_st, st.text(max_size=20), st.text(max_size=50)),
)

# ----------------------------------------------------------------------------- codec: round trips


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        1.5,
        float("inf"),
        -0.0,
        "",
        "héllo ✓",
        b"",
        b"\x00\xff",
        [],
        {},
        [1, "a", None, [2.5, {"k": b"v"}]],
        {"a": {"b": {"c": [1, 2, 3]}}},
    ],
)
def test_scalar_and_container_round_trip(value: Any) -> None:
    assert_same(value, decode_frame(body_of(value)))


def test_tuples_decode_as_lists_and_numpy_scalars_as_python() -> None:
    got = decode_frame(
        body_of({"t": (1, (2, 3)), "f": np.float32(0.5), "i": np.int64(-3), "b": np.bool_(True)})
    )
    assert got == {"t": [1, [2, 3]], "f": 0.5, "i": -3, "b": True}
    assert type(got["i"]) is int and type(got["b"]) is bool and type(got["f"]) is float


def test_bytearray_and_memoryview_encode_as_bytes() -> None:
    assert decode_frame(body_of([bytearray(b"ab"), memoryview(b"cd")])) == [b"ab", b"cd"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4, 1)])
def test_array_round_trip_all_dtypes_and_shapes(dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    arr = np.asarray(rng.integers(0, 100, size=shape) % (2 if dtype.kind == "b" else 100)).astype(dtype)
    assert arr.shape == shape
    got = decode_frame(body_of(arr))
    assert_same(arr, got)
    assert got.dtype.str == dtype.str  # big-endian dtypes are kept as such, not byte-swapped


def test_non_contiguous_arrays_round_trip() -> None:
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    value = {"strided": base[::2, 1::3], "fortran": np.asfortranarray(base), "transposed": base.T}
    got = decode_frame(body_of(value))
    for key, arr in value.items():
        assert_same(arr, got[key])


def test_nested_dicts_with_arrays_are_views_over_the_body_and_aligned() -> None:
    value = {
        "ids": np.arange(7, dtype=np.int64),
        "nested": {"feat": np.ones((3, 5), dtype=np.float32), "mask": np.array([True, False, True])},
        "list": [np.zeros(0, np.float64), np.array(3, dtype=np.uint8), "x"],
    }
    body = bytearray(body_of(value))
    got = decode_frame(body)
    assert_same(value, got)
    base = np.frombuffer(body, dtype=np.uint8)
    start = base.ctypes.data
    for arr in arrays_in(got):
        assert arr.flags.aligned
        if arr.nbytes:
            assert np.shares_memory(arr, base)
            assert (arr.ctypes.data - start) % ALIGNMENT == 0
    # views, so writing through the body shows in the arrays (and vice versa)
    got["ids"][0] = 99
    assert np.frombuffer(body, np.int64, count=1, offset=got["ids"].ctypes.data - start)[0] == 99


def test_decoded_arrays_writable_iff_body_writable() -> None:
    body = body_of([np.arange(4, dtype=np.int16)])
    assert not decode_frame(bytes(body))[0].flags.writeable
    assert decode_frame(bytearray(body))[0].flags.writeable
    assert not decode_frame(memoryview(body))[0].flags.writeable


def test_layout_header_padding_and_alignment() -> None:
    arr1 = np.arange(3, dtype=np.uint8)  # 3 bytes: the next payload must be re-aligned
    arr2 = np.arange(5, dtype=np.float64)
    frame = encode_frame_bytes({"a": arr1, "b": arr2})
    (length,) = LENGTH_PREFIX.unpack_from(frame, 0)
    assert length == len(frame) - 4
    body = frame[4:]
    (hlen,) = struct.unpack_from(">I", body, 0)
    data_start = -(-(4 + hlen) // ALIGNMENT) * ALIGNMENT
    assert body[4 + hlen : data_start] == bytes(data_start - 4 - hlen)
    header = msgpack.unpackb(body[4 : 4 + hlen], ext_hook=lambda code, data: (code, data))
    (code_a, ref_a), (code_b, ref_b) = header["a"], header["b"]
    assert code_a == code_b == ARRAY_EXT_CODE == 2
    # dtype.str NUL-padded to 4, ndim, 3 zero bytes, offset relative to the data region, nbytes, dims
    assert ref_a == b"|u1\x00" + b"\x01\x00\x00\x00" + struct.pack(">QQQ", 0, 3, 3)
    assert ref_b == b"<f8\x00" + b"\x01\x00\x00\x00" + struct.pack(">QQQ", ALIGNMENT, 40, 5)
    assert body[data_start : data_start + 3] == arr1.tobytes()
    assert body[data_start + ALIGNMENT :] == arr2.tobytes()


@pytest.mark.parametrize(
    "value",
    [
        [np.array(True), np.zeros(0, bool)],
        [np.zeros(0), np.zeros((2, 0))],
        [np.arange(3, dtype=np.uint8), np.zeros(0), np.arange(2.0)],
        [np.zeros(0), np.arange(70, dtype=np.uint8)],
    ],
)
def test_empty_arrays_keep_the_declared_length_exact(value: list[Any]) -> None:
    frame = encode_frame_bytes(value)
    assert LENGTH_PREFIX.unpack_from(frame, 0)[0] == len(frame) - 4
    (body,) = FrameReader().feed(frame + frame[:3])
    assert_same(value, decode_frame(body))


def test_frame_without_arrays_is_one_piece() -> None:
    pieces = encode_frame({"op": "ping"})
    assert len(pieces) == 1
    assert frame_size(pieces) == len(pieces[0])


@given(values_st)
@FAST
def test_any_value_round_trips(value: Any) -> None:
    pieces = encode_frame(value)
    frame = b"".join(pieces)
    assert frame_size(pieces) == len(frame)
    assert LENGTH_PREFIX.unpack_from(frame, 0)[0] == len(frame) - 4
    assert encode_frame_bytes(value) == frame
    body = bytearray(frame[4:])
    got = decode_frame(body)
    assert_same(value, got)
    base = np.frombuffer(body, np.uint8)
    for arr in arrays_in(got):
        if arr.nbytes:
            assert np.shares_memory(arr, base)
            assert (arr.ctypes.data - base.ctypes.data) % ALIGNMENT == 0


# ----------------------------------------------------------------------------- codec: zero copy


def test_contiguous_array_is_passed_by_reference() -> None:
    arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
    pieces = encode_frame({"x": arr})
    views = [p for p in pieces if isinstance(p, memoryview)]
    assert len(views) == 1
    assert views[0].nbytes == arr.nbytes
    assert np.shares_memory(np.frombuffer(views[0], dtype=np.uint8), arr)


def test_non_contiguous_array_is_copied_once() -> None:
    arr = np.arange(100, dtype=np.int64)[::2]
    pieces = encode_frame(arr)
    (view,) = [p for p in pieces if isinstance(p, memoryview)]
    assert not np.shares_memory(np.frombuffer(view, np.uint8), arr)
    assert bytes(view) == np.ascontiguousarray(arr).tobytes()


def test_repeated_array_object_is_sent_once() -> None:
    arr = np.arange(16, dtype=np.int32)
    pieces = encode_frame([arr, {"again": arr}])
    assert sum(isinstance(p, memoryview) for p in pieces) == 1
    first, second = decode_frame(b"".join(pieces)[4:])
    assert_same(arr, first)
    assert_same(arr, second["again"])


def test_64mib_array_is_neither_copied_on_encode_nor_on_decode() -> None:
    arr = np.ones(64 << 20, dtype=np.uint8)
    tracemalloc.start()
    try:
        pieces = encode_frame({"big": arr, "n": 1})
        _, enc_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert enc_peak < 1 << 20
    assert frame_size(pieces) >= arr.nbytes
    assert any(
        isinstance(p, memoryview) and np.shares_memory(np.frombuffer(p, np.uint8), arr) for p in pieces
    )

    body = bytearray(b"".join(pieces)[4:])
    tracemalloc.start()
    try:
        got = decode_frame(body)
        _, dec_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert dec_peak < 1 << 20
    assert np.shares_memory(got["big"], np.frombuffer(body, np.uint8))
    assert got["big"].shape == arr.shape and bool(got["big"][-1] == 1)


# ----------------------------------------------------------------------------- codec: rejected on encode


@pytest.mark.parametrize(
    "value",
    [
        np.array([1, "a"], dtype=object),
        np.array(["ab"]),
        np.array([1 + 2j]),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        np.ma.masked_array([1, 2], mask=[False, True]),
        {1, 2},
        object(),
        np.complex64(1j),
        np.longdouble(1.5),
    ],
    ids=[
        "object",
        "str",
        "complex",
        "datetime",
        "structured",
        "masked",
        "set",
        "object()",
        "complex-scalar",
        "longdouble-scalar",
    ],
)
def test_unsupported_values_raise_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match="cannot encode"):
        encode_frame({"v": value})


def test_object_array_message_names_the_dtype() -> None:
    with pytest.raises(TypeError, match="dtype object"):
        encode_frame(np.array([None], dtype=object))


def test_torch_tensor_rejected_with_hint() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="torch"):
        encode_frame({"t": torch.zeros(3)})


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
def test_int_outside_64_bit_range_overflows(value: int) -> None:
    with pytest.raises(OverflowError, match="64-bit"):
        encode_frame([value])


# ----------------------------------------------------------------------------- codec: malformed bodies


def _ok_payload() -> bytes:
    return np.arange(4, dtype="<f4").tobytes()


def _ext_body(ref: msgpack.ExtType, payload: bytes | None = None) -> bytes:
    return raw_body(msgpack.packb({"a": ref}), _ok_payload() if payload is None else payload)


MALFORMED: dict[str, bytes] = {
    "empty": b"",
    "short": b"\x00\x00\x01",
    "zero header length": raw_body(b"", hlen=0),
    "header length beyond body": raw_body(b"\x90", hlen=2),
    "huge header length": b"\xff\xff\xff\xff\x90",
    "invalid msgpack": raw_body(b"\xc1"),
    "truncated msgpack": raw_body(b"\x92\x01"),
    "trailing garbage in header": raw_body(b"\x01\x02"),
    "invalid utf-8": raw_body(b"\xa2\xff\xfe"),
    "huge declared array": raw_body(b"\xdd\xff\xff\xff\xff"),
    "huge declared map": raw_body(b"\xdf\xff\xff\xff\xff"),
    "huge declared bin": raw_body(b"\xc6\xff\xff\xff\xff"),
    "unhashable map key": raw_body(b"\x81\x90\x01"),
    "deep nesting": raw_body(b"\x91" * 100_000 + b"\xc0"),
    "unknown ext code": _ext_body(array_ref("<f4", [4], 64, 16, code=3)),
    "unknown ext code, v2 layout": _ext_body(ref2(b"<f4\0", [4], 0, 16, code=3)),
    "timestamp ext": raw_body(msgpack.packb([msgpack.Timestamp(1, 0)])),
    "timestamp ext in map": raw_body(msgpack.packb({"t": msgpack.Timestamp(2**40, 5)})),
    "ext data not msgpack": raw_body(msgpack.packb(msgpack.ExtType(1, b"\xc1"))),
    "ext data not a list": raw_body(msgpack.packb(msgpack.ExtType(1, msgpack.packb({"d": 1})))),
    "ext wrong arity": _ext_body(msgpack.ExtType(1, msgpack.packb(["<f4", [4], 64]))),
    "object dtype": _ext_body(array_ref("|O8", [2], 64, 16)),
    "void dtype": _ext_body(array_ref("|V16", [1], 64, 16)),
    "unicode dtype": _ext_body(array_ref("<U4", [1], 64, 16)),
    "datetime dtype": _ext_body(array_ref("<M8", [2], 64, 16)),
    "complex dtype": _ext_body(array_ref("<c8", [2], 64, 16)),
    "structured dtype": _ext_body(array_ref("<f4,<i4", [2], 64, 16)),
    "non-canonical dtype": _ext_body(array_ref("float32", [4], 64, 16)),
    "nonexistent dtype": _ext_body(array_ref("<f3", [4], 64, 12)),
    "dtype not str": _ext_body(array_ref(4, [4], 64, 16)),
    "negative dim": _ext_body(array_ref("<f4", [-4], 64, -16)),
    "bool dim": _ext_body(array_ref("<f4", [True], 64, 4)),
    "float dim": _ext_body(array_ref("<f4", [4.0], 64, 16)),
    "shape not list": _ext_body(array_ref("<f4", 4, 64, 16)),
    "too many dims": _ext_body(array_ref("<f4", [1] * 40, 64, 4)),
    "nbytes mismatch": _ext_body(array_ref("<f4", [4], 64, 12)),
    "nbytes beyond body": _ext_body(array_ref("<f4", [8], 64, 32)),
    "offset misaligned": _ext_body(array_ref("<u1", [4], 65, 4)),
    "offset beyond body": _ext_body(array_ref("<f4", [4], 128, 16)),
    "offset inside header": _ext_body(array_ref("<f4", [4], 0, 16)),
    "negative offset": _ext_body(array_ref("<f4", [4], -64, 16)),
    "offset not int": _ext_body(array_ref("<f4", [4], 64.0, 16)),
    "zero-size but absurd shape": _ext_body(array_ref("<f8", [0, 2**62, 2**62], 64, 0)),
    "non-zero padding": raw_body(msgpack.packb({"a": array_ref("<f4", [4], 64, 16)}), b"")
    + b"\x01"
    + bytes(64),
    # the same kinds of damage to the protocol-2 reference (ExtType 2, fixed struct, relative offset)
    "v2 ref empty": _ext_body(msgpack.ExtType(2, b"")),
    "v2 ref truncated head": _ext_body(msgpack.ExtType(2, ref2(b"<f4\0", [4], 0, 16).data[:23])),
    "v2 ref missing dim": _ext_body(ref2(b"<f4\0", [], 0, 16, ndim=1)),
    "v2 ref extra dim bytes": _ext_body(ref2(b"<f4\0", [4], 0, 16, tail=bytes(8))),
    "v2 ref ragged tail": _ext_body(ref2(b"<f4\0", [4], 0, 16, tail=b"\x00")),
    "v2 ref ndim too small": _ext_body(ref2(b"<f4\0", [4, 1], 0, 16, ndim=1)),
    "v2 ref too many dims": _ext_body(ref2(b"<f4\0", [1] * 33, 0, 4)),
    "v2 ref ndim 255": _ext_body(ref2(b"<f4\0", [1] * 255, 0, 4)),
    "v2 ref non-zero pad": _ext_body(ref2(b"<f4\0", [4], 0, 16, pad=b"\x00\x01\x00")),
    "v2 object dtype": _ext_body(ref2(b"|O8\0", [2], 0, 16)),
    "v2 void dtype": _ext_body(ref2(b"|V16", [1], 0, 16)),
    "v2 unicode dtype": _ext_body(ref2(b"<U4\0", [1], 0, 16)),
    "v2 datetime dtype": _ext_body(ref2(b"<M8\0", [2], 0, 16)),
    "v2 complex dtype": _ext_body(ref2(b"<c8\0", [2], 0, 16)),
    "v2 non-canonical dtype": _ext_body(ref2(b"f4\0\0", [4], 0, 16)),
    "v2 native-order dtype": _ext_body(ref2(b"=f4\0", [4], 0, 16)),
    "v2 nonexistent dtype": _ext_body(ref2(b"<f3\0", [4], 0, 12)),
    "v2 NUL inside dtype": _ext_body(ref2(b"<f\x004", [4], 0, 16)),
    "v2 NUL-led dtype": _ext_body(ref2(b"\0<f4", [4], 0, 16)),
    "v2 non-ascii dtype": _ext_body(ref2(b"<f\xc3\xa4", [4], 0, 16)),
    "v2 empty dtype": _ext_body(ref2(bytes(4), [4], 0, 16)),
    "v2 nbytes mismatch": _ext_body(ref2(b"<f4\0", [4], 0, 12)),
    "v2 nbytes beyond body": _ext_body(ref2(b"<f4\0", [8], 0, 32)),
    "v2 offset misaligned": _ext_body(ref2(b"|u1\0", [4], 1, 4)),
    "v2 offset beyond body": _ext_body(ref2(b"<f4\0", [4], 64, 16)),
    "v2 offset near 2**64": _ext_body(ref2(b"<f4\0", [4], 2**64 - 64, 16)),
    "v2 huge dims, nbytes wraps": _ext_body(ref2(b"|u1\0", [2**32, 2**32], 0, 0)),
    "v2 zero-size but absurd shape": _ext_body(ref2(b"<f8\0", [0, 2**62, 2**62], 0, 0)),
    "v2 zero-size dim beyond intp": _ext_body(ref2(b"<f8\0", [0, 2**64 - 1], 0, 0)),
    "v2 no data region": raw_body(msgpack.packb({"a": ref2(b"<f4\0", [0], 0, 0)})),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_bodies_raise_protocol_error(name: str) -> None:
    body = MALFORMED[name]
    for decode in (decode_frame, decode_message, decode_handshake):
        with pytest.raises(ProtocolError):
            decode(body)


@pytest.mark.parametrize("ref", [array_ref("<f4", [4], 64, 16), ref2(b"<f4\0", [4], 0, 16)], ids=["v1", "v2"])
def test_hand_built_reference_is_accepted(ref: msgpack.ExtType) -> None:
    """The malformed cases above differ from these valid bodies in one field only."""
    got = decode_frame(_ext_body(ref))
    assert_same(np.arange(4, dtype="<f4"), got["a"])


def test_v2_reference_offsets_are_relative_to_the_data_region() -> None:
    header = msgpack.packb({"x": "y" * 70, "a": ref2(b">i2\0", [2, 2], 64, 8)})
    body = raw_body(header, bytes(64) + np.arange(4, dtype=">i2").tobytes())
    got = decode_frame(body)["a"]
    assert_same(np.arange(4, dtype=">i2").reshape(2, 2), got)
    assert got.dtype.str == ">i2"


# A protocol-1 frame, as the previous release's encoder wrote it (e.g. a write-ahead log record):
# {"op": "push", "args": {"name": "node:feat", "ids": int64 [3, 70001], "data": float32 arange(6)
# as (2, 3), "mask": bool (0,)}, "rid": 7, "t": 1.5}, arrays as ExtType 1 with absolute offsets.
V1_FRAME = bytes.fromhex(
    "000001180000009184a26f70a470757368a46172677384a46e616d65a96e6f64653a66656174a3696473c7190194a33c"
    "69389102cf00000000000000c0cf0000000000000010a464617461c71a0194a33c6634920203cf0000000000000100cf"
    "0000000000000018a46d61736bc7190194a37c62319100cf00000000000000c0cf0000000000000000a372696407a174"
    "cb3ff8000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000300000000000000711101000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000803f0000004000004040000080400000a040"
)


def test_protocol_1_frame_still_decodes() -> None:
    """Old write-ahead logs hold ExtType-1 frames; they must still replay (see server/wal.py)."""
    (frame_body,) = FrameReader().feed(V1_FRAME)
    body = bytearray(frame_body)
    got = decode_frame(body)
    expected = {
        "op": "push",
        "args": {
            "name": "node:feat",
            "ids": np.array([3, 70001], dtype=np.int64),
            "data": np.arange(6, dtype="<f4").reshape(2, 3),
            "mask": np.zeros(0, dtype=bool),
        },
        "rid": 7,
        "t": 1.5,
    }
    assert_same(expected, got)
    assert (got["args"]["data"].ctypes.data - np.frombuffer(body, np.uint8).ctypes.data) % ALIGNMENT == 0
    # the encoder now writes the same value as protocol 2 (ExtType 2), which decodes the same
    frame = encode_frame_bytes(expected)
    assert frame != V1_FRAME and b"\xc7\x19\x01" not in frame
    assert_same(expected, decode_frame(frame[4:]))


def test_frames_without_arrays_are_the_same_as_in_protocol_1() -> None:
    """Handshakes carry no arrays: an old peer must still read a refusal of its version."""
    hello = ServerHello(1, "pubmed", 3, b"\x01" * 32, True, "i", 5)
    frame = encode_handshake(hello)
    # protocol 1's fields, framed as protocol 1 framed them; "role" (protocol 3) is a key an old
    # peer ignores
    (hlen,) = struct.unpack_from(">I", frame, 4)
    assert len(frame) == 8 + hlen
    assert msgpack.unpackb(frame[8:]) == {
        "kind": "server_hello", "version": 1, "graph_name": "pubmed", "part_id": 3,
        "nonce": b"\x01" * 32, "auth_required": True, "instance": "i", "epoch": 5, "role": "primary",
    }  # fmt: skip
    refusal = HelloResult(False, "auth", "protocol version 1 != server's 2")
    assert encode_handshake(refusal).hex() == (
        "0000004f0000004b84a46b696e64ac68656c6c6f5f726573756c74a26f6bc2a4636f6465a461757468a76d6573736167"
        "65d92070726f746f636f6c2076657273696f6e203120213d2073657276657227732032"
    )
    for value in ({"a": [1, 2.5, None, "x", b"y"]}, [0, 7, "ping", {}]):
        packed = msgpack.packb(value)
        assert encode_frame_bytes(value) == framed(struct.pack(">I", len(packed)) + packed)


def test_encoder_is_reusable_after_errors_and_keeps_no_arrays() -> None:
    """The per-thread encoder is reset after every frame, failed ones included."""
    arr = np.arange(5, dtype=np.int32)
    ref = weakref.ref(arr)
    with pytest.raises(TypeError):
        encode_frame([arr, object()])
    pieces = encode_frame([np.arange(3, dtype=np.uint8), "ok"])
    assert_same([np.arange(3, dtype=np.uint8), "ok"], decode_frame(b"".join(pieces)[4:]))
    del arr
    gc.collect()
    assert ref() is None
    assert encode_frame_bytes({"n": 1}) == framed(b"\x00\x00\x00\x04" + msgpack.packb({"n": 1}))


def test_a_thread_drops_its_encoder_after_a_header_over_1_mib() -> None:
    """The reused Packer keeps its grown buffer; after a huge header the thread starts afresh."""
    encode_frame({"warm": 1})
    before = codec._local.encoder
    big = {"blob": b"x" * (2 << 20), "a": np.arange(3)}
    assert_same(big, decode_frame(encode_frame_bytes(big)[4:]))
    assert getattr(codec._local, "encoder", None) is not before
    encode_frame({"small": 1})
    assert codec._local.encoder is not before


def test_a_busy_thread_encoder_is_left_alone() -> None:
    """A re-entrant encode (the thread's encoder mid-frame) uses a fresh encoder."""
    encode_frame({"warm": 1})
    enc = codec._local.encoder
    enc.busy = True
    try:
        assert_same([np.arange(4)], decode_frame(encode_frame_bytes([np.arange(4)])[4:]))
        assert enc.pieces == [b""] and not enc.refs and enc.data_end == 0
    finally:
        enc.busy = False
    assert codec._local.encoder is enc


def test_encoding_from_many_threads_at_once() -> None:
    def work(i: int) -> None:
        for j in range(200):
            value = {"i": i, "a": np.full(j % 7 + 1, i, dtype=np.int64), "b": np.ones((j % 3, 2), np.float32)}
            assert_same(value, decode_frame(encode_frame_bytes(value)[4:]))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(8)))


def test_four_character_dtype_fills_the_tag() -> None:
    """``dtype.str`` of up to 4 characters (e.g. "<f16", long double on x86-64) fits the tag."""
    arr = np.arange(3, dtype=np.longdouble)
    got = decode_frame(body_of(arr))
    assert_same(arr, got)
    assert got.dtype.str == arr.dtype.str


def test_array_with_more_than_32_dims_is_refused_on_encode() -> None:
    with pytest.raises(TypeError, match=r"cannot encode.*33 dimensions"):
        encode_frame(np.zeros((1,) * 33))
    assert_same(np.zeros((1,) * 32), decode_frame(body_of(np.zeros((1,) * 32))))


def test_non_byte_memoryview_body_is_cast() -> None:
    value = [1, np.arange(3, dtype=np.int64)]
    body = body_of(value)
    assert len(body) % 8 == 0
    assert_same(value, decode_frame(memoryview(body).cast("q")))
    with pytest.raises(ProtocolError, match="contiguous"):
        decode_frame(memoryview(body)[::2])


@given(st.binary(max_size=300))
@FAST
def test_random_bytes_only_raise_protocol_error(data: bytes) -> None:
    for decode in (decode_frame, decode_message, decode_handshake):
        with contextlib.suppress(ProtocolError):
            decode(data)


@given(st.binary(min_size=1, max_size=200), st.binary(max_size=200))
@FAST
def test_random_headers_only_raise_protocol_error(header: bytes, tail: bytes) -> None:
    body = raw_body(header, tail)
    for decode in (decode_frame, decode_message, decode_handshake):
        with contextlib.suppress(ProtocolError):
            decode(body)


@given(
    messages_st, st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6)
)
@FAST
def test_mutated_messages_only_raise_protocol_error(msg: Message, flips: list[tuple[int, int]]) -> None:
    body = bytearray(b"".join(encode_message(msg))[4:])
    for pos, byte in flips:
        body[pos % len(body)] = byte
    for cut in (len(body), len(body) // 2):
        for decode in (decode_frame, decode_message, decode_handshake):
            with contextlib.suppress(ProtocolError):
                decode(bytes(body[:cut]))


# ----------------------------------------------------------------------------- framing


def test_frame_reader_one_frame() -> None:
    reader = FrameReader()
    assert [bytes(b) for b in reader.feed(framed(b"hello"))] == [b"hello"]
    assert reader.buffered == 0


def _stream(bodies: list[bytes]) -> bytes:
    return b"".join(framed(b) for b in bodies)


SMALL_BODIES = [b"a", b"", b"bc" * 10, bytes(range(256)), b"z" * 3, b""]


def test_every_two_way_split_yields_the_same_frames() -> None:
    data = _stream(SMALL_BODIES)
    for cut in range(len(data) + 1):
        reader = FrameReader()
        got = [bytes(b) for b in reader.feed(data[:cut])]
        got += [bytes(b) for b in reader.feed(data[cut:])]
        assert got == SMALL_BODIES, cut
        assert reader.buffered == 0


def test_one_byte_chunks_including_a_large_frame() -> None:
    big = bytes(range(256)) * ((_SMALL_BODY + 5000) // 256)
    bodies = [b"x", big, b"", b"tail"]
    data = _stream(bodies)
    reader = FrameReader()
    got: list[bytes] = []
    for i in range(len(data)):
        got.extend(bytes(b) for b in reader.feed(data[i : i + 1]))
        assert reader.buffered == (i + 1) - sum(4 + len(b) for b in got)
    assert got == bodies


def test_truncated_frame_yields_nothing_until_complete() -> None:
    data = framed(b"0123456789")
    reader = FrameReader()
    assert reader.feed(data[:-1]) == []
    assert reader.buffered == len(data) - 1
    assert [bytes(b) for b in reader.feed(data[-1:])] == [b"0123456789"]
    big = framed(bytes(200_000))
    assert reader.feed(big[:3]) == []
    assert reader.feed(big[3:100_000]) == []
    assert reader.buffered == 100_000
    (body,) = reader.feed(big[100_000:])
    assert len(body) == 200_000


@st.composite
def bodies_and_chunks(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    sizes = draw(
        st.lists(
            st.one_of(
                st.integers(0, 300), st.integers(_SMALL_BODY - 10, _SMALL_BODY + 10), st.integers(0, 300_000)
            ),
            min_size=1,
            max_size=8,
        )
    )
    bodies = [
        bytes([i % 251]) * n if n < 1000 else (bytes(range(256)) * (n // 256 + 1))[i : i + n]
        for i, n in enumerate(sizes)
    ]
    chunks = draw(st.lists(st.one_of(st.integers(1, 10), st.integers(1, 200_000)), min_size=1, max_size=20))
    return bodies, chunks


@given(bodies_and_chunks())
@FAST
def test_random_chunking_yields_the_same_frames(case: tuple[list[bytes], list[int]]) -> None:
    bodies, chunks = case
    reader = FrameReader()
    got = feed_in_chunks(reader, _stream(bodies), chunks)
    assert got == bodies
    assert reader.buffered == 0


def test_returned_bodies_are_never_overwritten() -> None:
    reader = FrameReader()
    kept: list[memoryview] = []
    expected: list[bytes] = []
    for i in range(2000):  # enough traffic to wrap and compact the scratch buffer many times
        body = bytes([i % 256]) * (i % 300 + (_SMALL_BODY + 1 if i % 500 == 0 else 0))
        expected.append(body)
        data = framed(body)
        kept.extend(reader.feed(data[:7]))
        kept.extend(reader.feed(data[7:]))
    assert [bytes(b) for b in kept] == expected


def test_large_body_is_received_in_place() -> None:
    reader = FrameReader()
    size = _SMALL_BODY * 4
    assert reader.feed(LENGTH_PREFIX.pack(size)) == []
    buf = reader.get_buffer(-1)
    assert len(buf) == size  # exactly the body: the next frame's bytes never land in it
    buf[:] = b"\x07" * size
    (body,) = reader.buffer_updated(size)
    assert np.shares_memory(np.frombuffer(body, np.uint8), np.frombuffer(buf, np.uint8))
    assert not body.readonly
    # a large body already partly in the scratch buffer is moved once, the rest lands in place
    reader.feed(LENGTH_PREFIX.pack(size) + b"\x01" * 100)
    buf = reader.get_buffer(-1)
    assert len(buf) == size - 100
    buf[:] = b"\x02" * (size - 100)
    (body,) = reader.buffer_updated(size - 100)
    assert bytes(body) == b"\x01" * 100 + b"\x02" * (size - 100)


def test_zero_length_frames_are_framed_but_do_not_decode() -> None:
    reader = FrameReader()
    bodies = reader.feed(framed(b"") * 3)
    assert [bytes(b) for b in bodies] == [b"", b"", b""]
    with pytest.raises(ProtocolError, match="empty"):
        decode_frame(bodies[0])
    with pytest.raises(ProtocolError):
        decode_message(bodies[0])


def test_oversize_prefix_raises_before_allocating() -> None:
    reader = FrameReader(max_frame_size=1024)
    assert reader.feed(framed(bytes(1024))) != []  # exactly at the limit is fine
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLargeError) as info:
            reader.feed(LENGTH_PREFIX.pack(1 << 30) + b"more")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert "1073741824" in str(info.value) and "1024" in str(info.value)
    with pytest.raises(ProtocolError, match="unusable"):
        reader.feed(b"\x00")
    with pytest.raises(ProtocolError):
        reader.get_buffer(-1)
    with pytest.raises(ProtocolError):
        reader.buffer_updated(0)


def test_oversize_prefix_split_across_chunks() -> None:
    reader = FrameReader(max_frame_size=10)
    assert reader.feed(b"\x00\x00") == []
    with pytest.raises(FrameTooLargeError):
        reader.feed(b"\x00\x0b")


@given(st.binary(max_size=200), st.integers(0, 64), st.lists(st.integers(1, 64), min_size=1, max_size=5))
@FAST
def test_random_stream_only_yields_frames_or_frame_too_large(
    data: bytes, limit: int, chunks: list[int]
) -> None:
    reader = FrameReader(max_frame_size=limit)
    try:
        bodies = feed_in_chunks(reader, data, chunks)
    except FrameTooLargeError:
        return
    assert all(len(b) <= limit for b in bodies)
    assert sum(4 + len(b) for b in bodies) + reader.buffered == len(data)


def test_default_limit_and_bad_usage() -> None:
    assert FrameReader().max_frame_size == DEFAULT_MAX_FRAME_SIZE == 1 << 30
    with pytest.raises(ValueError):
        FrameReader(-1)
    reader = FrameReader()
    buf = reader.get_buffer(16)
    with pytest.raises(ValueError):
        reader.buffer_updated(len(buf) + 1)


def test_feed_accepts_bytearray_and_memoryview() -> None:
    data = _stream([b"ab", b"cde"])
    assert [bytes(b) for b in FrameReader().feed(bytearray(data))] == [b"ab", b"cde"]
    assert [bytes(b) for b in FrameReader().feed(memoryview(data))] == [b"ab", b"cde"]


# ----------------------------------------------------------------------------- messages


@given(messages_st, st.lists(st.integers(1, 50), min_size=1, max_size=5))
@FAST
def test_any_message_round_trips_through_the_reader(msg: Message, chunks: list[int]) -> None:
    frame = b"".join(encode_message(msg))
    reader = FrameReader()
    (body,) = feed_in_chunks(reader, frame * 2, chunks)[:1]
    got = decode_message(bytearray(body))
    assert type(got) is type(msg)
    assert got.id == msg.id
    if isinstance(msg, Request):
        assert isinstance(got, Request)
        assert got.op == msg.op
        assert_same(msg.args, got.args)
    elif isinstance(msg, Response):
        assert isinstance(got, Response)
        assert_same(msg.result, got.result)
    else:
        assert got == msg


def test_request_with_arrays_round_trips() -> None:
    ids = np.array([3, 1, 2], dtype=np.int64)
    msg = Request(7, "pull", {"name": "node:feat", "ids": ids})
    got = decode_message(bytearray(b"".join(encode_message(msg))[4:]))
    assert isinstance(got, Request) and got.id == 7 and got.op == "pull"
    assert_same(ids, got.args["ids"])


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": 0},
        [],
        ["0", 1, "op", {}],
        [9, 1, "x"],
        [0, 1, "op"],
        [0, True, "op", {}],
        [0, "1", "op", {}],
        [0, 1, 2, {}],
        [0, 1, "op", []],
        [0, 1, "op", {1: 2}],
        [1, 1],
        [1, 1.0, None],
        [2, 1, "code"],
        [2, 1, 5, "msg"],
        [2, 1, "code", None],
        42,
    ],
)
def test_malformed_messages_raise_protocol_error(obj: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_message(body_of(obj))


def test_encode_message_type_checks() -> None:
    with pytest.raises(TypeError):
        encode_message(Request("1", "op", {}))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_message(ErrorResponse(1, 2, "m"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_message(ServerHello(1, "g", 0, b"", False))  # type: ignore[arg-type]


def test_handshake_frames_are_not_messages_and_vice_versa() -> None:
    hello = encode_handshake(ClientHello(PROTOCOL_VERSION, "g", None))
    with pytest.raises(ProtocolError):
        decode_message(hello[4:])
    with pytest.raises(ProtocolError):
        decode_handshake(b"".join(encode_message(Response(1, None)))[4:])


# ----------------------------------------------------------------------------- handshake


@pytest.mark.parametrize(
    "msg",
    [
        ServerHello(PROTOCOL_VERSION, "pubmed", 3, b"\x01" * 32, True),
        ServerHello(PROTOCOL_VERSION, "g", 0, b"", False),
        ClientHello(PROTOCOL_VERSION, "pubmed", b"\x02" * 32),
        ClientHello(PROTOCOL_VERSION, "pubmed", None),
        ClientHello(PROTOCOL_VERSION, "pubmed", None, "trainer-7"),
        HelloResult(True, "", ""),
        HelloResult(False, "auth", "authentication failed: wrong secret"),
    ],
)
def test_handshake_round_trip(msg: Any) -> None:
    frame = encode_handshake(msg)
    assert isinstance(frame, bytes)
    assert LENGTH_PREFIX.unpack_from(frame, 0)[0] == len(frame) - 4
    (body,) = FrameReader().feed(frame)
    assert decode_handshake(body) == msg


@pytest.mark.parametrize(
    "obj",
    [
        [1, 2],
        {"kind": "nope"},
        {"kind": 1},
        {"version": 1},
        {"kind": "client_hello", "version": 1, "graph_name": "g"},
        {"kind": "client_hello", "version": "1", "graph_name": "g", "mac": None},
        {"kind": "client_hello", "version": 1, "graph_name": "g", "mac": "str-mac"},
        {"kind": "client_hello", "version": 1, "graph_name": "g", "mac": None, "holder": 7},
        {
            "kind": "server_hello",
            "version": 1,
            "graph_name": "g",
            "part_id": 0,
            "nonce": b"",
            "auth_required": 1,
        },
        {"kind": "hello_result", "ok": True, "code": None, "message": ""},
    ],
)
def test_malformed_handshake_raises_protocol_error(obj: Any) -> None:
    with pytest.raises(ProtocolError):
        decode_handshake(body_of(obj))


def test_encode_handshake_type_checks() -> None:
    with pytest.raises(TypeError):
        encode_handshake(ClientHello(1, "g", "mac"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_handshake(Request(1, "op", {}))  # type: ignore[arg-type]


def test_client_hello_holder_is_optional() -> None:
    """Issue 22: a hello without ``holder`` (an older client) decodes as anonymous (None)."""
    old = {"kind": "client_hello", "version": PROTOCOL_VERSION, "graph_name": "g", "mac": None}
    assert decode_handshake(body_of(old)) == ClientHello(PROTOCOL_VERSION, "g", None, None)


def _client_hello_via_wire(hello: ClientHello) -> ClientHello:
    decoded = decode_handshake(encode_handshake(hello)[4:])
    assert isinstance(decoded, ClientHello)
    return decoded


def _server(secret: bool = True, **fields: Any) -> ServerHello:
    values: dict[str, Any] = {"instance": "inst-1", "epoch": 4, "role": "primary", **fields}
    return ServerHello(PROTOCOL_VERSION, "pubmed", 1, new_nonce(), secret, **values)


def _answer(secret: bytes, server: ServerHello, holder: str | None = "t0") -> ClientHello:
    nonce = new_nonce()
    mac = hello_proof(secret, "client", server, nonce, holder)
    return ClientHello(PROTOCOL_VERSION, server.graph_name, mac, holder, nonce)


def test_handshake_happy_path_with_secret_proves_both_sides() -> None:
    secret = b"s3cret"
    server = _server()
    seen = decode_handshake(encode_handshake(server)[4:])
    assert seen == server and isinstance(seen, ServerHello) and seen.auth_required
    sent = _answer(secret, seen)
    assert secret not in encode_handshake(sent)
    hello = _client_hello_via_wire(sent)
    result = check_client_hello(hello, server=server, secret=secret)
    assert result.ok and result.mac == hello_proof(secret, "server", server, hello.nonce, "t0")
    assert result.mac != hello.mac  # the roles differ: one side's answer is never the other's
    assert decode_handshake(encode_handshake(result)[4:]) == result
    assert check_hello_result(result, server=seen, client=sent, secret=secret) is None


def test_client_refuses_a_server_that_does_not_prove_the_secret() -> None:
    server = _server()
    client = _answer(b"k", server)
    for result in (HelloResult(True, "", ""), HelloResult(True, "", "", b"\x00" * 32)):
        why = check_hello_result(result, server=server, client=client, secret=b"k")
        assert why is not None and "not a server of this job" in why
    proof = check_client_hello(client, server=server, secret=b"other")
    assert not proof.ok  # a server with another secret refuses; it could not prove ours either
    assert check_hello_result(HelloResult(True, "", ""), server=server, client=client, secret=None) is None


@pytest.mark.parametrize(
    "change",
    [
        {"part_id": 0},
        {"instance": "inst-2"},
        {"epoch": 5},
        {"role": "replica"},
        {"nonce": b"\x07" * 32},
        {"graph_name": "other"},
    ],
)
def test_client_mac_is_bound_to_every_field_of_the_session(change: dict[str, Any]) -> None:
    """A relay that passes on (or rewrites) another server's hello gets a MAC the real server
    refuses: the client's answer covers the nonces, graph, partition, role, instance, epoch."""
    import dataclasses

    real = _server()
    seen = dataclasses.replace(real, **change)  # what a relay showed the client
    hello = _answer(b"k", seen)
    if "graph_name" in change:
        hello = dataclasses.replace(hello, graph_name=real.graph_name)
    result = check_client_hello(hello, server=real, secret=b"k")
    assert not result.ok and result.code == "auth" and result.mac is None


def test_client_mac_is_bound_to_its_nonce_and_holder() -> None:
    import dataclasses

    server = _server()
    hello = _answer(b"k", server, holder="a")
    assert check_client_hello(hello, server=server, secret=b"k").ok
    for forged in (
        dataclasses.replace(hello, holder="b"),
        dataclasses.replace(hello, holder=None),
        dataclasses.replace(hello, nonce=new_nonce()),
        dataclasses.replace(hello, nonce=b""),
    ):
        assert not check_client_hello(forged, server=server, secret=b"k").ok


def test_handshake_without_secret() -> None:
    server = _server(secret=False)
    hello = _client_hello_via_wire(ClientHello(PROTOCOL_VERSION, "pubmed", None))
    result = check_client_hello(hello, server=server, secret=None)
    assert result.ok and result.mac is None
    # a server without a secret accepts a MAC (nothing to check); the client then refuses it
    assert check_client_hello(_answer(b"k", server), server=server, secret=None).ok


def test_handshake_wrong_secret() -> None:
    server = _server()
    result = check_client_hello(_answer(b"wrong", server), server=server, secret=b"right")
    assert not result.ok and result.code == "auth" and "wrong secret" in result.message


def test_handshake_mac_bound_to_nonce() -> None:
    hello = _answer(b"k", _server())
    result = check_client_hello(hello, server=_server(), secret=b"k")
    assert not result.ok and result.code == "auth"


def test_handshake_missing_mac() -> None:
    hello = ClientHello(PROTOCOL_VERSION, "pubmed", None)
    result = check_client_hello(hello, server=_server(), secret=b"k")
    assert not result.ok and result.code == "auth"
    assert "authentication failed" in result.message and "secret" in result.message


def test_handshake_version_mismatch_from_a_newer_client() -> None:
    # a future client may send extra fields; the server must still read its version
    newer = PROTOCOL_VERSION + 1
    body = body_of(
        {"kind": "client_hello", "version": newer, "graph_name": "pubmed", "mac": None, "new": [1]}
    )
    hello = decode_handshake(body)
    assert isinstance(hello, ClientHello)
    result = check_client_hello(hello, server=_server(False), secret=None)
    assert result == HelloResult(False, "auth", f"protocol version {newer} != server's {PROTOCOL_VERSION}")


def test_handshake_version_mismatch_from_an_older_client() -> None:
    # the client hello of the previous release (protocol 1), byte for byte as it wrote it
    v1_hello = bytes.fromhex(
        "000000370000003384a46b696e64ac636c69656e745f68656c6c6fa776657273696f6e01aa67726170685f6e616d65"
        "a67075626d6564a36d6163c0"
    )
    hello = decode_handshake(v1_hello[4:])
    assert hello == ClientHello(1, "pubmed", None)
    result = check_client_hello(hello, server=_server(False), secret=None)
    assert result == HelloResult(False, "auth", f"protocol version 1 != server's {PROTOCOL_VERSION}")
    # the refusal is a plain msgpack map, framed as protocol 1 framed it: the old peer can read it
    frame = encode_handshake(result)
    (hlen,) = struct.unpack_from(">I", frame, 4)
    assert len(frame) == 8 + hlen
    assert msgpack.unpackb(frame[8:]) == {
        "kind": "hello_result",
        "ok": False,
        "code": "auth",
        "message": result.message,
    }


def test_handshake_graph_mismatch() -> None:
    hello = ClientHello(PROTOCOL_VERSION, "x", None)
    result = check_client_hello(hello, server=_server(False), secret=None)
    assert result == HelloResult(False, "auth", "graph 'x' != served graph 'pubmed'")


def test_mac_and_nonce_properties() -> None:
    nonce = new_nonce()
    assert len(nonce) == 32 and nonce != new_nonce()
    server = _server()
    mac = hello_proof(b"k", "client", server, nonce, None)
    assert len(mac) == 32
    assert mac == hello_proof(b"k", "client", server, nonce, None)
    assert mac != hello_proof(b"k2", "client", server, nonce, None)
    assert mac != hello_proof(b"k", "server", server, nonce, None)
    assert mac != hello_proof(b"k", "client", server, nonce, "")  # no holder != an empty one
    with pytest.raises(ValueError):
        hello_proof(b"k", "relay", server, nonce, None)


def test_server_info_round_trips_and_names_a_bad_field() -> None:
    from asyncgraph.protocol import ServerInfo, SharedMemoryInfo

    info = ServerInfo(
        "g", 1, 2, 10, 20, {"bounds": [0, 5, 10]}, [], 4, 123, "boot",
        shm=SharedMemoryInfo("@x", b"t"), instance="i", epoch=3, replicas=[7001],
    )  # fmt: skip
    wire = info.to_wire()
    assert wire["shm"] == {"address": "@x", "token": b"t", "writes_via_server": False}
    assert ServerInfo.from_wire(codec_round_trip(wire)) == info
    with pytest.raises(ProtocolError, match="'part_id'"):
        ServerInfo.from_wire({**wire, "part_id": "1"})
    with pytest.raises(ProtocolError, match="lacks 'boot_id'"):
        ServerInfo.from_wire({k: v for k, v in wire.items() if k != "boot_id"})
    assert ServerInfo.from_wire({**wire, "shm": None}).shm is None


def codec_round_trip(value: Any) -> Any:
    """``value`` encoded as a response frame and decoded again, as a client receives it."""
    from asyncgraph.protocol import Response, decode_message, encode_message

    body = b"".join(bytes(p) for p in encode_message(Response(1, value)))[4:]
    msg = decode_message(body)
    assert isinstance(msg, Response)
    return msg.result
