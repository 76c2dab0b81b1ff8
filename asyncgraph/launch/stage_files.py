"""The files ``asyncgraph.launch.stage`` copies: which, checked how, and their SHA-256 manifest.

A partition folder and the ID mapping files a config names must be plain relative paths inside
the config's folder (no ``..``, not absolute), and nothing under them may be a symbolic link or
anything but a regular file (issue 32: ``orig_nids`` given as ``../../..`` was copied from outside
the partitioning, and a link inside a partition folder copied a host's ssh private key to every
server). Checked before anything is copied.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath

from asyncgraph.partition.config import PartitionConfig

__all__ = [
    "StageError",
    "build_manifest",
    "check_part_path",
    "compare",
    "expected_files",
    "manifest_name",
    "mapping_files",
    "no_links",
    "parse_sha256sum",
    "part_files",
    "sha256_file",
    "write_manifest",
]

_CHUNK = 1 << 20


class StageError(Exception):
    """A failure with its exit status: 1 a failed copy, 2 bad input or a checksum mismatch."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def check_part_path(path: str, part_id: int, what: str = "") -> None:
    """Partition folders and mapping files must stay inside the destination: relative, no ``..``."""
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts or "\x00" in path:
        kind = f"{what} {path!r} is not a plain relative path" if what else (
            f"partition {part_id}'s path {path!r} is not a plain relative folder")
        raise StageError(f"{kind} inside the partitioning; cannot stage it", 2)


def no_links(path: Path) -> None:
    """Refuse a link at ``path`` or anywhere under it (issue 32: a link in a partition folder
    copied the host's ssh private key to every server); only regular files and folders go."""
    if path.is_symlink():
        raise StageError(f"{path} is a symbolic link; stage copies regular files only", 2)
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            entry = Path(dirpath, name)
            if entry.is_symlink():
                raise StageError(f"{entry} is a symbolic link; stage copies regular files only", 2)
            if name in files and not entry.is_file():
                raise StageError(f"{entry} is not a regular file; stage copies regular files only", 2)


def expected_files(config: PartitionConfig, part_id: int) -> list[str]:
    """Files the server reads for one partition, relative to its folder."""
    names = ["indptr.npy", "indices.npy", "eids.npy"]
    names += [f"node_feat/{name}.npy" for name in config.node_feats]
    names += [f"edge_feat/{name}.npy" for name in config.edge_feats]
    return names


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def part_files(config_path: Path, config: PartitionConfig, part_id: int) -> list[str]:
    """Every regular file of a partition, relative to the config's folder (POSIX separators).

    Fails (status 2) when the folder or a file the server needs is missing.
    """
    root = config_path.parent
    part_dir = root / config.parts[part_id].path
    if not part_dir.is_dir():
        raise StageError(f"partition {part_id}'s folder {part_dir} is missing", 2)
    no_links(part_dir)
    for name in expected_files(config, part_id):
        if not (part_dir / name).is_file():
            raise StageError(f"partition {part_id}'s file {part_dir / name} is missing", 2)
    return sorted(p.relative_to(root).as_posix() for p in part_dir.rglob("*") if p.is_file())


def mapping_files(config_path: Path, config: PartitionConfig) -> list[str]:
    """The ID mapping files the config names (``orig_nids``/``orig_eids``), where they exist.

    Every host gets them beside the config, so ``load_orig_ids`` works wherever a trainer runs.
    """
    named = [n for n in (config.orig_nids, config.orig_eids) if n]
    for n in named:
        check_part_path(n, -1, "the ID mapping file")
        no_links(config_path.parent / n)
    return [n for n in named if (config_path.parent / n).is_file()]


def manifest_name(config_path: Path) -> str:
    return f"{config_path.stem}.sha256"


def build_manifest(config_path: Path, config: PartitionConfig) -> dict[str, str]:
    """SHA-256 of the config and every partition file, keyed by path relative to the config."""
    names = [config_path.name, *mapping_files(config_path, config)]
    for part_id in range(config.num_parts):
        names += part_files(config_path, config, part_id)
    return {name: sha256_file(config_path.parent / name) for name in names}


def write_manifest(path: Path, manifest: dict[str, str]) -> None:
    """``sha256sum`` format (two spaces), so ``sha256sum -c`` reads it too."""
    text = "".join(f"{digest}  {name}\n" for name, digest in manifest.items())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def parse_sha256sum(output: str) -> dict[str, str]:
    """``<hex>  <name>`` lines (``*`` marks binary mode) -> {name: hex}."""
    result: dict[str, str] = {}
    for line in output.splitlines():
        digest, _, name = line.partition(" ")
        if len(digest) == 64 and name:
            result[name[1:] if name[:1] in " *" else name] = digest.lower()
    return result


def compare(host: str, expected: dict[str, str], found: dict[str, str]) -> None:
    """Raise (status 2) naming the first file missing or differing on ``host``."""
    for name, digest in expected.items():
        got = found.get(name)
        if got is None:
            raise StageError(f"{host}: {name} is missing after the copy", 2)
        if got != digest:
            raise StageError(f"{host}: checksum mismatch for {name} (expected {digest}, got {got})", 2)
