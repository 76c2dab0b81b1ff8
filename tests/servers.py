"""Start real server processes on ephemeral loopback ports for tests (and benchmarks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ServerGroup:
    """Server processes this test started, one per partition, and their addresses."""

    procs: list[subprocess.Popen[bytes]]
    addresses: list[tuple[str, int]]
    workdir: Path
    secret: bytes | None = None
    logs: list[Path] = field(default_factory=list)

    def ip_config(self) -> Path:
        path = self.workdir / "ip_config.txt"
        path.write_text("".join(f"{h} {p}\n" for h, p in self.addresses))
        return path

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[index]
        if proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def log_text(self, index: int) -> str:
        return self.logs[index].read_text(errors="replace")


def start_servers(
    part_config: Path,
    workdir: Path,
    *,
    num_parts: int,
    num_clients: int = 1,
    secret: bytes | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 60.0,
) -> ServerGroup:
    """Start one server per partition and wait until each has written its ready file."""
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    ready_files: list[Path] = []
    logs: list[Path] = []
    secret_args: list[str] = []
    if secret is not None:
        secret_file = workdir / "secret"
        secret_file.write_bytes(secret)
        secret_args = ["--secret-file", str(secret_file)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for part_id in range(num_parts):
        ready = workdir / f"ready{part_id}.json"
        ready.unlink(missing_ok=True)
        log = workdir / f"server{part_id}.log"
        ready_files.append(ready)
        logs.append(log)
        cmd = [
            sys.executable,
            "-m",
            "asyncgraph.server",
            "--part-config",
            str(part_config),
            "--part-id",
            str(part_id),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--num-clients",
            str(num_clients),
            "--ready-file",
            str(ready),
            *secret_args,
            *(extra_args or []),
        ]
        with open(log, "wb") as fh:
            procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env))
    group = ServerGroup(procs, [], workdir, secret, logs)
    deadline = time.monotonic() + timeout
    try:
        for proc, ready, log in zip(procs, ready_files, logs, strict=True):
            while not ready.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready after {timeout} s:\n{log.read_text()}")
                time.sleep(0.01)
            info = json.loads(ready.read_text())
            group.addresses.append((info["host"], int(info["port"])))
    except BaseException:
        group.stop()
        raise
    return group


def shm_entries() -> set[str]:
    """Entries in /dev/shm that look like ours (there should never be any: we use memfds)."""
    try:
        return {name for name in os.listdir("/dev/shm") if "asyncgraph" in name}
    except FileNotFoundError:
        return set()
