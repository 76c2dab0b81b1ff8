"""An attacker without the secret, on loopback: binds a (dead) server's port and relays.

``relay.py PORT MODE [TARGET_HOST:TARGET_PORT]``; MODE is

- ``pass``: pass the target server's hello to the client unchanged, the client's answer to the
  target, and the target's verdict back;
- ``rewrite``: the same, with the hello's partition rewritten to the one the client expects
  (``PART`` env var);
- ``fake``: no target: answer as a server itself (a hello with a fresh nonce, then "ok").

Whenever the target accepted the relayed answer, the relay uses the session for itself (an
``info`` request). Prints ``listening`` once bound, then one JSON line per client connection:
``{"session": bool, "answered": bool, "requests_seen": int}``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

from asyncgraph.protocol import (
    PROTOCOL_VERSION,
    HelloResult,
    Request,
    ServerHello,
    decode_handshake,
    encode_handshake,
    encode_message,
    new_nonce,
)


def read_frame(sock: socket.socket) -> bytes:
    """One length-prefixed frame, prefix included (b"" at EOF)."""
    head = b""
    while len(head) < 4:
        got = sock.recv(4 - len(head))
        if not got:
            return b""
        head += got
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        got = sock.recv(n - len(body))
        if not got:
            return b""
        body += got
    return head + body


def relay_one(client: socket.socket, mode: str, target: tuple[str, int] | None) -> dict[str, object]:
    report: dict[str, object] = {"session": False, "answered": False, "requests_seen": 0}
    if target is None:  # fake: a server hello of our own, then accept whatever comes
        part = int(os.environ.get("PART", "1"))
        hello = ServerHello(PROTOCOL_VERSION, "cora", part, new_nonce(), True, "fake", 0)
        client.sendall(encode_handshake(hello))
        answer = read_frame(client)
        if answer:
            client.sendall(encode_handshake(HelloResult(True, "", "")))
            client.settimeout(1.0)
            try:
                while read_frame(client):
                    report["requests_seen"] = int(report["requests_seen"]) + 1  # type: ignore[call-overload]
            except OSError:
                pass
        return report
    with socket.create_connection(target, timeout=5) as upstream:
        frame = read_frame(upstream)
        if mode == "rewrite":
            hello = decode_handshake(frame[4:])
            assert isinstance(hello, ServerHello)
            fields = {f: getattr(hello, f) for f in hello.__slots__}
            fields["part_id"] = int(os.environ["PART"])
            frame = encode_handshake(ServerHello(**fields))
        client.sendall(frame)
        answer = read_frame(client)
        if not answer:
            return report
        upstream.sendall(answer)
        verdict = read_frame(upstream)
        if not verdict:
            return report
        result = decode_handshake(verdict[4:])
        report["session"] = isinstance(result, HelloResult) and result.ok
        client.sendall(verdict)
        if report["session"]:  # use it: the relay's own request on the server's session
            upstream.sendall(b"".join(bytes(p) for p in encode_message(Request(1 << 30, "info", {}))))
            upstream.settimeout(5)
            report["answered"] = bool(read_frame(upstream))
    return report


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    target = None
    if len(sys.argv) > 3:
        host, _, tport = sys.argv[3].rpartition(":")
        target = (host, int(tport))
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        print("listening", flush=True)
        listener.settimeout(30)
        while True:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                return
            with client:
                client.settimeout(5)
                try:
                    report = relay_one(client, mode, target)
                except OSError as exc:
                    report = {"session": False, "answered": False, "requests_seen": 0, "error": str(exc)}
            print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
