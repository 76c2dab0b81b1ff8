"""A live graph's overlay in a snapshot (issue 35): its arrays as checksummed files beside the
tensors' (``overlay-<name>.bin``) and its request-id answers in the manifest's ``overlay``
entry. Written while writes are held (``DurableState.snapshot_async``), so the overlay is that
of the instant the snapshot describes; read back (``snapshot_restore.read_overlay``) before the
logs after it are replayed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

__all__ = ["OverlayState", "write_overlay"]

#: ``(arrays by name, request id -> [first slot, count])`` (``LiveStructure.state``).
OverlayState = tuple[dict[str, np.ndarray], dict[str, list[int]]]


def write_overlay(folder: Path, state: OverlayState) -> dict[str, Any]:
    """Write the overlay's arrays into ``folder`` (fsynced); the manifest's ``overlay`` entry."""
    arrays, answers = state
    entries: dict[str, Any] = {}
    for name, arr in arrays.items():
        data = np.ascontiguousarray(arr)
        file = f"overlay-{quote(name, safe=':')}.bin"  # a per-type tensor's "/" is quoted
        raw = data.tobytes()
        with open(folder / file, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        entries[name] = {
            "file": file,
            "dtype": data.dtype.name,
            "size": int(data.size),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
    return {"arrays": entries, "answers": answers}
