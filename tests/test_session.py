"""The protocol sessions driven in memory, as a client/server pair: no sockets, no event loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest

from asyncgraph.errors import AuthenticationError, FrameTooLargeError, OutOfRangeError, ProtocolError
from asyncgraph.protocol import (
    CONNECTION_ERROR_ID,
    PROTOCOL_VERSION,
    ClientHello,
    ClientSession,
    ConnectionFailed,
    ErrorResponse,
    HandshakeComplete,
    Request,
    Response,
    ServerSession,
    SessionState,
    decode_handshake,
    decode_message,
    encode_handshake,
    encode_message,
)
from asyncgraph.protocol.framing import LENGTH_PREFIX
from asyncgraph.protocol.session import HANDSHAKE_MAX_FRAME_SIZE

SECRET = b"pair-secret"


def join(pieces: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def chunkings(data: bytes) -> Iterator[list[bytes]]:
    """``data`` whole, one byte at a time, and in uneven pieces (h11's ``tr()`` idea)."""
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    yield [data[i : i + 7] for i in range(0, len(data), 7)]


def feed(session: ClientSession | ServerSession, data: bytes, chunks: list[bytes] | None = None) -> list[Any]:
    events: list[Any] = []
    for chunk in chunks if chunks is not None else [data]:
        events.extend(session.receive_data(chunk))
    return events


def bodies(data: bytes) -> list[bytes]:
    """Split bytes a session wrote into frame bodies."""
    out = []
    pos = 0
    while pos < len(data):
        (n,) = LENGTH_PREFIX.unpack_from(data, pos)
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


class SessionPair:
    """A client and a server session wired together in memory."""

    def __init__(
        self, *, client_secret: bytes | None = SECRET, server_secret: bytes | None = SECRET, graph: str = "g"
    ) -> None:
        self.server = ServerSession(graph_name="g", part_id=3, secret=server_secret, max_frame_size=1 << 16)
        self.client = ClientSession(
            graph_name=graph, secret=client_secret, name="srv", max_frame_size=1 << 16
        )

    def to_client(self, data: bytes | None = None) -> list[Any]:
        return feed(self.client, join(self.server.data_to_send()) if data is None else data)

    def to_server(self, data: bytes | None = None) -> list[Any]:
        return feed(self.server, join(self.client.data_to_send()) if data is None else data)

    def handshake(self) -> tuple[list[Any], list[Any]]:
        """Server hello -> client hello -> hello result; returns (server events, client events)."""
        assert self.to_client() == []
        server_events = self.to_server()
        return server_events, self.to_client()


def test_full_handshake_then_requests_and_responses() -> None:
    pair = SessionPair()
    assert pair.server.state is SessionState.AWAIT_CLIENT_HELLO
    assert pair.client.state is SessionState.AWAIT_SERVER_HELLO
    server_events, client_events = pair.handshake()
    assert server_events == [HandshakeComplete(pair.server.client_hello)]  # type: ignore[arg-type]
    assert client_events == [HandshakeComplete(pair.client.server_hello)]  # type: ignore[arg-type]
    assert pair.client.server_hello is not None and pair.client.server_hello.part_id == 3
    assert pair.server.state is pair.client.state is SessionState.READY
    ids = np.arange(5, dtype=np.int64)
    rid1, pieces1 = pair.client.send_request("pull", {"name": "x", "ids": ids})
    rid2, pieces2 = pair.client.send_request("ping", {})
    assert (rid1, rid2) == (1, 2)
    requests = pair.to_server(join(pieces1) + join(pieces2))
    assert [type(r) for r in requests] == [Request, Request]
    np.testing.assert_array_equal(requests[0].args["ids"], ids)
    out = join(pair.server.send_error(rid2, OutOfRangeError("id 9 out of range")))
    out += join(pair.server.send_response(rid1, ids * 2))
    replies = pair.to_client(out)
    assert replies[0] == ErrorResponse(2, "out_of_range", "id 9 out of range")
    assert isinstance(replies[1], Response) and replies[1].id == 1
    np.testing.assert_array_equal(replies[1].result, ids * 2)
    assert pair.server.data_to_send() == [] and pair.client.data_to_send() == []


@pytest.mark.parametrize("way", range(3))
def test_split_and_byte_at_a_time_feeding(way: int) -> None:
    pair = SessionPair()
    hello = join(pair.server.data_to_send())
    assert feed(pair.client, hello, list(chunkings(hello))[way]) == []
    client_hello = join(pair.client.data_to_send())
    with pytest.raises(ProtocolError, match="await_hello_result"):
        pair.client.send_request("ping", {})
    server_events = feed(pair.server, client_hello, list(chunkings(client_hello))[way])
    assert [type(e) for e in server_events] == [HandshakeComplete]
    result = join(pair.server.data_to_send())
    assert [type(e) for e in feed(pair.client, result, list(chunkings(result))[way])] == [HandshakeComplete]
    stream = b"".join(join(pair.client.send_request("ping", {"i": i})[1]) for i in range(3))
    got = feed(pair.server, stream, list(chunkings(stream))[way])
    assert [r.args["i"] for r in got] == [0, 1, 2]


def test_wrong_secret_is_refused_on_both_sides() -> None:
    pair = SessionPair(client_secret=b"wrong")
    server_events, client_events = pair.handshake()
    assert len(server_events) == 1 and isinstance(server_events[0], ConnectionFailed)
    assert isinstance(server_events[0].error, AuthenticationError)
    assert pair.server.closed
    [failed] = client_events
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, AuthenticationError)
    assert "srv refused the connection" in str(failed.error) and "wrong secret" in str(failed.error)
    assert pair.client.closed


