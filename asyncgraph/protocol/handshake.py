"""The connection handshake: hello frames and the mutual proof of the shared secret (no I/O).

Handshake frames are msgpack maps with a ``kind`` string and named fields, so that a server can
still read the version of a client speaking a newer protocol and reject it with a clear message
(unknown keys are ignored). The shared secret never crosses the wire. Since protocol 3 (issue
32) both sides prove it, over one transcript of the session::

    server -> ServerHello(version, graph, part, role, instance, epoch, server nonce)
    client -> ClientHello(version, graph, holder, client nonce,
                          mac = HMAC(secret, "client" + transcript))
    server -> HelloResult(ok, mac = HMAC(secret, "server" + transcript))

The transcript holds both nonces, the graph, the partition, the server's role and instance, its
epoch and the client's holder, so an answer is good for this one session with this one server:
a relay that passes another server's hello on (or rewrites it) gets a MAC the real server
refuses, and a process without the secret cannot produce the server's MAC, which a client with
a secret requires (``check_hello_result``). What this does not give: secrecy or integrity of the
requests after the handshake; use TLS (``asyncgraph.net.tls``) on untrusted networks.

Holder keys (issue 32, item 6): a client that names a holder may prove the hello with that
holder's own key, ``holder_key(secret, holder)``, instead of the cluster secret; the server,
which has the secret, derives the key of the holder the hello names, and proves itself with
the same key. A process given only one holder's key (the launcher's trainers) can therefore
connect as that holder and no other, so invented holders cannot pass a per-holder cap. A
client with the cluster secret derives the key of the holder it names (it may name any: it is
trusted); without a holder it proves the secret itself. A server with ``require_holder_keys``
refuses a named holder proved by the bare secret (an older client's hello).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass
from typing import Any

from asyncgraph.errors import AuthenticationError, HolderError, ProtocolError
from asyncgraph.protocol.codec import decode_frame, encode_frame_bytes

__all__ = [
    "MAX_HOLDER_LENGTH",
    "NONCE_SIZE",
    "PROTOCOL_VERSION",
    "ClientHello",
    "Handshake",
    "HelloResult",
    "ServerHello",
    "check_client_hello",
    "check_hello_result",
    "client_proof_key",
    "decode_handshake",
    "encode_handshake",
    "hello_proof",
    "holder_key",
    "holder_problem",
    "new_nonce",
]

PROTOCOL_VERSION: int = 3
"""Bumped whenever the wire format or message semantics change incompatibly.

2: arrays are written as the fixed-struct ``ExtType(2, ...)`` with offsets relative to the data
region (see codec.py); version 1's ``ExtType(1, ...)`` is still decoded, but a version-1 peer
cannot read version 2 frames, so the hello refuses it.
3: mutual authentication bound to the session (issue 32): the client sends a nonce of its own,
both MACs cover the whole transcript, the server proves the secret in its hello result.
Handshake frames carry no arrays and are encoded as in version 1, so a refusal of an older
peer's version reaches it in a form it reads.
"""

NONCE_SIZE: int = 32
"""Bytes of randomness in each side's handshake nonce."""

_MAC_TAG = b"asyncgraph-hello-3\x00"

_HOLDER_KEY_TAG = b"asyncgraph-holder\x00"

MAX_HOLDER_LENGTH: int = 128
"""Longest holder name a server accepts (a client's default is 32 hex digits)."""


def holder_problem(holder: str | None) -> str | None:
    """Why ``holder`` is not an acceptable holder name (None when it is, or absent): 1 to
    ``MAX_HOLDER_LENGTH`` printable characters, so it cannot forge a log line."""
    if holder is None:
        return None
    if not 0 < len(holder) <= MAX_HOLDER_LENGTH:
        return f"a holder name is 1 to {MAX_HOLDER_LENGTH} characters, got {len(holder)}"
    if not holder.isprintable():
        return f"a holder name is printable characters only, got {holder[:MAX_HOLDER_LENGTH]!a}"
    return None


