"""One connection's protocol state, per side: bytes in, typed events out; messages in, pieces out.

A session owns the handshake order (server hello with a nonce, client hello with its nonce and
MAC, hello result with the server's MAC: ``protocol/handshake.py``; then requests and
responses) and every rule that ends a connection: a garbage or oversized frame, a request
before the hello, a second hello, a message in the wrong direction, an error for the whole
connection (request id 0). It never touches a socket: the transport hands it received bytes
(``get_buffer``/``buffer_updated``, so large bodies still land in their final buffer) and
writes what ``data_to_send`` and the ``send_*`` methods return with ``writelines``.
"""

from __future__ import annotations

import enum
from typing import Any

from asyncgraph.errors import (
    AsyncGraphError,
    AuthenticationError,
    FrameTooLargeError,
    ProtocolError,
    error_code,
    error_from_code,
)
from asyncgraph.protocol.codec import frame_size
from asyncgraph.protocol.events import (
    CONNECTION_ERROR_ID,
    ClientEvent,
    ConnectionFailed,
    HandshakeComplete,
    ServerEvent,
)
from asyncgraph.protocol.framing import DEFAULT_MAX_FRAME_SIZE, LENGTH_PREFIX, FrameReader
from asyncgraph.protocol.messages import (
    PROTOCOL_VERSION,
    ClientHello,
    ErrorResponse,
    HelloResult,
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
    new_nonce,
)

__all__ = ["HANDSHAKE_MAX_FRAME_SIZE", "ClientSession", "ServerSession", "SessionState"]

HANDSHAKE_MAX_FRAME_SIZE: int = 16 * 1024
"""Largest frame a server accepts before the hello succeeded (a client hello is ~100 bytes)."""

Pieces = list[bytes | memoryview]


class SessionState(enum.Enum):
    """Where a session is in the connection's life."""

    AWAIT_SERVER_HELLO = "await_server_hello"
    AWAIT_CLIENT_HELLO = "await_client_hello"
    AWAIT_HELLO_RESULT = "await_hello_result"
    READY = "ready"
    CLOSED = "closed"


_READY = SessionState.READY
_CLOSED = SessionState.CLOSED


def _describe(body: memoryview) -> str:
    """Name what an unexpected frame holds (a handshake kind or a message type), for errors."""
    try:
        return type(decode_handshake(body)).__name__
    except ProtocolError:
        pass
    try:
        return type(decode_message(body)).__name__
    except ProtocolError:
        return ""


