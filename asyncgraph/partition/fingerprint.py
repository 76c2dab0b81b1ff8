"""A partition's fingerprint: SHA-256 of its config and its structure files (issue 34).

The partitioners (``partition_graph`` and the out-of-core pipeline) compute it once, when the
files are written, and record it in the config (``PartSpec.fingerprint``), so a server trusts it
without rereading every structure byte at start; ``--verify`` rehashes and compares. The value
is the one servers always computed (``partition_fingerprint``): the config's canonical JSON
without the recorded fingerprints, the part's number, then each structure file's name and bytes.
Configs written before it existed hash exactly as they did, so durable state keeps matching.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncgraph import failpoints

__all__ = [
    "FINGERPRINT_KEY",
    "canonical_config",
    "fingerprint_part",
    "partition_fingerprint",
    "recorded_fingerprint",
    "stamp_fingerprints",
    "verify_partition",
]

#: The key of a part's recorded fingerprint in the config's ``parts`` entries.
FINGERPRINT_KEY = "fingerprint"
_CHUNK = 1 << 22


def canonical_config(raw: dict[str, Any]) -> bytes:
    """The config's canonical JSON (sorted keys, no spaces) without any recorded fingerprint."""
    body = dict(raw)
    if isinstance(body.get("parts"), list):
        body["parts"] = [
            {k: v for k, v in p.items() if k != FINGERPRINT_KEY} if isinstance(p, dict) else p
            for p in body["parts"]
        ]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def fingerprint_part(config_json: bytes, part_id: int, folder: str | Path) -> str:
    """The fingerprint of part ``part_id`` whose structure files lie in ``folder``, given the
    config's ``canonical_config`` (a task: it runs where the part's folder is)."""
    from asyncgraph.partition.layout import PartFiles

    files = PartFiles(Path(folder))
    h = hashlib.sha256()
    h.update(config_json)
    h.update(f"|part {part_id}|".encode())
    for path in (files.indptr, files.indices, files.eids):
        h.update(path.name.encode())
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def partition_fingerprint(part_config: str | Path, part_id: int) -> str:
    """Rehash partition ``part_id``: its config and every byte of its structure files.

    A re-partitioned graph gets another fingerprint even under the same name, so state written
    for the old partition is refused instead of serving old rows against the new structure.
    """
    from asyncgraph.partition.config import PartitionConfig

    if failpoints.enabled:
        failpoints.hit("partition.rehash")  # tests: a server that trusts the config never gets here
    raw = json.loads(Path(part_config).read_text())
    folder = PartitionConfig.model_validate(raw).part_dir(part_config, part_id)
    return fingerprint_part(canonical_config(raw), part_id, folder)


def stamp_fingerprints(config_path: Path, fingerprints: Sequence[str]) -> None:
    """Record each part's fingerprint in the config at ``config_path`` (rewritten in place;
    the hashed content is unchanged: ``canonical_config`` leaves the fingerprints out)."""
    from asyncgraph.partition.config import PartitionConfig

    config = PartitionConfig.load(config_path)
    if len(fingerprints) != len(config.parts):
        raise ValueError(f"{len(fingerprints)} fingerprints for {len(config.parts)} parts")
    for spec, fp in zip(config.parts, fingerprints, strict=True):
        spec.fingerprint = fp
    tmp = config_path.with_name(config_path.name + ".tmp")
    tmp.write_text(config.model_dump_json(indent=2))
    tmp.replace(config_path)


def recorded_fingerprint(part_config: str | Path, part_id: int) -> str | None:
    """The fingerprint the partitioner recorded for part ``part_id``; None in an older config."""
    from asyncgraph.partition.config import PartitionConfig

    parts = PartitionConfig.load(part_config).parts
    return parts[part_id].fingerprint if 0 <= part_id < len(parts) else None


def verify_partition(part_config: str | Path, part_id: int) -> str:
    """Rehash part ``part_id`` and compare with the recorded fingerprint (``--verify``): the
    fingerprint, or ``FingerprintMismatchError`` naming both."""
    from asyncgraph.errors import FingerprintMismatchError

    recorded = recorded_fingerprint(part_config, part_id)
    computed = partition_fingerprint(part_config, part_id)
    if recorded is not None and recorded != computed:
        raise FingerprintMismatchError(
            f"partition {part_id} of {part_config}: its structure files hash to {computed}, the config "
            f"records {recorded}: a file was changed or comes from another partitioning; partition again"
        )
    return computed