def holder_key(secret: bytes, holder: str) -> bytes:
    """The key of ``holder``, derived from the cluster ``secret``:
    ``HMAC-SHA256(secret, "asyncgraph-holder\\0" + holder)``. It proves that one holder in a
    hello; it reveals nothing of the secret or of another holder's key."""
    data = _HOLDER_KEY_TAG + holder.encode("utf-8", "surrogatepass")
    return hmac.new(secret, data, hashlib.sha256).digest()


def client_proof_key(secret: bytes | None, holder: str | None, own_key: bytes | None = None) -> bytes | None:
    """The key a client proves its hello with: ``own_key`` (a holder key it was given, which
    needs the ``holder`` it belongs to), else the key of ``holder`` derived from the cluster
    ``secret``, else the secret itself (no holder), else None (no credentials)."""
    if own_key is not None:
        if holder is None:
            raise ValueError("a holder key proves a named holder: give the holder it belongs to")
        return own_key
    if secret is not None and holder is not None:
        return holder_key(secret, holder)
    return secret


@dataclass(frozen=True, slots=True)
class ServerHello:
    """First frame from the server: what it serves, and the nonce to authenticate against.

    ``role`` is "primary" or "replica" (a client may expect one); ``instance`` is new at every
    server start, so a change tells a client the server restarted; ``epoch`` is the server's
    state epoch (its last snapshot; 0 without a state folder)."""

    version: int
    graph_name: str
    part_id: int
    nonce: bytes
    auth_required: bool
    instance: str = ""
    epoch: int = 0
    role: str = "primary"


@dataclass(frozen=True, slots=True)
class ClientHello:
    """The client's answer: its version, the graph it expects, its MAC (None without a secret),
    ``holder`` (the client's name: the server binds it to this connection) and its own nonce."""

    version: int
    graph_name: str
    mac: bytes | None
    holder: str | None = None
    nonce: bytes = b""


@dataclass(frozen=True, slots=True)
class HelloResult:
    """Server's verdict; ``code`` is "" when ok, else an asyncgraph.errors code such as "auth".
    ``mac`` is the server's proof of the secret (None when it has none, and on a refusal)."""

    ok: bool
    code: str
    message: str
    mac: bytes | None = None


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
            "role": (str,),
        },
    ),
    "client_hello": (
        ClientHello,
        {
            "version": (int,),
            "graph_name": (str,),
            "mac": (bytes, type(None)),
            "holder": (str, type(None)),
            "nonce": (bytes,),
        },
    ),
    "hello_result": (
        HelloResult,
        {"ok": (bool,), "code": (str,), "message": (str,), "mac": (bytes, type(None))},
    ),
}
# Fields an older peer does not send (the dataclass default stands); left out when None, so a
# refusal is byte for byte what protocol 1 wrote.
_OPTIONAL_FIELDS = {
    "server_hello": frozenset({"instance", "epoch", "role"}),
    "client_hello": frozenset({"holder", "nonce"}),
    "hello_result": frozenset({"mac"}),
}
_HANDSHAKE_KIND: dict[type[Any], str] = {cls: kind for kind, (cls, _) in _HANDSHAKE_FIELDS.items()}


def encode_handshake(msg: Handshake) -> bytes:
    """Encode a handshake message as a full frame."""
    kind = _HANDSHAKE_KIND.get(type(msg))
    if kind is None:
        raise TypeError(f"not a handshake message: {type(msg).__name__}")
    fields = _HANDSHAKE_FIELDS[kind][1]
    optional = _OPTIONAL_FIELDS[kind]
    out: dict[str, Any] = {"kind": kind}
    for name, types in fields.items():
        value = getattr(msg, name)
        if type(value) not in types:
            raise TypeError(f"{type(msg).__name__}.{name} must be {' or '.join(t.__name__ for t in types)}")
        if value is None and name in optional:
            continue
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
    optional = _OPTIONAL_FIELDS[str(kind)]
    values: dict[str, Any] = {}
    for name, types in fields.items():
        if name not in obj:
            if name in optional:
                continue  # an older peer: the dataclass default stands
            raise ProtocolError(f"handshake {kind} lacks field {name!r}")
        value = obj[name]
        if type(value) not in types:
            raise ProtocolError(f"handshake {kind} field {name!r} has wrong type {type(value).__name__}")
        values[name] = value
    result: Handshake = cls(**values)
    return result


