"""``python -m asyncgraph.launch.health`` against a real server: ok, wrong secret, nothing listening."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from asyncgraph.launch.processes import free_port
from asyncgraph.testing import PACKAGE_ROOT as ROOT
from asyncgraph.testing import start_servers


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncgraph.launch.health", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_health_probe(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    group = start_servers(cora2.part_config, tmp_path / "srv", num_parts=1, secret=b"s3cret")
    try:
        host, port = group.addresses[0]
        good = tmp_path / "good"
        good.write_text("s3cret\n")  # trailing newline stripped, as the server does
        bad = tmp_path / "bad"
        bad.write_text("wrong")
        ok = probe("--host", host, "--port", str(port), "--secret-file", str(good))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.startswith(f"ok {host}:{port} graph=cora part=0 rtt=") and ok.stdout.count("\n") == 1
        denied = probe("--host", host, "--port", str(port), "--secret-file", str(bad))
        assert denied.returncode == 1 and denied.stdout.startswith(f"fail {host}:{port}: ")
        assert denied.stdout.count("\n") == 1 and not denied.stderr
        missing = probe("--host", host, "--port", str(port))  # the server requires a secret
        assert missing.returncode == 1 and "secret" in missing.stdout
    finally:
        group.stop()
    closed = probe("--port", str(free_port()), "--timeout", "2")
    assert closed.returncode == 1 and closed.stdout.startswith("fail 127.0.0.1:") and not closed.stderr