def test_missing_secret_fails_on_the_client_without_sending() -> None:
    pair = SessionPair(client_secret=None)
    [failed] = pair.to_client()
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, AuthenticationError)
    assert pair.client.data_to_send() == []


def test_wrong_graph_is_refused() -> None:
    pair = SessionPair(graph="other")
    _, client_events = pair.handshake()
    assert isinstance(client_events[0], ConnectionFailed) and "graph" in str(client_events[0].error)


def test_protocol_1_client_is_refused_with_a_reply_it_can_read() -> None:
    """A client of the previous release (protocol 1) gets a refusal naming both versions."""
    server = ServerSession(graph_name="pubmed", part_id=0, secret=None)
    server.data_to_send()  # the server hello
    v1_hello = bytes.fromhex(  # ClientHello(1, "pubmed", None) as the protocol-1 encoder wrote it
        "000000370000003384a46b696e64ac636c69656e745f68656c6c6fa776657273696f6e01aa67726170685f6e616d65"
        "a67075626d6564a36d6163c0"
    )
    [failed] = feed(server, v1_hello)
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, AuthenticationError)
    assert server.closed
    [reply] = bodies(join(server.data_to_send()))
    # what a protocol-1 decoder does with a body free of arrays: header length, then plain msgpack
    hlen = int.from_bytes(reply[:4], "big")
    assert len(reply) == 4 + hlen
    assert msgpack.unpackb(reply[4:]) == {
        "kind": "hello_result",
        "ok": False,
        "code": "auth",
        "message": f"protocol version 1 != server's {PROTOCOL_VERSION}",
    }


def test_request_before_hello_is_refused_with_a_hello_result() -> None:
    pair = SessionPair()
    pair.server.data_to_send()
    [failed] = pair.to_server(join(encode_message(Request(1, "ping", {}))))
    assert isinstance(failed, ConnectionFailed) and "request before hello" in str(failed.error).lower()
    [reply] = bodies(join(pair.server.data_to_send()))
    result = decode_handshake(reply)
    assert not result.ok and result.code == "protocol"  # type: ignore[union-attr]
    assert pair.server.receive_data(b"more bytes") == []  # nothing after the failure


def test_duplicate_hello_is_a_connection_error() -> None:
    pair = SessionPair()
    pair.handshake()
    again = encode_handshake(ClientHello(1, "g", None))
    [failed] = pair.to_server(again)
    assert isinstance(failed, ConnectionFailed) and "duplicate hello" in str(failed.error)
    [reply] = bodies(join(pair.server.data_to_send()))
    msg = decode_message(reply)
    assert isinstance(msg, ErrorResponse) and msg.id == CONNECTION_ERROR_ID and "duplicate" in msg.message
    [failed] = pair.to_client(join(encode_message(msg)))
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, ProtocolError)
    assert "srv closed the connection: duplicate hello" in str(failed.error)


def test_connection_error_is_typed_and_ends_the_client() -> None:
    pair = SessionPair()
    pair.handshake()
    pair.client.send_request("ping", {})
    data = join(encode_message(ErrorResponse(0, "frame_too_large", "frame over the limit")))
    data += join(encode_message(Response(1, "late")))
    [failed] = pair.to_client(data)  # nothing after the connection error
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, FrameTooLargeError)
    with pytest.raises(ProtocolError, match="closed"):
        pair.client.send_request("ping", {})


def test_a_server_that_sends_a_request_is_dropped() -> None:
    pair = SessionPair()
    pair.handshake()
    [failed] = pair.to_client(join(encode_message(Request(7, "ping", {}))))
    assert isinstance(failed, ConnectionFailed) and "srv sent a request" in str(failed.error)


def test_a_client_that_sends_a_response_is_dropped() -> None:
    pair = SessionPair()
    pair.handshake()
    [failed] = pair.to_server(join(encode_message(Response(1, None))))
    assert isinstance(failed, ConnectionFailed) and "expected a request, got Response" in str(failed.error)
    [reply] = bodies(join(pair.server.data_to_send()))
    assert decode_message(reply) == ErrorResponse(0, "protocol", str(failed.error))