class _Session:
    """Framing and the outgoing buffer shared by both sides."""

    __slots__ = ("_out", "_reader", "state")

    def __init__(self, max_frame_size: int, state: SessionState) -> None:
        self._reader = FrameReader(max_frame_size)
        self._out: Pieces = []
        self.state = state

    @property
    def max_frame_size(self) -> int:
        """Largest frame body this side accepts."""
        return self._reader.max_frame_size

    @property
    def closed(self) -> bool:
        """True once the connection failed or was closed; no more events follow."""
        return self.state is _CLOSED

    def get_buffer(self, sizehint: int) -> memoryview:
        """Memory to receive into (``asyncio.BufferedProtocol.get_buffer``)."""
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> list[Any]:
        """``nbytes`` arrived in the last buffer; return the events they complete."""
        if self.state is _CLOSED:
            return []
        try:
            bodies = self._reader.buffer_updated(nbytes)
        except ProtocolError as exc:
            return [self._fail(exc)]
        if not bodies:
            return []
        return self._on_bodies(bodies)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Copy ``data`` in through ``get_buffer``/``buffer_updated``; for tests and plain transports."""
        src = memoryview(data).cast("B")
        events: list[Any] = []
        pos = 0
        while pos < len(src) and self.state is not _CLOSED:
            buf = self.get_buffer(len(src) - pos)
            n = min(len(buf), len(src) - pos)
            buf[:n] = src[pos : pos + n]
            events.extend(self.buffer_updated(n))
            pos += n
        return events

    def data_to_send(self) -> Pieces:
        """Frames the session produced on its own (hellos, reasons for failing); empty if none."""
        out = self._out
        if out:
            self._out = []
        return out

    def close(self) -> None:
        """The transport went away: nothing more is received or sent."""
        self.state = _CLOSED

    def _on_bodies(self, bodies: list[memoryview]) -> list[Any]:
        raise NotImplementedError

    def _fail(self, exc: AsyncGraphError) -> ConnectionFailed:
        """Enter CLOSED and report ``exc`` (subclasses first queue the reason for the peer)."""
        self.state = _CLOSED
        return ConnectionFailed(exc)


class ServerSession(_Session):
    """The server's side: sends its hello first, checks the client's, then yields requests."""

    __slots__ = (
        "_full_max_frame_size",
        "_require_holder_keys",
        "_secret",
        "client_hello",
        "graph_name",
        "hello",
        "nonce",
        "part_id",
    )

    def __init__(
        self,
        *,
        graph_name: str,
        part_id: int,
        secret: bytes | None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        nonce: bytes | None = None,
        instance: str = "",
        epoch: int = 0,
        role: str = "primary",
        require_holder_keys: bool = False,
    ) -> None:
        """The server hello is queued at once: write ``data_to_send()`` when the client connects.

        Until the client hello is accepted frames are limited to ``HANDSHAKE_MAX_FRAME_SIZE``
        (an unauthenticated peer cannot make the server allocate more); ``max_frame_size``
        applies from then on. ``instance`` (new at each server start) and ``epoch`` (its state
        epoch) let a reconnecting client tell a restarted server, and one that lost state, from
        the old one; ``role`` ("primary" or "replica") is bound into both proofs.
        ``require_holder_keys``: a hello that names a holder must prove that holder's own key
        (``protocol.handshake.holder_key``), not the bare secret.
        """
        super().__init__(min(max_frame_size, HANDSHAKE_MAX_FRAME_SIZE), SessionState.AWAIT_CLIENT_HELLO)
        self._full_max_frame_size = max_frame_size
        self.graph_name = graph_name
        self.part_id = part_id
        self.nonce = new_nonce() if nonce is None else nonce
        self._secret = secret
        self._require_holder_keys = require_holder_keys
        self.client_hello: ClientHello | None = None
        self.hello = ServerHello(
            PROTOCOL_VERSION, graph_name, part_id, self.nonce, secret is not None, instance, epoch, role
        )
        self._out.append(encode_handshake(self.hello))

    def buffer_updated(self, nbytes: int) -> list[ServerEvent]:
        """``nbytes`` arrived; return requests, ``HandshakeComplete`` or ``ConnectionFailed``."""
        return super().buffer_updated(nbytes)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[ServerEvent]:
        """Feed plain bytes; see ``buffer_updated``."""
        return super().receive_data(data)

    def _on_bodies(self, bodies: list[memoryview]) -> list[Any]:
        events: list[ServerEvent] = []
        for body in bodies:
            state = self.state
            if state is _READY:
                try:
                    msg = decode_message(body)
                except ProtocolError as exc:
                    kind = _describe(body)
                    err = exc
                    if kind in ("ClientHello", "ServerHello", "HelloResult"):
                        err = ProtocolError(f"duplicate hello: got a {kind} after the handshake")
                    events.append(self._fail(err))
                    break
                if type(msg) is Request:
                    events.append(msg)
                    continue
                events.append(self._fail(ProtocolError(f"expected a request, got {type(msg).__name__}")))
                break
            if state is _CLOSED:
                break
            events.append(self._on_client_hello(body))
        return events

    def _on_client_hello(self, body: memoryview) -> ServerEvent:
        try:
            hello = decode_handshake(body)
        except ProtocolError as exc:
            kind = _describe(body)
            err = exc
            if kind in ("Request", "Response", "ErrorResponse"):
                err = ProtocolError(f"{kind} before hello: expected a client hello first")
            return self._fail(err)
        if not isinstance(hello, ClientHello):
            return self._fail(ProtocolError("expected a client hello to open the connection"))
        result = check_client_hello(
            hello, server=self.hello, secret=self._secret, require_holder_keys=self._require_holder_keys
        )
        self._out.append(encode_handshake(result))
        if not result.ok:
            self.state = _CLOSED
            return ConnectionFailed(error_from_code(result.code, result.message))
        self.client_hello = hello
        self._reader.max_frame_size = self._full_max_frame_size
        self.state = _READY
        return HandshakeComplete(hello)

    def _fail(self, exc: AsyncGraphError) -> ConnectionFailed:
        """Queue the reason for the client: a refused hello, or an error with request id 0."""
        if self.state is _READY:
            self._out.extend(encode_message(ErrorResponse(CONNECTION_ERROR_ID, exc.code, str(exc))))
        elif self.state is not _CLOSED:
            self._out.append(encode_handshake(HelloResult(False, exc.code, str(exc))))
        return super()._fail(exc)

    def send_response(self, request_id: int, result: Any) -> Pieces:
        """Pieces answering ``request_id`` with ``result``; TypeError/OverflowError if unencodable.

        A reply over ``max_frame_size`` raises FrameTooLargeError instead of being sent (the
        peer's reader would refuse it and lose its place in the stream): answer that request
        with ``send_error`` and the connection stays usable.
        """
        if self.state is not _READY:
            raise ProtocolError(f"cannot answer request {request_id}: session is {self.state.value}")
        pieces = encode_message(Response(request_id, result))
        size = -LENGTH_PREFIX.size  # frame_size without a generator: this runs for every reply
        for p in pieces:
            size += p.nbytes if type(p) is memoryview else len(p)
        if size > self._full_max_frame_size:
            raise FrameTooLargeError(
                f"the reply to request {request_id} is {size} bytes, over the maximum frame size "
                f"{self._full_max_frame_size}; ask for less per call"
            )
        return pieces

    def send_error(self, request_id: int, exc: BaseException) -> Pieces:
        """Pieces reporting ``exc`` for ``request_id`` as ``(code, message)``."""
        if self.state is not _READY:
            raise ProtocolError(f"cannot answer request {request_id}: session is {self.state.value}")
        message = str(exc) or type(exc).__name__
        return encode_message(ErrorResponse(request_id, error_code(exc), message))


class ClientSession(_Session):
    """The client's side: answers the server's hello, then sends requests and yields replies.

    ``name`` names the server in error messages; ``graph_name=None`` accepts whatever graph
    the server serves; ``part_id`` / ``role``, when given, are the partition and role the
    server must announce, checked before the client answers (a relay that passes on another
    server's hello gets nothing). With a secret the server must prove it too, or the
    connection fails with ``AuthenticationError``. ``holder_key``: the key of ``holder`` this
    client was given instead of the cluster secret (``protocol.handshake.holder_key``); a client
    with the secret and a holder proves that holder's key, derived. Request ids start at 1 (0 is
    reserved for connection-level errors).
    """

    __slots__ = (
        "_hello",
        "_key",
        "_next_id",
        "graph_name",
        "holder",
        "name",
        "part_id",
        "role",
        "server_hello",
    )

    def __init__(
        self,
        *,
        graph_name: str | None,
        secret: bytes | None,
        name: str = "?",
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        holder: str | None = None,
        part_id: int | None = None,
        role: str | None = None,
        holder_key: bytes | None = None,
    ) -> None:
        super().__init__(max_frame_size, SessionState.AWAIT_SERVER_HELLO)
        self.graph_name = graph_name
        self.part_id = part_id
        self.role = role
        self._hello: ClientHello | None = None
        self.holder = holder  # sent in the hello: the server caps connections per holder
        self.name = name
        self._key = client_proof_key(secret, holder, holder_key)  # what both sides prove
        self._next_id = CONNECTION_ERROR_ID + 1
        self.server_hello: ServerHello | None = None

    def buffer_updated(self, nbytes: int) -> list[ClientEvent]:
        """``nbytes`` arrived; return replies, ``HandshakeComplete`` or ``ConnectionFailed``."""
        return super().buffer_updated(nbytes)

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[ClientEvent]:
        """Feed plain bytes; see ``buffer_updated``."""
        return super().receive_data(data)

    def send_request(self, op: str, args: dict[str, Any]) -> tuple[int, Pieces]:
        """A fresh request id and the pieces carrying ``op(args)``.

        Raises FrameTooLargeError when the frame exceeds ``max_frame_size``, TypeError or
        OverflowError for unencodable arguments, ProtocolError unless the session is ready.
        """
        if self.state is not _READY:
            raise ProtocolError(f"cannot send {op} to server {self.name}: session is {self.state.value}")
        request_id = self._next_id
        self._next_id = request_id + 1
        pieces = encode_message(Request(request_id, op, args))
        size = frame_size(pieces) - LENGTH_PREFIX.size
        if size > self._reader.max_frame_size:
            raise FrameTooLargeError(
                f"{op} request of {size} bytes exceeds the maximum frame size "
                f"{self._reader.max_frame_size}; split it into smaller calls"
            )
        return request_id, pieces

    def _on_bodies(self, bodies: list[memoryview]) -> list[Any]:
        events: list[ClientEvent] = []
        for body in bodies:
            state = self.state
            if state is _READY:
                try:
                    msg = decode_message(body)
                except ProtocolError as exc:
                    kind = _describe(body)
                    err = exc
                    if kind:
                        err = ProtocolError(f"server {self.name} sent a {kind} after the handshake")
                    events.append(self._fail(err))
                    break
                kind_type = type(msg)
                if kind_type is Response or (kind_type is ErrorResponse and msg.id != CONNECTION_ERROR_ID):
                    events.append(msg)  # type: ignore[arg-type]  # Response or ErrorResponse
                    continue
                events.append(self._fail(self._wrong_message(msg)))
                break
            if state is _CLOSED:
                break
            events.extend(self._on_handshake(body))
        return events

    def _wrong_message(self, msg: Request | Response | ErrorResponse) -> AsyncGraphError:
        if isinstance(msg, ErrorResponse):
            return error_from_code(msg.code, f"server {self.name} closed the connection: {msg.message}")
        return ProtocolError(f"server {self.name} sent a request")

    def _on_handshake(self, body: memoryview) -> list[ClientEvent]:
        try:
            msg = decode_handshake(body)
        except ProtocolError as exc:
            return [self._fail(exc)]
        if self.state is SessionState.AWAIT_SERVER_HELLO:
            if not isinstance(msg, ServerHello):
                return [self._fail(ProtocolError(f"server {self.name} did not open with a hello"))]
            problem = self._unexpected(msg)
            if problem is not None:
                return [self._fail(AuthenticationError(f"server {self.name} {problem}; refusing it"))]
            self.server_hello = msg
            nonce = new_nonce()
            mac = None
            if self._key is not None:
                mac = hello_proof(self._key, "client", msg, nonce, self.holder)
            graph_name = self.graph_name if self.graph_name is not None else msg.graph_name
            self._hello = ClientHello(PROTOCOL_VERSION, graph_name, mac, self.holder, nonce)
            self._out.append(encode_handshake(self._hello))
            self.state = SessionState.AWAIT_HELLO_RESULT
            return []
        if not isinstance(msg, HelloResult):
            return [
                self._fail(ProtocolError(f"server {self.name} answered the hello with {type(msg).__name__}"))
            ]
        if not msg.ok:
            return [
                self._fail(
                    error_from_code(msg.code, f"server {self.name} refused the connection: {msg.message}")
                )
            ]
        assert self.server_hello is not None and self._hello is not None
        why = check_hello_result(msg, server=self.server_hello, client=self._hello, secret=self._key)
        if why is not None:
            return [self._fail(AuthenticationError(f"server {self.name} accepted the hello but {why}"))]
        self.state = _READY
        return [HandshakeComplete(self.server_hello)]

    def _unexpected(self, hello: ServerHello) -> str | None:
        """Why the server that sent ``hello`` is not one to answer, or None."""
        if hello.auth_required and self._key is None:
            return "requires a shared secret and none was given"
        if self._key is not None and not hello.auth_required:
            return "runs without a secret, so it cannot prove it is a server of this job"
        if self.part_id is not None and hello.part_id != self.part_id:
            return f"serves partition {hello.part_id}, expected {self.part_id}"
        if self.role is not None and hello.role != self.role:
            return f"is a {hello.role!r} server, expected a {self.role!r} one"
        return None
