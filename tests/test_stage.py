"""``python -m asyncgraph.launch.stage``: real partitions of Cora, local copies, and a fake remote host.

The fake host is a pair of scripts on PATH standing in for ``ssh`` and ``rsync``: they run the
command on this machine with every path under ``--dest`` moved into ``<sandbox>/<host>``, so
the remote code path (mkdir and ``sha256sum`` over ssh, rsync of each folder) runs for real
against a separate folder per host. No network, no sshd.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from asyncgraph.client.ipconfig import IpConfig
from asyncgraph.launch import stage as stage_mod
from asyncgraph.partition.config import PartitionConfig

ROOT = Path(__file__).resolve().parent.parent
MAPPINGS = ("orig_nids.npy", "orig_eids.npy")  # ID mapping files written beside the config


@pytest.fixture(scope="module")
def cora3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cora in 3 random partitions (quick), as conftest's helpers partition it."""
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    out = tmp_path_factory.mktemp("cora3") / "out"
    partition_graph(Graph.from_npz(ROOT / "examples/data/cora.npz"), "cora", 3, out, part_method="random")
    return out / "cora.json"


@pytest.fixture
def src(cora3: Path, tmp_path: Path) -> Path:
    """A private copy of the partitioned graph (tests corrupt and delete files)."""
    shutil.copytree(cora3.parent, tmp_path / "src")
    return tmp_path / "src" / "cora.json"


def ip_config(tmp_path: Path, hosts: list[str]) -> Path:
    path = tmp_path / "ip_config.txt"
    path.write_text("".join(f"{h} {30050 + i}\n" for i, h in enumerate(hosts)))
    return path


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncgraph.launch.stage", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


# --- planning ----------------------------------------------------------------------------------
def test_plan_gives_each_host_only_its_partitions(cora3: Path) -> None:
    config = PartitionConfig.load(cora3)
    ips = IpConfig.parse("node-a 1\nnode-b 2\nnode-a 3\n")
    plans = {p.host: p for p in stage_mod.plan(config, ips)}
    assert plans["node-a"].part_ids == (0, 2) and plans["node-a"].part_paths == ("part0", "part2")
    assert plans["node-b"].part_ids == (1,) and plans["node-b"].part_paths == ("part1",)
    assert not plans["node-a"].local
    assert stage_mod.is_local_host("127.0.0.1") and stage_mod.is_local_host("::1")
    assert stage_mod.is_local_host("localhost")