def _field(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def hello_proof(
    secret: bytes, side: str, server: ServerHello, client_nonce: bytes, holder: str | None
) -> bytes:
    """HMAC-SHA256 keyed by ``secret`` proving ``side`` ("client" or "server") holds it, over the
    whole transcript of one session (fields length-delimited, so none can run into another)."""
    if side not in ("client", "server"):
        raise ValueError(f"side must be 'client' or 'server', got {side!r}")
    text = (side, server.graph_name, server.role, server.instance, "" if holder is None else "=" + holder)
    data = b"".join(
        [_MAC_TAG, struct.pack(">qqq", server.version, server.part_id, server.epoch)]
        + [_field(server.nonce), _field(client_nonce)]
        + [_field(t.encode("utf-8", "surrogatepass")) for t in text]
    )
    return hmac.new(secret, data, hashlib.sha256).digest()


def _proved(secret: bytes, side: str, server: ServerHello, client: ClientHello, mac: bytes | None) -> bool:
    if mac is None:
        return False
    return hmac.compare_digest(hello_proof(secret, side, server, client.nonce, client.holder), mac)


def check_client_hello(
    hello: ClientHello, *, server: ServerHello, secret: bytes | None, require_holder_keys: bool = False
) -> HelloResult:
    """The server's verdict on a ClientHello (``server``: the hello it sent): version, graph
    name, then the client's MAC if a secret is set: by the named holder's key, or by the secret
    itself (not for a named holder with ``require_holder_keys``). An accepted hello's result
    carries the server's own proof, with the key that proved the client's. A client that sends
    a MAC to a server without a secret is accepted (nothing to check); such a client refuses
    the server, which cannot prove a secret."""
    code = AuthenticationError.code
    if hello.version != PROTOCOL_VERSION:
        return HelloResult(False, code, f"protocol version {hello.version} != server's {PROTOCOL_VERSION}")
    if hello.graph_name != server.graph_name:
        return HelloResult(False, code, f"graph {hello.graph_name!r} != served graph {server.graph_name!r}")
    bad_holder = holder_problem(hello.holder)
    if bad_holder is not None:
        return HelloResult(False, HolderError.code, bad_holder)
    if secret is None:
        return HelloResult(True, "", "")
    if hello.mac is None:
        return HelloResult(
            False, code, "authentication failed: the server requires a secret and the client sent none"
        )
    if len(hello.nonce) != NONCE_SIZE:
        return HelloResult(False, code, f"authentication failed: the client nonce is not {NONCE_SIZE} bytes")
    keys = [] if hello.holder is None else [holder_key(secret, hello.holder)]
    if hello.holder is None or not require_holder_keys:
        keys.append(secret)
    for key in keys:
        if _proved(key, "client", server, hello, hello.mac):
            return HelloResult(True, "", "", hello_proof(key, "server", server, hello.nonce, hello.holder))
    if hello.holder is not None and _proved(secret, "client", server, hello, hello.mac):
        why = (
            f"authentication failed: this server requires holder keys, and holder {hello.holder[:64]!r} "
            "was proved by the cluster secret instead of its own key (an older client?)"
        )
        return HelloResult(False, code, why)
    why = "authentication failed: wrong secret or holder key (or an answer to another server's hello)"
    return HelloResult(False, code, why)


def check_hello_result(
    result: HelloResult, *, server: ServerHello, client: ClientHello, secret: bytes | None
) -> str | None:
    """The client's check of an accepted HelloResult: None when the server proved the secret
    (or the client has none), else why it is refused."""
    if secret is None:
        return None
    if result.mac is None:
        return "it did not prove that it holds the secret (no server MAC): not a server of this job"
    if not _proved(secret, "server", server, client, result.mac):
        return "its proof of the secret is wrong: not a server of this job (or a relay)"
    return None


def new_nonce() -> bytes:
    """A fresh random handshake nonce (NONCE_SIZE bytes from ``secrets``)."""
    return secrets.token_bytes(NONCE_SIZE)
