"""Typed protocol messages and the connection handshake, on top of the frame codec.

On the wire a message is a msgpack list led by a small integer kind, cheap to build and check::

    Request       [0, id, op, args]
    Response      [1, id, result]
    ErrorResponse [2, id, code, message]

The handshake (hello frames, the mutual proof of the secret) lives in ``protocol/handshake.py``
and is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncgraph.errors import ProtocolError
from asyncgraph.protocol.codec import decode_frame, encode_frame
from asyncgraph.protocol.handshake import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    ClientHello,
    Handshake,
    HelloResult,
    ServerHello,
    check_client_hello,
    check_hello_result,
    client_proof_key,
    decode_handshake,
    encode_handshake,
    hello_proof,
    holder_key,
    new_nonce,
)

__all__ = [
    "NONCE_SIZE",
    "PROTOCOL_VERSION",
    "ClientHello",
    "ErrorResponse",
    "Handshake",
    "HelloResult",
    "Message",
    "Request",
    "Response",
    "ServerHello",
    "check_client_hello",
    "check_hello_result",
    "client_proof_key",
    "decode_handshake",
    "decode_message",
    "encode_handshake",
    "encode_message",
    "hello_proof",
    "holder_key",
    "new_nonce",
]

_KIND_REQUEST = 0
_KIND_RESPONSE = 1
_KIND_ERROR = 2


@dataclass(frozen=True, slots=True)
class Request:
    """Ask the server to run ``op`` with keyword ``args``; ``id`` pairs it with its reply."""

    id: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Response:
    """Successful reply to the request with the same ``id``."""

    id: int
    result: Any


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Failed reply: ``code`` is an asyncgraph.errors code, ``message`` names the problem."""

    id: int
    code: str
    message: str


Message = Request | Response | ErrorResponse


def encode_message(msg: Message) -> list[bytes | memoryview]:
    """Encode a message as a full frame (pieces for ``transport.writelines``)."""
    if not isinstance(msg, (Request, Response, ErrorResponse)):
        raise TypeError(f"not a message: {type(msg).__name__}")
    if type(msg.id) is not int:
        raise TypeError(f"message id must be an int, got {type(msg.id).__name__}")
    if isinstance(msg, Request):
        if not isinstance(msg.op, str) or not isinstance(msg.args, dict):
            raise TypeError("Request needs a str op and a dict of args")
        return encode_frame([_KIND_REQUEST, msg.id, msg.op, msg.args])
    if isinstance(msg, Response):
        return encode_frame([_KIND_RESPONSE, msg.id, msg.result])
    if not isinstance(msg.code, str) or not isinstance(msg.message, str):
        raise TypeError("ErrorResponse needs a str code and a str message")
    return encode_frame([_KIND_ERROR, msg.id, msg.code, msg.message])


def decode_message(body: bytes | bytearray | memoryview) -> Message:
    """Decode a frame body into a message; ProtocolError unless it is a well-formed one."""
    obj = decode_frame(body)
    if type(obj) is not list or not obj or type(obj[0]) is not int:
        raise ProtocolError("frame is not a message (expected a list led by an integer kind)")
    kind = obj[0]
    if kind == _KIND_REQUEST:
        if len(obj) != 4:
            raise ProtocolError(f"request must have 4 fields, got {len(obj)}")
        _, msg_id, op, args = obj
        if type(msg_id) is not int or type(op) is not str or type(args) is not dict:
            raise ProtocolError("request needs an int id, a str op and a map of args")
        for name in args:
            if type(name) is not str:
                raise ProtocolError(f"request {op!r} has non-str argument names")
        return Request(msg_id, op, args)
    if kind == _KIND_RESPONSE:
        if len(obj) != 3:
            raise ProtocolError(f"response must have 3 fields, got {len(obj)}")
        _, msg_id, result = obj
        if type(msg_id) is not int:
            raise ProtocolError("response needs an int id")
        return Response(msg_id, result)
    if kind == _KIND_ERROR:
        if len(obj) != 4:
            raise ProtocolError(f"error response must have 4 fields, got {len(obj)}")
        _, msg_id, code, message = obj
        if type(msg_id) is not int or type(code) is not str or type(message) is not str:
            raise ProtocolError("error response needs an int id, a str code and a str message")
        return ErrorResponse(msg_id, code, message)
    raise ProtocolError(f"unknown message kind {kind}")
