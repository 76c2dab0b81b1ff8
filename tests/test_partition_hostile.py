"""Hostile input to the out-of-core partitioner (issue 32, C and D): real CLI runs in tmp_path.

Each bad input is one ``error:`` line naming the file (and the position, never the bytes found
there), exit status 2 and nothing written: no output, no work folder, nothing outside ``--out``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.partition.chunked_write import write_chunked
from asyncgraph.partition.graph import Graph
from asyncgraph.testing import subprocess_env

PROG = "python -m asyncgraph.partition: error: "
SECRET = "root:$6$SECRETHASHxyz:19000:0:99999:7:::"


def _graph(n: int = 200, e: int = 1000, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    feat = rng.standard_normal((n, 4)).astype(np.float32)
    label = rng.integers(0, 5, n)
    return Graph(n, src, dst, {"feat": feat, "label": label}, {"w": rng.random(e).astype(np.float32)})


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A small chunked graph (csv edges) in ``tmp_path/in``; returns its metadata.json."""
    return write_chunked(_graph(), tmp_path / "in", 2, "csv", "g")


def cli(meta: Path, out: Path, *extra: str, env: dict[str, str] | None = None,
        script: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = ["--input", str(meta), "--num-parts", "2", "--method", "random", "--out", str(out),
            "--workers", "1", "--memory-limit", "1GiB", *extra]  # fmt: skip
    head = [sys.executable, *(["-m", "asyncgraph.partition"] if script is None else ["-c", script])]
    return subprocess.run([*head, *argv], capture_output=True, text=True, timeout=120,
                          env={**subprocess_env(), **(env or {})}, check=False)  # fmt: skip


def one_error(res: subprocess.CompletedProcess[str], pattern: str) -> str:
    """Exit 2 and exactly one error line, the last, matching ``pattern``; returns it."""
    lines = res.stderr.strip().splitlines()
    errors = [x for x in lines if "error" in x]
    assert res.returncode == 2, res.stderr
    assert len(errors) == 1 and errors[0] == lines[-1] and errors[0].startswith(PROG), lines
    assert re.search(pattern, errors[0]), errors[0]
    assert "Traceback" not in res.stderr
    return errors[0]


def edit_meta(meta: Path, fn: Any) -> None:
    doc = json.loads(meta.read_text())
    fn(doc)
    meta.write_text(json.dumps(doc))


def only(tmp_path: Path, *names: str) -> None:
    """Nothing but ``names`` in ``tmp_path``: no output, no work folder, nothing escaped."""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


# --- 12: tensor and type names are file names -----------------------------------------------------
BAD_NAMES = {
    "parent indices": "../indices",
    "escape": "../../../../escape/x",
    "slash": "a/b",
    "hidden": ".hidden",
    "dotdot": "..",
    "reserved": "indices",
    "reserved type": "_TYPE",
    "nul": "a\x00b",
    "newline": "a\nb",
    "long": "x" * 300,
}


@pytest.mark.parametrize("case", sorted(BAD_NAMES))
def test_unsafe_tensor_name_refused_nothing_written(case: str, src: Path, tmp_path: Path) -> None:
    name = BAD_NAMES[case]
    edit_meta(src, lambda m: m["node_data"]["_N"].__setitem__(name, m["node_data"]["_N"].pop("feat")))
    res = cli(src, tmp_path / "o")
    one_error(res, r"metadata\.json: node_data\['_N'\] tensor name .* (not a safe file name|reserved|longer)")
    only(tmp_path, "in")
    assert not (tmp_path.parent / "escape").exists()


@pytest.mark.parametrize("where", ["node_type", "relation"])
def test_unsafe_type_name_refused(where: str, src: Path, tmp_path: Path) -> None:
    def rename(m: dict[str, Any]) -> None:
        if where == "node_type":
            text = json.dumps(m).replace('"_N', '"../x')
        else:
            text = json.dumps(m).replace(":_E:", ":../e:")
        m.clear()
        m.update(json.loads(text))

    edit_meta(src, rename)
    pattern = r"metadata\.json: (node type|relation) '\.\./.*' is not a safe file name"
    one_error(cli(src, tmp_path / "o"), pattern)
    only(tmp_path, "in")


# --- 14: duplicates ------------------------------------------------------------------------------
def test_duplicate_node_type_refused(src: Path, tmp_path: Path) -> None:
    def dup(m: dict[str, Any]) -> None:
        m["node_type"] = ["_N", "_N"]
        m["num_nodes_per_chunk"] = m["num_nodes_per_chunk"] * 2

    edit_meta(src, dup)
    one_error(cli(src, tmp_path / "o"), r"metadata\.json: node type '_N' is listed twice")
    only(tmp_path, "in")


def test_duplicate_edge_type_refused(src: Path, tmp_path: Path) -> None:
    def dup(m: dict[str, Any]) -> None:
        m["edge_type"] = m["edge_type"] * 2
        m["num_edges_per_chunk"] = m["num_edges_per_chunk"] * 2

    edit_meta(src, dup)
    one_error(cli(src, tmp_path / "o"), r"metadata\.json: edge type '_N:_E:_N' is listed twice")
    only(tmp_path, "in")


def test_duplicate_json_key_refused(src: Path, tmp_path: Path) -> None:
    text = src.read_text()
    src.write_text(text.replace('"node_data": {', '"node_data": {"_N": {}, ', 1))
    one_error(cli(src, tmp_path / "o"), r"metadata\.json: not valid metadata \(key '_N' appears twice")
    only(tmp_path, "in")


def test_huge_metadata_is_not_read(src: Path, tmp_path: Path) -> None:
    with open(src, "r+b") as f:  # a sparse 65 MiB metadata.json: refused by its size
        f.truncate(65 << 20)
    one_error(cli(src, tmp_path / "o"), r"metadata\.json: is 68157440 bytes, over the 67108864 read")
    only(tmp_path, "in")


# --- 13: big-endian chunks -----------------------------------------------------------------------
def test_big_endian_chunks_keep_their_values(tmp_path: Path) -> None:
    g = _graph()
    native = write_chunked(g, tmp_path / "native", 2, "numpy", "g")
    big = write_chunked(g, tmp_path / "big", 2, "numpy", "g")
    for f in [*(big.parent / "node_data").glob("*.npy"), *(big.parent / "edge_data").glob("*.npy"),
              *(big.parent / "edges").glob("*.npy")]:  # fmt: skip
        arr = np.load(f)
        np.save(f, arr.astype(arr.dtype.newbyteorder(">")))
        assert np.load(f).dtype.byteorder == ">"
    for meta, out in ((native, "a"), (big, "b")):
        res = cli(meta, tmp_path / out)
        assert res.returncode == 0, res.stderr
    files = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert "part0/node_feat/feat.npy" in files
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


# --- 18: errors name the file and position, never its bytes --------------------------------------
def test_csv_chunk_error_names_line_not_content(src: Path, tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n" + "x y\n" * 3)
    edit_meta(src, lambda m: m["edges"]["_N:_E:_N"]["data"].__setitem__(0, str(secret)))
    err = one_error(cli(src, tmp_path / "o"), r"shadow: line 1: expected two IDs, found 1 fields")
    assert "SECRETHASH" not in err and "$6$" not in err
    only(tmp_path, "in", "shadow")


def test_npy_header_error_does_not_quote_it(src: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.npy"
    header = "{'descr': '" + SECRET + "', 'fortran_order': False, 'shape': (100,), }"
    bad.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    edit_meta(src, lambda m: m["node_data"]["_N"]["feat"]["data"].__setitem__(0, str(bad)))
    err = one_error(cli(src, tmp_path / "o"), r"bad\.npy: not a readable \.npy file")
    assert "SECRET" not in err
    only(tmp_path, "in", "bad.npy")


# --- 10: the memory limit holds on any input -----------------------------------------------------
MAXRSS = (  # VmHWM: this process's peak RSS (ru_maxrss would carry the forking parent's over exec)
    "import re, sys\n"
    "from asyncgraph.partition.__main__ import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]\n"
    "print('maxrss', hwm, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _maxrss(res: subprocess.CompletedProcess[str]) -> int:
    m = re.search(r"^maxrss (\d+)$", res.stderr, re.M)
    assert m, res.stderr
    return int(m[1]) * 1024


def test_csv_line_longer_than_a_line_is_refused_in_bounded_memory(src: Path, tmp_path: Path) -> None:
    """A 64 MiB line (digits, no newline): refused where it is seen, not buffered whole."""
    ok = cli(src, tmp_path / "ok", "--memory-limit", "256MiB", script=MAXRSS)
    assert ok.returncode == 0, ok.stderr
    shutil.rmtree(tmp_path / "ok")
    chunk = src.parent / json.loads(src.read_text())["edges"]["_N:_E:_N"]["data"][1]
    with open(chunk, "ab") as f:
        for _ in range(64):
            f.write(b"1" * (1 << 20))
    res = cli(src, tmp_path / "o", "--memory-limit", "256MiB", script=MAXRSS)
    err = [x for x in res.stderr.splitlines() if "error" in x]
    assert res.returncode == 2 and len(err) == 1, res.stderr[-2000:]
    assert re.search(r"-1\.csv: line 501 is longer than 4096 bytes", err[0]), err
    assert len(err[0]) < 1000
    assert _maxrss(res) < _maxrss(ok) + (32 << 20), (_maxrss(res), _maxrss(ok))
    only(tmp_path, "in")


def test_feature_row_larger_than_the_limit_allows_exit_2_before_reading(src: Path, tmp_path: Path) -> None:
    """Two 48 MiB rows (a sparse file) at a 256 MiB limit: refused before anything is read."""
    big = tmp_path / "in" / "node_data" / "big.npy"
    with open(big, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (200, 12 << 20)}
        )
        f.truncate(f.tell() + 200 * (48 << 20))

    def add(m: dict[str, Any]) -> None:
        m["node_data"]["_N"]["big"] = {"format": {"name": "numpy"}, "data": ["node_data/big.npy"]}

    edit_meta(src, add)
    res = cli(src, tmp_path / "o", "--memory-limit", "256MiB")
    one_error(res, r"node data _N/big: one row is 48\.00 MiB .* raise --memory-limit to at least")
    only(tmp_path, "in")


OVERSHOOT = (  # the last stage touches 256 MiB more, over a 192 MiB limit, for 0.5 s
    "import sys, time\n"
    "import numpy as np\n"
    "import asyncgraph.partition.stream as s\n"
    "real = s.finalize\n"
    "def hungry(*a, **k):\n"
    "    real(*a, **k)\n"
    "    block = np.ones(256 << 20, dtype=np.uint8)\n"
    "    time.sleep(0.5)\n"
    "    del block\n"
    "s.finalize = hungry\n"
    "from asyncgraph.partition.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_a_run_whose_measured_peak_passed_the_limit_fails_and_leaves_nothing(
    src: Path, tmp_path: Path
) -> None:
    """The catch-all of item 10: whatever the plan missed, a run whose sampled peak went over
    ``--memory-limit`` exits 2 naming the peak and the limit, and its output is not put in place."""
    fine = cli(src, tmp_path / "fine", "--memory-limit", "192MiB")
    assert fine.returncode == 0, fine.stderr  # the same run without the overshoot is within it
    shutil.rmtree(tmp_path / "fine")
    res = cli(src, tmp_path / "o", "--memory-limit", "192MiB", script=OVERSHOOT)
    line = one_error(res, r"peak memory of ([\d.]+) MiB .* over the --memory-limit of 192\.00 MiB")
    peak = float(re.search(r"peak memory of ([\d.]+) MiB", line)[1])  # type: ignore[index]
    assert peak > 256, line
    only(tmp_path, "in")


# --- 15: a run that exits 2 leaves nothing ------------------------------------------------------
BREAK_FINALIZE = (
    "import sys\n"
    "import asyncgraph.partition.stream as s\n"
    "real = s.finalize\n"
    "def broken(ctx, *a, **k):\n"
    "    real(ctx, *a, **k)\n"
    "    f = ctx.pdir(1) / 'node_feat' / 'feat.npy'\n"
    "    f.write_bytes(f.read_bytes()[:-16])  # a part file that disagrees with the config\n"
    "s.finalize = broken\n"
    "from asyncgraph.partition.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_failed_validation_leaves_no_output(src: Path, tmp_path: Path) -> None:
    res = cli(src, tmp_path / "o", script=BREAK_FINALIZE)
    one_error(res, r"part1/node_feat/feat\.npy")
    only(tmp_path, "in")


# --- 16: --resume verifies its work folder -------------------------------------------------------
def _killed_after(stage: str, src: Path, out: Path) -> Path:
    res = cli(src, out, env={"ASYNCGRAPH_PARTITION_KILL_AFTER": stage})
    assert res.returncode == -9, res.stderr
    work = out.parent / f".{out.name}.work"
    assert work.is_dir() and not out.exists()
    return work


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _bounds(work: Path) -> None:
    doc = json.loads((work / "state.json").read_text())
    doc["state"]["node_bounds"] = [0, 1 << 40, 1 << 41]
    (work / "state.json").write_text(json.dumps(doc))


def _swap_new_id(work: Path) -> None:
    arr = np.load(work / "new_id.npy")
    arr[[0, 1]] = arr[[1, 0]]
    with open(work / "new_id.npy", "r+b") as f:  # same size, same header
        f.seek(-arr.nbytes, os.SEEK_END)
        f.write(arr.tobytes())


TAMPER: dict[str, tuple[str, Any, str]] = {
    "state bounds": ("shuffle", _bounds, r"state\.json does not match its checksum"),
    "spill byte": ("shuffle", lambda w: _flip(sorted((w / "spill" / "p0").glob("*.bin"))[0], 5),
                   r"spill/p0/\d+\.bin does not match its checksum"),
    "new_id swap": ("shuffle", _swap_new_id, r"new_id\.npy does not match its checksum"),
    "indices byte": ("sort", lambda w: _flip(w / "out" / "part0" / "indices.npy", 200),
                     r"out/part0/indices\.npy does not match its checksum"),
    "missing file": ("sort", lambda w: (w / "out" / "part1" / "eids.npy").unlink(),
                     r"out/part1/eids\.npy is missing"),
    "planted link": ("sort", lambda w: (w / "out" / "part1" / "evil").symlink_to("/etc/passwd"),
                     r"evil is a link"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_resume_refuses_a_tampered_work_folder(case: str, src: Path, tmp_path: Path) -> None:
    stage, tamper, pattern = TAMPER[case]
    work = _killed_after(stage, src, tmp_path / "o")
    tamper(work)
    one_error(cli(src, tmp_path / "o", "--resume"), pattern + r".*run without --resume")
    assert not (tmp_path / "o").exists()
    res = cli(src, tmp_path / "o")  # a fresh run starts over and succeeds
    assert res.returncode == 0, res.stderr
    only(tmp_path, "in", "o")


def test_resume_notices_an_input_changed_with_its_mtime_kept(src: Path, tmp_path: Path) -> None:
    _killed_after("shuffle", src, tmp_path / "o")
    chunk = src.parent / json.loads(src.read_text())["node_data"]["_N"]["feat"]["data"][0]
    st = chunk.stat()
    _flip(chunk, st.st_size - 3)
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    one_error(cli(src, tmp_path / "o", "--resume"), r"was made from other inputs or options")
    assert not (tmp_path / "o").exists()


def test_resume_untouched_still_resumes(src: Path, tmp_path: Path) -> None:
    work = _killed_after("sort", src, tmp_path / "o")
    (work / "out" / "part0" / "stray.npy").write_bytes(b"left by the cut-off stage")
    res = cli(src, tmp_path / "o", "--resume")
    assert res.returncode == 0, res.stderr
    assert "resumed after assign, shuffle, sort" in res.stderr
    assert not (tmp_path / "o" / "part0" / "stray.npy").exists()
    only(tmp_path, "in", "o")


# --- 17: a planted link at the work folder ------------------------------------------------------
def test_symlink_at_the_work_folder_is_refused(src: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    (tmp_path / ".o.work").symlink_to(victim)
    for extra in ((), ("--resume",)):
        one_error(cli(src, tmp_path / "o", *extra), r"\.o\.work exists and is not a folder \(a link")
    assert sorted(p.name for p in victim.iterdir()) == ["keep"] and (victim / "keep").read_text() == "mine"
    assert not (tmp_path / "o").exists()


def test_symlink_at_a_part_dir_build_folder_is_refused(src: Path, tmp_path: Path) -> None:
    victim, host = tmp_path / "victim", tmp_path / "host"
    victim.mkdir()
    host.mkdir()
    (host / ".g-part1.work").symlink_to(victim)
    res = cli(src, tmp_path / "o", "--part-dir", f"1={host}")
    one_error(res, r"\.g-part1\.work exists and is not a folder")
    assert list(victim.iterdir()) == [] and sorted(p.name for p in host.iterdir()) == [".g-part1.work"]
    only(tmp_path, "in", "victim", "host")
