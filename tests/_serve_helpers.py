"""A ``python -m asyncgraph.serve`` process for the serving tests (started and stopped by PID)."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from asyncgraph.launch.lifeline import die_with_parent
from asyncgraph.testing import subprocess_env


class ServeProcess:
    """One ``python -m asyncgraph.serve`` started by a test (stopped by its PID)."""

    def __init__(self, workdir: Path, args: list[str]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ready_file = workdir / "serve-ready.json"
        self.log = workdir / "serve.log"
        argv = [sys.executable, "-m", "asyncgraph.serve", "--port", "0", "--ready-file", str(self.ready_file)]
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [*argv, *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=subprocess_env(),
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        end = time.monotonic() + 180
        while not self.ready_file.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"serve process not ready:\n{self.log.read_text(errors='replace')}")
            time.sleep(0.1)
        ready = json.loads(self.ready_file.read_text())
        self.port = int(ready["port"])
        self.msgpack_port = ready["msgpack_port"]

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, json.loads(data) if "json" in ctype else data.decode()

    def infer(
        self, nodes: list[Any], datatype: str = "INT64", model: str = "sage", **extra: Any
    ) -> tuple[int, Any]:
        body = {
            "inputs": [{"name": "nodes", "datatype": datatype, "shape": [len(nodes)], "data": nodes}],
            **extra,
        }
        return self.request("POST", f"/v2/models/{model}/infer", json.dumps(body).encode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
