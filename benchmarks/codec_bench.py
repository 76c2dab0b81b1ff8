"""Per-message CPU cost of the wire codec (issue 9, "cheap requests"), with its msgpack ceiling.

Times, with ``timeit`` (``--number`` calls, best of ``--repeat``), in one process:

* ``request_encode``: ``encode_message(Request(1, "pull", {"name": "node:feat", "ids": 1-row int64}))``
* ``response_encode``: ``encode_message(Response(1, (1, 128) float32))``
* ``request_decode`` / ``response_decode``: ``decode_message`` of those frames' bodies (bytes)
* ``rows1000_encode`` / ``rows1000_decode``: the same for a ``Response`` carrying a (1000, 128)
  float32 array (512 KB, zero-copy both ways: what is left is the per-message cost)
* ``ceiling_packb`` / ``ceiling_unpackb``: plain ``msgpack.packb`` / ``unpackb`` of the same
  request header with its array left out (what msgpack alone costs; the floor for our codec)

Figures are microseconds per call. Timings on a shared or loaded machine are noisy: compare only
figures of one run, or runs on the same idle machine.

Run: ``.venv/bin/python -m benchmarks.codec_bench [--number 20000] [--repeat 3]``; writes
``benchmarks/results/codec_bench.json``. ``--before OLD.json`` (this script's output from another
checkout, run just before on the same machine) stores those figures alongside and prints ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from asyncgraph.protocol.messages import PROTOCOL_VERSION, Request, Response, decode_message, encode_message
from benchmarks.common import RESULTS


def _body(pieces: list[bytes | memoryview]) -> bytes:
    """A frame's body (length prefix stripped) as the reader hands it over."""
    return b"".join(pieces)[4:]


def _us(fn: Callable[[], Any], number: int, repeat: int) -> float:
    """Best-of-``repeat`` microseconds per call of ``fn``."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    """Measure, print a table and write the results JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=20000, help="calls per timing")
    ap.add_argument("--repeat", type=int, default=3, help="timings per case; the best is kept")
    ap.add_argument("--label", default="", help="free text stored with the results (e.g. the commit)")
    ap.add_argument("--before", type=Path, help="results JSON of a baseline run to compare against")
    args = ap.parse_args()

    request = Request(1, "pull", {"name": "node:feat", "ids": np.array([70001])})
    response = Response(1, np.ones((1, 128), dtype=np.float32))
    big = Response(1, np.ones((1000, 128), dtype=np.float32))
    big_body = _body(encode_message(big))
    request_body = _body(encode_message(request))
    response_body = _body(encode_message(response))
    plain = [0, 1, "pull", {"name": "node:feat", "ids": [70001]}]
    plain_packed = msgpack.packb(plain)

    cases: dict[str, Callable[[], Any]] = {
        "request_encode": lambda: encode_message(request),
        "response_encode": lambda: encode_message(response),
        "request_decode": lambda: decode_message(request_body),
        "response_decode": lambda: decode_message(response_body),
        "rows1000_encode": lambda: encode_message(big),
        "rows1000_decode": lambda: decode_message(big_body),
        "ceiling_packb": lambda: msgpack.packb(plain),
        "ceiling_unpackb": lambda: msgpack.unpackb(plain_packed),
    }
    figures = {name: round(_us(fn, args.number, args.repeat), 2) for name, fn in cases.items()}
    figures["rows1000_roundtrip"] = round(figures["rows1000_encode"] + figures["rows1000_decode"], 2)
    before = json.loads(args.before.read_text()) if args.before else None
    old = before["us_per_call"] if before else {}
    print(f"codec per-call cost, us (best of {args.repeat}; protocol version {PROTOCOL_VERSION})")
    for name, us in figures.items():
        ratio = f"   before {old[name]:9.2f}  ({old[name] / us:4.1f}x)" if name in old and us else ""
        print(f"  {name:<20} {us:9.2f}{ratio}")
    out = {
        "benchmark": "codec_bench",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "label": args.label,
        "protocol_version": PROTOCOL_VERSION,
        "python": platform.python_version(),
        "msgpack": ".".join(map(str, msgpack.version)),
        "numpy": np.__version__,
        "number": args.number,
        "repeat": args.repeat,
        "us_per_call": figures,
        "request_frame_bytes": len(request_body) + 4,
        "response_frame_bytes": len(response_body) + 4,
    }
    if before:
        out["before"] = {
            k: before[k] for k in ("label", "when", "protocol_version", "us_per_call") if k in before
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "codec_bench.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
