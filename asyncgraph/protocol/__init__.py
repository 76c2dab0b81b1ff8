"""Pure wire protocol: framing, zero-copy codec, typed messages and per-side sessions (no I/O).

Everything here is a function of bytes in and bytes out, so the asyncio server and client own
the sockets and these pieces can be tested by feeding deliberately split byte strings.
"""

from asyncgraph.protocol.codec import (
    ALIGNMENT,
    ARRAY_EXT_CODE,
    decode_frame,
    encode_frame,
    encode_frame_bytes,
    frame_size,
)
from asyncgraph.protocol.events import (
    CONNECTION_ERROR_ID,
    ClientEvent,
    ConnectionFailed,
    HandshakeComplete,
    ServerEvent,
)
from asyncgraph.protocol.framing import DEFAULT_MAX_FRAME_SIZE, LENGTH_PREFIX, FrameReader
from asyncgraph.protocol.info import ServerInfo, SharedMemoryInfo
from asyncgraph.protocol.messages import (
    NONCE_SIZE,
    PROTOCOL_VERSION,
    ClientHello,
    ErrorResponse,
    Handshake,
    HelloResult,
    Message,
    Request,
    Response,
    ServerHello,
    check_client_hello,
    check_hello_result,
    client_proof_key,
    decode_handshake,
    decode_message,
    encode_handshake,
    encode_message,
    hello_proof,
    holder_key,
    new_nonce,
)
from asyncgraph.protocol.session import ClientSession, ServerSession, SessionState

__all__ = [
    "ALIGNMENT",
    "ARRAY_EXT_CODE",
    "CONNECTION_ERROR_ID",
    "DEFAULT_MAX_FRAME_SIZE",
    "LENGTH_PREFIX",
    "NONCE_SIZE",
    "PROTOCOL_VERSION",
    "ClientEvent",
    "ClientHello",
    "ClientSession",
    "ConnectionFailed",
    "ErrorResponse",
    "FrameReader",
    "Handshake",
    "HandshakeComplete",
    "HelloResult",
    "Message",
    "Request",
    "Response",
    "ServerEvent",
    "ServerHello",
    "ServerInfo",
    "ServerSession",
    "SessionState",
    "SharedMemoryInfo",
    "check_client_hello",
    "check_hello_result",
    "client_proof_key",
    "decode_frame",
    "decode_handshake",
    "decode_message",
    "encode_frame",
    "encode_frame_bytes",
    "encode_handshake",
    "encode_message",
    "frame_size",
    "hello_proof",
    "holder_key",
    "new_nonce",
]
