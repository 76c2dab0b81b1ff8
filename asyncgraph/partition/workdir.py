"""The out-of-core partitioner's work folder, trusted by ``--resume`` only once verified (issue 32).

``.<out>.work`` beside the output holds the run's state (``state.json``: the stages done and
what they found) and every intermediate file (``new_id.npy``, spill files, the output tree
being built). At the end of each stage :meth:`WorkFolder.save` records, in ``state.json``,
the size and SHA-256 of every file in the folder and a SHA-256 of the state itself. ``--resume``
reads nothing of the folder before :meth:`WorkFolder.open` has checked it: no link anywhere in
it, ``state.json`` small and matching its checksum, every recorded file present with its size
and digest (before: a tampered ``state.json`` asked for a 32 GiB allocation; a flipped spill byte
or a swapped ``new_id`` gave wrong output with exit 0). Files no finished stage recorded belong
to the stage that was cut off, which starts over: they are removed. Inputs are fingerprinted by
path, size, mtime and a SHA-256 of their content (whole up to ``WHOLE_HASH_BYTES``, else
``SAMPLES`` evenly spaced pieces), so an input rewritten with its mtime kept is noticed.
What is not covered: ``--part-dir`` folders (on other hosts, maybe) are not checksummed, and an
input changed only between sampled pieces of a big file is not seen.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from asyncgraph.errors import InvalidRequestError
from asyncgraph.partition.output import pid_alive

__all__ = ["SAMPLES", "WHOLE_HASH_BYTES", "WorkFolder", "content_digest"]

STATE = "state.json"
OWNER = "owner"
MAX_STATE_BYTES = 16 << 20  # a state.json is a few KiB; a bigger one is not read
WHOLE_HASH_BYTES = 8 << 20  # inputs up to this size are hashed whole for the fingerprint
SAMPLES = 64  # else this many pieces of SAMPLE_BYTES, evenly spaced (first and last included)
SAMPLE_BYTES = 64 << 10
_BLOCK = 1 << 20


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _sha256_all(paths: list[Path]) -> list[str]:
    """SHA-256 of each file, on a few threads (hashlib lets go of the GIL while it hashes)."""
    if len(paths) < 2:
        return [_sha256(p) for p in paths]
    with ThreadPoolExecutor(min(len(paths), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(_sha256, paths))


def content_digest(path: Path) -> str:
    """SHA-256 of an input's content: whole when small, else ``SAMPLES`` evenly spaced pieces."""
    size = path.stat().st_size
    if size <= WHOLE_HASH_BYTES:
        return _sha256(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for i in range(SAMPLES):
            f.seek((size - SAMPLE_BYTES) * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def fingerprint(files: Iterable[Path], opts: dict[str, Any]) -> str:
    """One digest of the inputs (path, size, mtime, content digest) and the run's options."""
    stats = []
    for f in files:
        st = f.stat()
        stats.append((str(f.resolve()), st.st_size, st.st_mtime_ns, content_digest(f)))
    return hashlib.sha256(json.dumps([stats, opts], sort_keys=True, default=str).encode()).hexdigest()


def _state_digest(state: dict[str, Any], files: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([state, files], sort_keys=True).encode()).hexdigest()


class WorkFolder:
    """``.<out>.work``: opened fresh or, with ``resume``, verified; ``save`` after each stage."""

    def __init__(self, out: Path) -> None:
        self.path = out.parent / f".{out.name}.work"
        self.state: dict[str, Any] = {}
        self._files: dict[str, list[Any]] = {}  # relative path -> [size, mtime_ns, sha256]
        self.resumed = False  # open() found an earlier run's state and kept it

    def open(self, fp: str, resume: bool) -> dict[str, Any]:
        """Keep the folder (``resume``, same inputs and options, verified) or start afresh."""
        work = self.path
        if work.is_symlink() or (work.exists() and not work.is_dir()):
            raise InvalidRequestError(
                f"{work} exists and is not a folder (a link or a file); remove it: the partitioner "
                "writes its intermediate files there"
            )
        lock = work / OWNER
        if lock.is_file() and not lock.is_symlink() and lock.stat().st_size < 256:
            pid, _, host = lock.read_text(errors="replace").partition("@")
            mine = host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid()
            if mine and pid_alive(int(pid)):
                raise InvalidRequestError(f"{work} is in use by process {pid}; wait for it or kill it")
        if resume and (work / STATE).exists():
            self._verify(fp)
            self.resumed = True
        else:
            shutil.rmtree(work, ignore_errors=True)
            if work.exists():
                raise InvalidRequestError(f"{work}: cannot remove an earlier run's work folder")
            self.state, self._files = {"fingerprint": fp, "done": []}, {}
        work.mkdir(parents=True, exist_ok=True)
        (work / OWNER).write_text(f"{os.getpid()}@{socket.gethostname()}")
        self.save()
        return self.state

    def save(self) -> None:
        """Record the state and the size and SHA-256 of every file now in the folder."""
        files: dict[str, list[Any]] = {}
        todo: list[tuple[str, Path]] = []
        for rel, path in self._walk():
            st = path.stat()
            old = self._files.get(rel)
            if old is not None and old[0] == st.st_size and old[1] == st.st_mtime_ns:
                files[rel] = old  # written by no stage since it was hashed (this process)
            else:
                files[rel] = [st.st_size, st.st_mtime_ns, ""]
                todo.append((rel, path))
        for (rel, _), digest in zip(todo, _sha256_all([p for _, p in todo]), strict=True):
            files[rel][2] = digest
        self._files = dict(sorted(files.items()))
        doc = {"state": self.state, "files": files, "sha256": _state_digest(self.state, files)}
        tmp = self.path / (STATE + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path / STATE)

    def _walk(self) -> list[tuple[str, Path]]:
        """Every regular file but the state and the owner lock, as (relative path, path)."""
        out = []
        for root, dirs, names in os.walk(self.path):
            for n in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                path = Path(root, n)
                rel = path.relative_to(self.path).as_posix()
                if rel in (STATE, OWNER, STATE + ".tmp"):
                    continue
                if path.is_symlink() or not path.is_file():
                    raise InvalidRequestError(f"--resume: {path} is a link or not a regular file; "
                                              "run without --resume to start over")  # fmt: skip
                out.append((rel, path))
        return sorted(out)

    def _verify(self, fp: str) -> None:
        """Check ``state.json`` and every file it lists; remove files no finished stage wrote."""
        state_file = self.path / STATE
        again = "; run without --resume to start over"
        plain = state_file.is_file() and not state_file.is_symlink()
        if not plain or state_file.stat().st_size > MAX_STATE_BYTES:
            raise InvalidRequestError(f"--resume: {state_file} is not a state file of this run{again}")
        try:
            doc = json.loads(state_file.read_bytes())
            state, files, digest = doc["state"], doc["files"], doc["sha256"]
            ok = isinstance(state, dict) and isinstance(files, dict) and digest == _state_digest(state, files)
        except (ValueError, TypeError, KeyError):
            ok = False
        if not ok:
            raise InvalidRequestError(f"--resume: {state_file} does not match its checksum (changed or "
                                      f"damaged){again}")  # fmt: skip
        if state.get("fingerprint") != fp:
            raise InvalidRequestError(
                f"--resume: {self.path} was made from other inputs or options (an input's size, time "
                f"or content changed){again}"
            )
        present = dict(self._walk())
        for rel, entry in files.items():
            path = present.get(rel)
            if path is None:
                raise InvalidRequestError(f"--resume: {self.path / rel} is missing{again}")
            if path.stat().st_size != entry[0]:
                raise InvalidRequestError(f"--resume: {path} does not match its checksum (its size "
                                          f"changed){again}")  # fmt: skip
        paths = [present[rel] for rel in files]
        for (_, entry), path, digest in zip(files.items(), paths, _sha256_all(paths), strict=True):
            if digest != entry[2]:
                raise InvalidRequestError(f"--resume: {path} does not match its checksum (changed or "
                                          f"damaged){again}")  # fmt: skip
            entry[1] = path.stat().st_mtime_ns  # verified now: save() need not hash it again
        for rel, path in present.items():
            if rel not in files:  # written by the stage that was cut off: it starts over
                path.unlink()
        self.state, self._files = state, files