@pytest.mark.parametrize("ready", [False, True])
def test_oversized_frame_is_refused_from_its_prefix(ready: bool) -> None:
    pair = SessionPair()
    if ready:
        pair.handshake()
    else:
        pair.server.data_to_send()
    [failed] = pair.to_server(LENGTH_PREFIX.pack((1 << 16) + 1))  # no body sent at all
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, FrameTooLargeError)
    [reply] = bodies(join(pair.server.data_to_send()))
    decoded = decode_message(reply) if ready else decode_handshake(reply)
    assert getattr(decoded, "code", None) == "frame_too_large"


def test_garbage_frame_and_oversized_request() -> None:
    pair = SessionPair()
    pair.handshake()
    [failed] = pair.to_server(LENGTH_PREFIX.pack(3) + b"abc")
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, ProtocolError)
    pair = SessionPair()
    pair.handshake()
    with pytest.raises(FrameTooLargeError, match="split it into smaller calls"):
        pair.client.send_request("push", {"values": np.zeros(1 << 16, np.uint8)})


def test_server_refuses_to_send_before_the_handshake() -> None:
    server = ServerSession(graph_name="g", part_id=0, secret=None)
    with pytest.raises(ProtocolError, match="await_client_hello"):
        server.send_response(1, None)
    client = ClientSession(graph_name=None, secret=None)
    pair_events = feed(client, join(server.data_to_send()))
    assert pair_events == [] and client.server_hello is not None
    assert [type(e) for e in feed(server, join(client.data_to_send()))] == [HandshakeComplete]


def test_frame_reader_needed_never_reads_past_one_frame() -> None:
    """``needed`` is what lets the fd-passing socket read one reply and not the fd bytes after it."""
    from asyncgraph.protocol import FrameReader, encode_frame_bytes

    frame = encode_frame_bytes({"descriptor": {"x": 1}, "num_fds": 3})
    reader = FrameReader(1 << 16)
    got: list[memoryview] = []
    pos = 0
    reads = 0
    while not got:
        want = reader.needed
        buf = reader.get_buffer(-1)
        n = min(want, 3, len(frame) - pos)  # a stingy socket: at most 3 bytes a read
        buf[:n] = frame[pos : pos + n]
        pos += n
        reads += 1
        got = reader.buffer_updated(n)
    assert pos == len(frame) and reader.needed == 4 and reads > 1
    assert bytes(got[0]) == frame[4:]


def test_preauth_frames_are_small_until_the_hello_succeeds() -> None:
    pair = SessionPair()
    assert pair.server.max_frame_size == HANDSHAKE_MAX_FRAME_SIZE < 1 << 16
    pair.handshake()
    assert pair.server.max_frame_size == 1 << 16
    pair = SessionPair()
    pair.server.data_to_send()
    [failed] = pair.to_server(LENGTH_PREFIX.pack(HANDSHAKE_MAX_FRAME_SIZE + 1))
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, FrameTooLargeError)


def test_oversized_reply_is_an_error_for_that_request_only() -> None:
    pair = SessionPair()
    pair.handshake()
    rid, pieces = pair.client.send_request("pull", {"name": "x"})
    rid2, pieces2 = pair.client.send_request("ping", {})
    pair.to_server(join(pieces) + join(pieces2))
    with pytest.raises(FrameTooLargeError, match=r"reply to request 1 is .* over the maximum frame size"):
        pair.server.send_response(rid, np.zeros(1 << 16, np.uint8))
    assert pair.server.state is SessionState.READY
    out = join(pair.server.send_error(rid, FrameTooLargeError("too big")))
    out += join(pair.server.send_response(rid2, 1.5))
    error, reply = pair.to_client(out)
    assert error == ErrorResponse(1, "frame_too_large", "too big")
    assert isinstance(reply, Response) and reply.result == 1.5
    assert pair.client.state is SessionState.READY


def test_client_with_a_secret_refuses_a_server_without_one_before_answering() -> None:
    """Issue 32: a server that cannot prove the secret gets no answer (no MAC to relay)."""
    pair = SessionPair(server_secret=None)
    [failed] = pair.to_client()
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, AuthenticationError)
    assert "cannot prove" in str(failed.error) and pair.client.data_to_send() == []


def test_client_refuses_another_partition_or_role_before_answering() -> None:
    cases = (({"part_id": 2}, "serves partition 3, expected 2"), ({"role": "replica"}, "expected a"))
    for kwargs, why in cases:
        server = ServerSession(graph_name="g", part_id=3, secret=SECRET)
        client = ClientSession(graph_name="g", secret=SECRET, name="srv", **kwargs)  # type: ignore[arg-type]
        [failed] = feed(client, join(server.data_to_send()))
        assert isinstance(failed, ConnectionFailed) and why in str(failed.error)
        assert client.data_to_send() == []


def test_client_refuses_a_hello_result_without_the_servers_proof() -> None:
    from asyncgraph.protocol import HelloResult

    pair = SessionPair()
    pair.to_client()
    pair.client.data_to_send()  # the client's answer, never delivered: a fake server says "ok"
    [failed] = pair.to_client(encode_handshake(HelloResult(True, "", "")))
    assert isinstance(failed, ConnectionFailed) and isinstance(failed.error, AuthenticationError)
    assert "did not prove" in str(failed.error) and pair.client.closed
