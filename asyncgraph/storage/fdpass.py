"""Hand a PartitionStore's memfds to co-located processes over an abstract Unix socket.

The server runs an ``FdExporter`` next to its TCP listener and gives its ``address`` and
``token`` only to clients that authenticated over TCP. A client on the same host calls
``attach_store(address, token)``: it connects, presents the token, and receives the store's
descriptor and fds (SCM_RIGHTS), then maps them with ``AttachedStore.attach``.

The Unix socket speaks the TCP protocol's framing and messages (``asyncgraph.protocol``):

- client -> server: ``Request(1, "export", {"token": bytes, "names": [str] | None,
  "structure": bool})``
- server -> client: ``Response(1, {"descriptor": {...}, "num_fds": n})`` followed by
  ``ceil(n / FD_BATCH)`` one-byte messages each carrying up to ``FD_BATCH`` fds, or
  ``ErrorResponse(1, code, message)``, which the client re-raises with ``error_from_code``.

Both sides read exactly one frame (``FrameReader.needed``) so no fd-carrying byte is consumed
by a plain read.
The socket lives in the abstract namespace (no file to clean up, gone with the process); the
name carries a random suffix, and the 32-byte token is what grants access.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import re
import secrets
import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asyncgraph.errors import (
    AuthenticationError,
    InvalidRequestError,
    ProtocolError,
    ServerUnavailableError,
    error_code,
    error_from_code,
)
from asyncgraph.protocol import ErrorResponse, FrameReader, Request, Response, decode_message, encode_message
from asyncgraph.storage.attached import AttachedStore
from asyncgraph.storage.sharing import export
from asyncgraph.storage.store import PartitionStore

__all__ = ["FD_BATCH", "FdExporter", "attach_store", "fetch_catalog", "fetch_tensors"]

FD_BATCH = 200  # fds per SCM_RIGHTS message (the kernel allows at most 253)
MAX_FRAME = 16 << 20
REQUEST_TIMEOUT = 5.0  # seconds a connected client has to send its request
SEND_TIMEOUT = 10.0  # seconds the server spends sending one reply
EXPORT_OP = "export"
_REQUEST_ID = 1  # one request per connection


def _raw_address(address: str | bytes) -> str | bytes:
    """``"@name"`` (printable form) -> ``"\\0name"`` (what bind/connect take)."""
    if isinstance(address, str) and address.startswith("@"):
        return "\0" + address[1:]
    return address


def _printable(address: str | bytes) -> str:
    if isinstance(address, bytes):
        address = address.decode("utf-8", "replace")
    return "@" + address[1:] if address.startswith("\0") else address


def _frame(msg: Request | Response | ErrorResponse) -> bytes:
    """One whole frame (prefix included) carrying ``msg``; these messages hold no arrays."""
    return b"".join(encode_message(msg))


def _close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _send_reply(conn: socket.socket, reply: bytes, fds: list[int]) -> None:
    """Worker thread: send the reply frame and the fds in batches, then close conn and the fds."""
    try:
        conn.settimeout(SEND_TIMEOUT)
        conn.sendall(reply)
        for i in range(0, len(fds), FD_BATCH):
            socket.send_fds(conn, [b"F"], fds[i : i + FD_BATCH])
    except OSError:
        pass  # the client went away or stalled; it sees an error on its side
    finally:
        _close_fds(fds)
        conn.close()


class FdExporter:
    """Serves a PartitionStore's fds on an abstract Unix socket to co-located clients that present the token.

    Descriptor and fds are taken on the event loop (so they match the store's state at that
    moment) and duplicated; the blocking send runs in a small thread pool so a slow client
    never blocks the loop.
    """

    def __init__(self, store: PartitionStore, *, label: str) -> None:
        if not store.shared:
            raise InvalidRequestError("FdExporter needs a store created with shared=True")
        self._store = store
        self._label = re.sub(r"[^A-Za-z0-9._:-]", "_", label)[:48] or "store"
        self._token = secrets.token_bytes(32)
        self._raw: str | None = None
        self._sock: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self._sends: set[Future[None]] = set()
        self._pool: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Bind ``\\0asyncgraph.<label>.<pid>.<random hex>`` and start accepting."""
        if self._sock is not None:
            return
        raw = f"\0asyncgraph.{self._label}.{os.getpid()}.{secrets.token_hex(8)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(raw)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock, self._raw = sock, raw
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="asyncgraph-fdpass")
        self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())

    @property
    def address(self) -> str:
        """Printable abstract address (``"@asyncgraph..."``); pass it to ``attach_store`` as is."""
        if self._raw is None:
            raise InvalidRequestError("FdExporter is not started")
        return _printable(self._raw)

    @property
    def token(self) -> bytes:
        """The 32 random bytes a client must present; hand out only to authenticated clients."""
        return self._token

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError:
                await asyncio.sleep(0.05)  # e.g. EMFILE: back off instead of spinning
                continue
            conn.setblocking(False)
            task = loop.create_task(self._serve(conn))
            self._conn_tasks.add(task)
            task.add_done_callback(self._conn_tasks.discard)

    async def _recv_request(self, conn: socket.socket) -> memoryview:
        """The body of the client's one request frame, read without reading past it."""
        loop = asyncio.get_running_loop()
        reader = FrameReader(MAX_FRAME)
        while True:
            n = await loop.sock_recv_into(conn, reader.get_buffer(-1)[: reader.needed])
            if not n:
                raise ConnectionError("client closed the connection")
            frames = reader.buffer_updated(n)
            if frames:
                return frames[0]

    def _answer(self, body: memoryview) -> tuple[Response, list[int]]:
        """Check the request; return (reply, duplicated fds to send)."""
        req = decode_message(body)
        args = req.args if isinstance(req, Request) and req.op == EXPORT_OP else {}
        token = args.get("token")
        if not isinstance(token, bytes):
            raise ProtocolError(f"malformed fd request: expected a {EXPORT_OP!r} request with a token")
        if not hmac.compare_digest(token, self._token):
            raise AuthenticationError(f"wrong token for shared-memory exporter {self.address}")
        names = args.get("names")
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            raise InvalidRequestError("names must be a list of tensor names or None")
        desc, fds = export(self._store, names, structure=bool(args.get("structure", True)))
        dups: list[int] = []
        try:
            for fd in fds:
                dups.append(os.dup(fd))
        except BaseException:
            _close_fds(dups)
            raise
        return Response(_REQUEST_ID, {"descriptor": desc, "num_fds": len(dups)}), dups

    async def _serve(self, conn: socket.socket) -> None:
        handed_over = False
        try:
            try:
                body = await asyncio.wait_for(self._recv_request(conn), REQUEST_TIMEOUT)
            except Exception:  # timeout, disconnect, unreadable framing: drop the connection
                return
            reply: Response | ErrorResponse
            try:
                reply, fds = self._answer(body)
            except Exception as exc:  # reported to the client as (code, message)
                reply, fds = ErrorResponse(_REQUEST_ID, error_code(exc), str(exc)), []
            frame = _frame(reply)
            assert self._pool is not None
            fut = self._pool.submit(_send_reply, conn, frame, fds)
            handed_over = True
            self._sends.add(fut)
            fut.add_done_callback(self._sends.discard)
        finally:
            if not handed_over:
                conn.close()

    async def close(self) -> None:
        """Stop accepting, finish or drop in-flight replies, release the socket and threads."""
        if self._accept_task is not None:
            self._accept_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accept_task
            self._accept_task = None
        for task in list(self._conn_tasks):
            task.cancel()
        if self._conn_tasks:
            await asyncio.gather(*self._conn_tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._sends:
            await asyncio.wait([asyncio.wrap_future(f) for f in list(self._sends)], timeout=SEND_TIMEOUT + 1)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    async def __aenter__(self) -> FdExporter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --- client side -------------------------------------------------------------------------
class _Deadline:
    def __init__(self, address: str, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self.end = time.monotonic() + timeout

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise ServerUnavailableError(
                f"shared-memory exporter {self.address} did not answer within {self.timeout} s"
            )
        return left


def _recv_reply_blocking(sock: socket.socket, dl: _Deadline) -> Response:
    """The exporter's one reply frame (read without touching the fd messages after it)."""
    reader = FrameReader(MAX_FRAME)
    frames: list[memoryview] = []
    while not frames:
        sock.settimeout(dl.left())
        n = sock.recv_into(reader.get_buffer(-1), reader.needed)
        if not n:
            raise ServerUnavailableError(f"shared-memory exporter {dl.address} closed the connection")
        frames = reader.buffer_updated(n)
    reply = decode_message(frames[0])
    if isinstance(reply, ErrorResponse):
        raise error_from_code(reply.code, reply.message)
    if not isinstance(reply, Response) or not isinstance(reply.result, dict) or "num_fds" not in reply.result:
        raise ProtocolError(f"malformed reply from shared-memory exporter {dl.address}")
    return reply


def _request(
    address: str, token: bytes, names: Sequence[str] | None, *, structure: bool, timeout: float
) -> tuple[dict[str, Any], list[int]]:
    """Connect, authenticate, and receive (descriptor, fds); the caller owns the fds."""
    shown = _printable(address)
    dl = _Deadline(shown, timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    fds: list[int] = []
    try:
        try:
            sock.settimeout(dl.left())
            sock.connect(_raw_address(address))
        except (OSError, ValueError) as exc:
            raise ServerUnavailableError(f"cannot reach shared-memory exporter {shown}: {exc}") from exc
        args = {
            "token": bytes(token),
            "names": None if names is None else list(names),
            "structure": structure,
        }
        try:
            sock.settimeout(dl.left())
            sock.sendall(_frame(Request(_REQUEST_ID, EXPORT_OP, args)))
            reply = _recv_reply_blocking(sock, dl).result
            total = int(reply["num_fds"])
            flags_bad = socket.MSG_CTRUNC
            while len(fds) < total:
                want = min(FD_BATCH, total - len(fds))
                sock.settimeout(dl.left())
                msg, got, flags, _ = socket.recv_fds(sock, 1, want, socket.MSG_CMSG_CLOEXEC)
                fds.extend(got)
                if not msg:
                    raise ServerUnavailableError(f"shared-memory exporter {shown} closed the connection")
                if flags & flags_bad or len(got) != want:
                    raise ProtocolError(f"expected {want} fds from {shown}, received {len(got)}")
        except TimeoutError as exc:
            raise ServerUnavailableError(
                f"shared-memory exporter {shown} did not answer within {timeout} s"
            ) from exc
        except (ConnectionError, BrokenPipeError) as exc:
            raise ServerUnavailableError(f"shared-memory exporter {shown} went away: {exc}") from exc
        descriptor = reply["descriptor"]
        if not isinstance(descriptor, dict):
            raise ProtocolError(f"malformed descriptor from shared-memory exporter {shown}")
        return descriptor, fds
    except BaseException:
        _close_fds(fds)
        raise
    finally:
        sock.close()


def attach_store(
    address: str, token: bytes, *, names: Sequence[str] | None = None, timeout: float = 5.0
) -> AttachedStore:
    """Blocking: map a co-located server's store (tensors ``names``, or all) into this process.

    ``address`` is ``FdExporter.address`` (``"@..."``; a leading NUL works too). Wrong token:
    AuthenticationError; no server or no answer within ``timeout``: ServerUnavailableError.
    """
    desc, fds = _request(address, token, names, structure=True, timeout=timeout)
    return AttachedStore.attach(desc, fds)


def fetch_tensors(
    address: str, token: bytes, names: Sequence[str], timeout: float = 5.0
) -> tuple[dict[str, Any], list[int]]:
    """Blocking: (descriptor, fds) of tensors created after attach, for ``store.add_attached``."""
    return _request(address, token, list(names), structure=False, timeout=timeout)


def fetch_catalog(address: str, token: bytes, timeout: float = 5.0) -> tuple[dict[str, Any], list[int]]:
    """Blocking: (descriptor, fds) of every tensor the server holds, for ``store.sync_catalog``."""
    return _request(address, token, None, structure=False, timeout=timeout)