# --- local -------------------------------------------------------------------------------------
def test_local_staging_copies_and_verifies(src: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    done = run_cli(
        "--part-config",
        str(src),
        "--ip-config",
        str(ip_config(tmp_path, ["127.0.0.1"] * 3)),
        "--dest",
        str(dest),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("127.0.0.1: partitions 0,1,2 staged to")
    # exactly the source tree plus the manifest, byte for byte
    manifest = src.parent / "cora.sha256"
    assert files_under(dest) == files_under(src.parent)
    lines = manifest.read_text().splitlines()
    assert len(lines) == len(files_under(src.parent)) - 1  # every file but the manifest itself
    # the manifest is in sha256sum's format and holds at the destination
    check = subprocess.run(["sha256sum", "-c", "--quiet", "cora.sha256"], cwd=dest, capture_output=True)
    assert check.returncode == 0, check.stdout
    for name in files_under(src.parent):
        assert (dest / name).read_bytes() == (src.parent / name).read_bytes()
    # the staged copy serves: PartitionConfig resolves the partitions under dest
    config = PartitionConfig.load(dest / "cora.json")
    assert config.part_dir(dest / "cora.json", 1) == (dest / "part1").resolve()


def test_corrupted_local_copy_is_detected(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_copytree = shutil.copytree

    def corrupting_copytree(s: Path, d: Path, **kw: object) -> object:
        result = real_copytree(s, d, **kw)  # type: ignore[arg-type]
        victim = Path(d) / "node_feat" / "feat.npy"
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0xFF  # one flipped bit-pattern in the last byte, size unchanged
        victim.write_bytes(bytes(data))
        return result

    # Only stage.py's view of shutil (copytree recurses through the real module).
    fake_shutil = SimpleNamespace(copytree=corrupting_copytree, copy2=shutil.copy2, which=shutil.which)
    monkeypatch.setattr(stage_mod, "shutil", fake_shutil)
    status = stage_mod.main(
        ["--part-config", str(src), "--ip-config", str(ip_config(tmp_path, ["127.0.0.1"] * 3)),
         "--dest", str(tmp_path / "dest")]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and "checksum mismatch for part0/node_feat/feat.npy" in err


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("missing_file", "part1/node_feat/label.npy is missing"),
        ("missing_folder", "partition 2's folder"),
        ("bad_json", "is invalid"),
        ("not_json", "is invalid"),
        ("no_config", "does not exist"),
        ("short_ip_config", "lists 2 servers for 3 partitions"),
        ("escaping_path", "not a plain relative folder"),
    ],
)
def test_bad_input_is_one_line_and_status_2(src: Path, tmp_path: Path, breakage: str, message: str) -> None:
    hosts = ["127.0.0.1"] * 3
    config = src
    if breakage == "missing_file":
        (src.parent / "part1" / "node_feat" / "label.npy").unlink()
    elif breakage == "missing_folder":
        shutil.rmtree(src.parent / "part2")
    elif breakage == "bad_json":
        doc = json.loads(src.read_text())
        del doc["num_parts"]
        src.write_text(json.dumps(doc))
    elif breakage == "not_json":
        src.write_text("{not json")
    elif breakage == "no_config":
        config = src.parent / "nope.json"
    elif breakage == "short_ip_config":
        hosts = hosts[:2]
    elif breakage == "escaping_path":
        doc = json.loads(src.read_text())
        doc["parts"][0]["path"] = "../elsewhere"
        src.write_text(json.dumps(doc))
    done = run_cli(
        "--part-config",
        str(config),
        "--ip-config",
        str(ip_config(tmp_path, hosts)),
        "--dest",
        str(tmp_path / "d"),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert message in done.stderr
    assert not (tmp_path / "d").exists()  # nothing copied before the input was checked


# --- remote (dry run and a fake host) ----------------------------------------------------------
def test_dry_run_prints_ssh_and_rsync_for_remote_hosts_only(src: Path, tmp_path: Path) -> None:
    ips = ip_config(tmp_path, ["127.0.0.1", "10.1.2.3", "node-b"])
    done = run_cli(
        "--part-config", str(src), "--ip-config", str(ips), "--dest", "/local/graphs",
        "--ssh-user", "alice", "--transfer", "rsync", "--dry-run",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert any(line.startswith("# 127.0.0.1 is this machine") and "part0" in line for line in lines)
    rsyncs = [c for c in commands if c[0] == "rsync"]
    # part1 -> 10.1.2.3 only, part2 -> node-b only, the config and the manifest to both
    assert [c[-2:] for c in rsyncs] == [
        [f"{src.parent}/part1/", "alice@10.1.2.3:/local/graphs/part1/"],
        [str(src), "alice@10.1.2.3:/local/graphs/cora.json"],
        [str(src.parent / "cora.sha256"), "alice@10.1.2.3:/local/graphs/cora.sha256"],
        [str(src.parent / "orig_nids.npy"), "alice@10.1.2.3:/local/graphs/orig_nids.npy"],
        [str(src.parent / "orig_eids.npy"), "alice@10.1.2.3:/local/graphs/orig_eids.npy"],
        [f"{src.parent}/part2/", "alice@node-b:/local/graphs/part2/"],
        [str(src), "alice@node-b:/local/graphs/cora.json"],
        [str(src.parent / "cora.sha256"), "alice@node-b:/local/graphs/cora.sha256"],
        [str(src.parent / "orig_nids.npy"), "alice@node-b:/local/graphs/orig_nids.npy"],
        [str(src.parent / "orig_eids.npy"), "alice@node-b:/local/graphs/orig_eids.npy"],
    ]
    assert all(c[c.index("-e") + 1].startswith("ssh -o BatchMode=yes") for c in rsyncs)
    sshs = [c for c in commands if c[0] == "ssh"]
    assert [c[5] for c in sshs] == ["alice@10.1.2.3"] * 2 + ["alice@node-b"] * 2
    assert sshs[0][6].startswith("mkdir -p -- /local/graphs /local/graphs/part1")
    verify = sshs[1][6]
    assert verify.startswith("cd /local/graphs && sha256sum -- cora.json " + " ".join(MAPPINGS) + " part1/")
    assert "part0/" not in verify and "part2/" not in verify
    assert not (src.parent / "cora.sha256").exists()  # a dry run writes nothing

    scp = run_cli(
        "--part-config", str(src), "--ip-config", str(ips), "--dest", "/local/graphs",
        "--transfer", "scp", "--dry-run",
    )  # fmt: skip
    scps = [shlex.split(line) for line in scp.stdout.splitlines() if line.startswith("scp")]
    assert scps[0][-3:] == ["-r", f"{src.parent}/part1", "10.1.2.3:/local/graphs"]


FAKE_SSH = """\
#!{python}
# Fake ssh: run the command here with every path under DEST moved into SANDBOX/<host>.
import os, subprocess, sys
args = sys.argv[1:]
while args and args[0] == "-o":
    args = args[2:]
target, command = args[0], args[1]
host = target.split("@")[-1]
dest, sandbox = os.environ["FAKE_DEST"], os.environ["FAKE_SANDBOX"]
command = command.replace(dest, os.path.join(sandbox, host) + dest)
with open(os.path.join(sandbox, "log"), "a") as log:
    log.write(f"ssh {{target}} {{command}}\\n")
sys.exit(subprocess.run(["sh", "-c", command]).returncode)
"""

FAKE_RSYNC = """\
#!{python}
# Fake rsync SRC [user@]host:PATH: copy into SANDBOX/<host>/PATH; FAKE_CORRUPT=name flips a byte.
import os, shutil, sys
source, remote = sys.argv[-2], sys.argv[-1]
host, path = remote.split("@")[-1].split(":", 1)
target = os.path.join(os.environ["FAKE_SANDBOX"], host) + path
with open(os.path.join(os.environ["FAKE_SANDBOX"], "log"), "a") as log:
    log.write(f"rsync {{source}} {{remote}}\\n")
if os.path.isdir(source):
    shutil.copytree(source, target, dirs_exist_ok=True)
else:
    shutil.copy2(source, target)
victim = os.environ.get("FAKE_CORRUPT", "")
for root, _, names in os.walk(target if os.path.isdir(source) else os.path.dirname(target)):
    for name in names:
        if os.path.join(root, name).endswith(victim) and victim:
            with open(os.path.join(root, name), "r+b") as fh:
                fh.seek(0); b = fh.read(1); fh.seek(0); fh.write(bytes([b[0] ^ 1]))
"""


@pytest.fixture
def fake_remote(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir, sandbox = tmp_path / "bin", tmp_path / "sandbox"
    bin_dir.mkdir()
    sandbox.mkdir()
    for name, text in (("ssh", FAKE_SSH), ("rsync", FAKE_RSYNC)):
        script = bin_dir / name
        script.write_text(textwrap.dedent(text).format(python=sys.executable))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SANDBOX": str(sandbox)}
    return env, sandbox


def test_remote_path_stages_only_served_partitions_and_verifies(
    src: Path, tmp_path: Path, fake_remote: tuple[dict[str, str], Path]
) -> None:
    env, sandbox = fake_remote
    dest = tmp_path / "local-dest"
    env["FAKE_DEST"] = str(dest)
    ips = ip_config(tmp_path, ["127.0.0.1", "node-b", "node-c"])
    args = ["--part-config", str(src), "--ip-config", str(ips), "--dest", str(dest), "--transfer", "rsync"]
    done = run_cli(*args, env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    log = (sandbox / "log").read_text()
    assert "sha256sum --" in log  # the checksums were recomputed on the (fake) remote side
    for host, part in (("node-b", "part1"), ("node-c", "part2")):
        staged = files_under(sandbox / host / str(dest).lstrip("/"))
        expected = {n for n in files_under(src.parent) if n.startswith(f"{part}/")}
        assert staged == expected | {"cora.json", "cora.sha256", *MAPPINGS}, host
    local = files_under(dest)
    assert {n.split("/")[0] for n in local} == {"part0", "cora.json", "cora.sha256", *MAPPINGS}

    env["FAKE_CORRUPT"] = "indices.npy"
    bad = run_cli(*args, env=env)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "node-b: checksum mismatch for part1/indices.npy" in bad.stderr


def test_failed_remote_copy_is_status_1(src: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("ssh", "rsync"):
        (bin_dir / name).write_text("#!/bin/sh\necho 'connection refused' >&2\nexit 255\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ips = ip_config(tmp_path, ["node-x"] * 3)
    done = run_cli(
        "--part-config", str(src), "--ip-config", str(ips), "--dest", "/x", "--transfer", "rsync", env=env
    )
    assert done.returncode == 1
    assert done.stderr == "stage: node-x: creating /x failed: connection refused\n"
