"""A refused or timed-out handshake is reported once, as the caller's exception: neither side
also prints asyncio's "Future exception was never retrieved" (or any traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from asyncgraph.testing import PACKAGE_ROOT, start_servers, subprocess_env

WORKER = Path(__file__).resolve().parent / "workers" / "auth_failures.py"


def test_auth_failure_prints_no_unretrieved_future(cora2, tmp_path: Path) -> None:
    group = start_servers(cora2.part_config, tmp_path / "srv", num_parts=2, secret=b"right")
    try:
        servers = ",".join(f"{h}:{p}" for h, p in group.addresses)
        proc = subprocess.run(
            [sys.executable, str(WORKER), servers, str(group.ip_config())],
            capture_output=True,
            text=True,
            timeout=120,
            env=subprocess_env(),
            cwd=PACKAGE_ROOT,
        )
    finally:
        group.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("refused:") == 5 and proc.stdout.count("timed out:") == 1, proc.stdout
    assert "never retrieved" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for i in range(2):
        log = group.log_text(i)
        assert "reason=auth" in log  # the server saw the refusals...
        assert "never retrieved" not in log and "Traceback" not in log, log  # ...and said it once
