"""The stager under a hostile partitioning (issue 32, item 17): real ``python -m asyncgraph.launch.stage``
runs on loopback copies. Paths that leave the partitioning and links inside it are refused with
exit status 2 before anything is copied; nothing is written under ``--dest`` or beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncgraph.testing import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"


@pytest.fixture(scope="module")
def cora2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    out = tmp_path_factory.mktemp("cora2") / "out"
    partition_graph(Graph.from_npz(ROOT / "examples/data/cora.npz"), "cora", 2, out, part_method="random")
    return out / "cora.json"


@pytest.fixture
def src(cora2: Path, tmp_path: Path) -> Path:
    """A private copy at ``tmp_path/a/b/src`` (deep, so ``../..`` stays inside tmp_path)."""
    shutil.copytree(cora2.parent, tmp_path / "a" / "b" / "src")
    (tmp_path / "id_ed25519").write_text(KEY)
    return tmp_path / "a" / "b" / "src" / "cora.json"


def stage(src: Path, tmp_path: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    ips = tmp_path / "ip_config.txt"
    ips.write_text("127.0.0.1 30050\n127.0.0.1 30051\n")
    argv = ["--part-config", str(src), "--ip-config", str(ips), "--dest", str(dest)]
    return subprocess.run([sys.executable, "-m", "asyncgraph.launch.stage", *argv], capture_output=True,
                          text=True, timeout=120, env=subprocess_env(), check=False)  # fmt: skip


def leaked(tmp_path: Path) -> list[Path]:
    """Copies of the key anywhere under tmp_path but the original."""
    return [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "id_ed25519" and KEY in p.read_text(
        errors="replace")]  # fmt: skip


def test_ip_config_errors_do_not_quote_the_file(src: Path, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\n")
    argv = ["--part-config", str(src), "--ip-config", str(shadow), "--dest", str(tmp_path / "d")]
    res = subprocess.run([sys.executable, "-m", "asyncgraph.launch.stage", *argv], capture_output=True,
                         text=True, timeout=120, env=subprocess_env(), check=False)  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{shadow} line 1: the host (field 1) is neither an IP address nor a host name" in res.stderr
    assert "SECRETHASH" not in res.stderr and not (tmp_path / "d").exists()


@pytest.mark.parametrize("field", ["orig_nids", "orig_eids"])
def test_mapping_file_outside_the_partitioning_is_refused(field: str, src: Path, tmp_path: Path) -> None:
    doc = json.loads(src.read_text())
    doc[field] = "../../../id_ed25519"
    src.write_text(json.dumps(doc))
    dest = tmp_path / "d" / "x" / "y" / "z"
    res = stage(src, tmp_path, dest)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "the ID mapping file '../../../id_ed25519' is not a plain relative path" in res.stderr
    assert not (tmp_path / "d").exists() and leaked(tmp_path) == []


@pytest.mark.parametrize("where", ["part1/node_feat/id_ed25519", "part0/leak", "part1"])
def test_link_inside_a_partition_folder_is_refused(where: str, src: Path, tmp_path: Path) -> None:
    link = src.parent / where
    if where == "part1":  # the partition folder itself a link (to a copy of the real one)
        shutil.move(link, tmp_path / "elsewhere")
        (tmp_path / "elsewhere" / "id_ed25519").write_text(KEY)
        link.symlink_to(tmp_path / "elsewhere")
    elif where == "part0/leak":  # a link to a folder
        (tmp_path / "ssh").mkdir()
        (tmp_path / "ssh" / "id").write_text(KEY)
        link.symlink_to(tmp_path / "ssh")
    else:
        link.symlink_to(tmp_path / "id_ed25519")
    dest = tmp_path / "d"
    res = stage(src, tmp_path, dest)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert f"{link} is a symbolic link; stage copies regular files only" in res.stderr
    assert not dest.exists()
    assert [p for p in leaked(tmp_path) if "elsewhere" not in str(p) and p.parent.name != "ssh"] == []
