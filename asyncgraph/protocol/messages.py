"""Typed protocol messages and the connection handshake, on top of the frame codec.

On the wire a message is a msgpack list led by a small integer kind, cheap to build and check::

    Request       [0, id, op, args]
    Response      [1, id, result]
    ErrorResponse [2, id, code, message]

Handshake frames are msgpack maps with a ``kind`` string and named fields, so that a server can
still read the version of a client speaking a newer protocol and reject it with a clear message
(unknown keys are ignored). The shared secret never crosses the wire: the server sends a random
nonce and the client answers with an HMAC-SHA256 over the nonce and the graph name.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass
from typing import Any

from asyncgraph.errors import AuthenticationError, ProtocolError
from asyncgraph.protocol.codec import decode_frame, encode_frame, encode_frame_bytes

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
    "compute_mac",
    "decode_handshake",
    "decode_message",
    "encode_handshake",
    "encode_message",
    "new_nonce",
    "verify_mac",
]

PROTOCOL_VERSION: int = 2
"""Bumped whenever the wire format or message semantics change incompatibly.

2: arrays are written as the fixed-struct ``ExtType(2, ...)`` with offsets relative to the data
region (see codec.py); version 1's ``ExtType(1, ...)`` is still decoded, but a version-1 peer
cannot read version 2 frames, so the hello refuses it. Handshake frames carry no arrays and are
encoded exactly as in version 1, so that refusal reaches an old peer in a form it reads.
"""

NONCE_SIZE: int = 32
"""Bytes of randomness in a server's handshake nonce."""

_KIND_REQUEST = 0
_KIND_RESPONSE = 1
_KIND_ERROR = 2
_MAC_TAG = b"asyncgraph-hello\x00"


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


@dataclass(frozen=True, slots=True)
class ServerHello:
    """First frame from the server: what it serves, and the nonce to authenticate against."""

    version: int
    graph_name: str
    part_id: int
    nonce: bytes
    auth_required: bool
    instance: str = ""  # new at every server start: a change tells a client the server restarted
    epoch: int = 0  # the server's state epoch (its last snapshot); 0 without a state folder


@dataclass(frozen=True, slots=True)
class ClientHello:
    """The client's answer: its version, the graph it expects, and its MAC (None without secret).

    ``holder`` (optional, new in issue 22) names the client (``AsyncClient.holder``) so a server
    can cap connections per holder (``--max-connections-per-holder``); None: anonymous.
    """

    version: int
    graph_name: str
    mac: bytes | None
    holder: str | None = None


@dataclass(frozen=True, slots=True)
class HelloResult:
    """Server's verdict; ``code`` is "" when ok, else an asyncgraph.errors code such as "auth"."""

    ok: bool
    code: str
    message: str


Handshake = ServerHello | ClientHello | HelloResult

# kind -> (class, field name -> accepted types); fields in dataclass order.
_HANDSHAKE_FIELDS: dict[str, tuple[type[Any], dict[str, tuple[type, ...]]]] = {
    "server_hello": (
        ServerHello,
        {
            "version": (int,),
            "graph_name": (str,),
            "part_id": (int,),
            "nonce": (bytes,),
            "auth_required": (bool,),
            "instance": (str,),
            "epoch": (int,),
        },
    ),
    "client_hello": (
        ClientHello,
        {"version": (int,), "graph_name": (str,), "mac": (bytes, type(None)), "holder": (str, type(None))},
    ),
    "hello_result": (HelloResult, {"ok": (bool,), "code": (str,), "message": (str,)}),
}
_OPTIONAL_FIELDS = frozenset({"instance", "epoch", "holder"})
_HANDSHAKE_KIND: dict[type[Any], str] = {cls: kind for kind, (cls, _) in _HANDSHAKE_FIELDS.items()}


def encode_handshake(msg: Handshake) -> bytes:
    """Encode a handshake message as a full frame."""
    kind = _HANDSHAKE_KIND.get(type(msg))
    if kind is None:
        raise TypeError(f"not a handshake message: {type(msg).__name__}")
    fields = _HANDSHAKE_FIELDS[kind][1]
    out: dict[str, Any] = {"kind": kind}
    for name, types in fields.items():
        value = getattr(msg, name)
        if type(value) not in types:
            raise TypeError(f"{type(msg).__name__}.{name} must be {' or '.join(t.__name__ for t in types)}")
        out[name] = value
    return encode_frame_bytes(out)


def decode_handshake(body: bytes | bytearray | memoryview) -> Handshake:
    """Decode a handshake frame body; ProtocolError when malformed (unknown keys are ignored)."""
    obj = decode_frame(body)
    if type(obj) is not dict:
        raise ProtocolError("frame is not a handshake message (expected a map)")
    kind = obj.get("kind")
    spec = _HANDSHAKE_FIELDS.get(kind) if type(kind) is str else None
    if spec is None:
        raise ProtocolError(f"unknown handshake kind {kind!r}")
    cls, fields = spec
    values: dict[str, Any] = {}
    for name, types in fields.items():
        if name not in obj:
            if name in _OPTIONAL_FIELDS:
                continue  # an older peer: the dataclass default stands
            raise ProtocolError(f"handshake {kind} lacks field {name!r}")
        value = obj[name]
        if type(value) not in types:
            raise ProtocolError(f"handshake {kind} field {name!r} has wrong type {type(value).__name__}")
        values[name] = value
    result: Handshake = cls(**values)
    return result


def compute_mac(secret: bytes, nonce: bytes, graph_name: str) -> bytes:
    """HMAC-SHA256 keyed by ``secret`` over the nonce and graph name (length-delimited)."""
    name = graph_name.encode("utf-8")
    data = _MAC_TAG + struct.pack(">I", len(nonce)) + nonce + name
    return hmac.new(secret, data, hashlib.sha256).digest()


def verify_mac(secret: bytes, nonce: bytes, graph_name: str, mac: bytes | None) -> bool:
    """Constant-time check that ``mac`` proves knowledge of ``secret``; False for no MAC."""
    if mac is None:
        return False
    return hmac.compare_digest(compute_mac(secret, nonce, graph_name), mac)


def check_client_hello(
    hello: ClientHello, *, graph_name: str, nonce: bytes, secret: bytes | None
) -> HelloResult:
    """The server's verdict on a ClientHello: version, graph name, then MAC if a secret is set.

    A client that sends a MAC to a server without a secret is accepted (nothing to check).
    """
    code = AuthenticationError.code
    if hello.version != PROTOCOL_VERSION:
        return HelloResult(False, code, f"protocol version {hello.version} != server's {PROTOCOL_VERSION}")
    if hello.graph_name != graph_name:
        return HelloResult(False, code, f"graph {hello.graph_name!r} != served graph {graph_name!r}")
    if secret is not None:
        if hello.mac is None:
            return HelloResult(
                False, code, "authentication failed: the server requires a secret and the client sent none"
            )
        if not verify_mac(secret, nonce, graph_name, hello.mac):
            return HelloResult(False, code, "authentication failed: wrong secret")
    return HelloResult(True, "", "")


def new_nonce() -> bytes:
    """A fresh random handshake nonce (NONCE_SIZE bytes from ``secrets``)."""
    return secrets.token_bytes(NONCE_SIZE)
