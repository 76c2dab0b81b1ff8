"""ops/systemd: the templated server unit parses, verifies, and has the settings it promises."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "ops" / "systemd" / "asyncgraph-server@.service"
ENV_FILE = ROOT / "ops" / "systemd" / "server.env"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's syntax: sections, repeated keys, backslash continuations, # comments."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    logical = text.replace("\\\n", " ")
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(" ".join(value.split()))
    return sections


def test_unit_settings() -> None:
    unit = parse_unit(UNIT.read_text())
    service = unit["Service"]
    one = {k: v[-1] for k, v in service.items()}
    assert one["Restart"] == "on-failure"
    assert one["LoadCredential"] == "secret:/etc/asyncgraph/secret"
    assert service["EnvironmentFile"] == ["/etc/asyncgraph/server.env", "-/etc/asyncgraph/server-%i.env"]
    exec_start = one["ExecStart"].split()
    assert exec_start[1:3] == ["-m", "asyncgraph.server"]
    args = dict(zip(exec_start[3::2], exec_start[4::2], strict=False))
    assert args["--part-id"] == "%i"  # instance = partition id
    assert args["--secret-file"] == "%d/secret"  # %d = $CREDENTIALS_DIRECTORY
    for name in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "RestrictNamespaces"):
        assert one[name] == "yes", name
    assert one["ProtectSystem"] == "strict"
    assert one["LimitNOFILE"] and one["MemoryMax"] and one["TasksMax"]
    # memfd shared memory is passed over abstract Unix sockets: they need the host's network
    # namespace and AF_UNIX
    assert "PrivateNetwork" not in service
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "MemoryDenyWriteExecute" not in service
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_env_file_sets_every_variable_the_unit_uses() -> None:
    used = {
        word.strip("${}")
        for word in parse_unit(UNIT.read_text())["Service"]["ExecStart"][0].split()
        if word.startswith("$")
    }
    defined = {
        line.split("=", 1)[0]
        for line in ENV_FILE.read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert used == defined


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    # verify checks that ExecStart's program exists: point it at this interpreter
    text = UNIT.read_text().replace("/opt/asyncgraph/venv/bin/python", sys.executable)
    (tmp_path / UNIT.name).write_text(text)
    done = subprocess.run(
        [analyze, "verify", str(tmp_path / "asyncgraph-server@0.service")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # unknown keys and bad values are only warnings: none allowed
