"""What every benchmark shares: graphs and partitions, median timing, loopback ceilings, references.

* ``add_graph_options`` / ``graph_npz``: ``--graph PATH.npz`` (any npz with src/dst/feat/label/
  train_mask, as in ``examples/data``) or the seeded synthetic graph ``--scale`` (generated once
  into ``benchmarks/data``); ``partitioned`` partitions it once into a cached folder.
* ``median_time``: median wall time over repeats, after warm-up calls.
* ``loopback_ceiling``: raw TCP loopback throughput and round-trip time, measured in the calling run.
* ``load_reference``: other systems' figures (e.g. DGL) only from a results JSON given on the command
  line, with its provenance, and only when it was measured the same day; otherwise no ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data"
RESULTS = HERE / "results"


# --- graphs -------------------------------------------------------------------------------------
def add_graph_options(ap: argparse.ArgumentParser | argparse._ArgumentGroup, default_scale: int) -> None:
    """``--graph PATH.npz``, else the synthetic graph of ``--scale`` (the default)."""
    ap.add_argument("--graph", type=Path, help="an npz graph (src, dst, feat, label, train_mask, ...)")
    ap.add_argument(
        "--scale", type=int, default=default_scale, help="synthetic graph of 2**scale nodes (no --graph)"
    )


def add_reference_option(ap: argparse.ArgumentParser) -> None:
    """``--dgl-results PATH.json``: DGL figures measured today on this set-up (see load_reference)."""
    ap.add_argument("--dgl-results", type=Path, help="DGL results JSON from a same-day run: print ratios")


def synthetic_npz(scale: int) -> Path:
    """``benchmarks/data/synth<scale>.npz``, generated (seed 0) if missing."""
    path = DATA / f"synth{scale}.npz"
    if not path.is_file():
        from benchmarks.synthetic import make_synthetic

        t0 = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}-{os.getpid()}.npz")
        np.savez(tmp, **make_synthetic(scale, 0))  # type: ignore[arg-type]
        tmp.replace(path)
        print(f"generated {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return path


def graph_npz(args: argparse.Namespace) -> Path:
    """The graph named by ``--graph``, else the synthetic graph of ``--scale``."""
    if args.graph is not None:
        path = Path(args.graph)
        if not path.is_file():
            raise SystemExit(f"--graph {path}: no such file")
        return path
    return synthetic_npz(args.scale)


def partitioned(
    npz: Path,
    num_parts: int,
    method: str = "metis",
    *,
    balance: bool = False,
    cache: Path = DATA,
) -> Path:
    """Partition ``npz`` once into ``cache/<stem>_<method><parts>[_balanced]``; its config path.

    ``balance`` balances train nodes and in-edges (``--balance-train --balance-edges``). Runs in a
    subprocess, so the benchmark's own memory stays small.
    """
    name = npz.stem
    out = cache / f"{name}_{method}{num_parts}{'_balanced' if balance else ''}"
    config = out / f"{name}.json"
    if config.is_file() and all((out / f"part{p}").is_dir() for p in range(num_parts)):
        return config
    cmd = [
        sys.executable, "-m", "asyncgraph.partition", "--input", str(npz), "--graph-name", name,
        "--num-parts", str(num_parts), "--method", method, "--out", str(out),
    ]  # fmt: skip
    if balance:
        cmd += ["--balance-train", "--balance-edges"]
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=subprocess_env())
    print(f"partitioned {npz.name} ({method}, {num_parts}) in {time.perf_counter() - t0:.1f} s -> {out}")
    return config


def subprocess_env() -> dict[str, str]:
    """This environment with the repository root leading ``PYTHONPATH`` (for ``-m benchmarks.*``)."""
    rest = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) if not rest else f"{ROOT}{os.pathsep}{rest}"}


# --- timing -------------------------------------------------------------------------------------
def median_time(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` warm-up calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# --- loopback ceiling ---------------------------------------------------------------------------
_SENDER = """
import socket, sys
host, port, total, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with socket.create_connection((host, port)) as s:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:  # echo small pings until an empty one, then stream
        m = s.recv(64)
        if m == b"go":
            break
        s.sendall(m)
    payload = b"\\0" * chunk
    sent = 0
    while sent < total:
        s.sendall(payload)
        sent += chunk
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
"""


def wait_for_sampler(
    addresses: list[tuple[str, int]], secret: bytes | None = None, timeout: float = 120.0
) -> list[str]:
    """Wait until no server is still loading its compiled sampler (``info()["sampler"]``); each
    server's state then. Servers load it in the background after they are ready (a second or
    two from numba's cache, ~5 s on a machine's first start) and sample with numpy until then:
    a benchmark that times sampling right after start-up measures that mix, not the steady state.
    """
    from asyncgraph.client.sync_client import Client

    client = Client.connect(addresses, use_shared_memory=False, secret=secret)
    try:
        deadline = time.monotonic() + timeout
        while True:
            states = [str(client.info(p).get("sampler", "numpy")) for p in range(len(addresses))]
            if "loading" not in states or time.monotonic() > deadline:
                return states
            time.sleep(0.1)
    finally:
        client.close()


def loopback_ceiling(total: int = 256 << 20, chunk: int = 4 << 20, pings: int = 2000) -> dict[str, float]:
    """Raw TCP over loopback between this process and a child: stream bytes/s and ping round trip.

    ``bytes_per_s`` is timed from the first byte received (the child's start-up excluded);
    ``round_trip_us`` is the median of ``pings`` 8-byte ping-pongs with ``TCP_NODELAY``.
    """
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        sender = subprocess.Popen(
            [sys.executable, "-c", _SENDER, "127.0.0.1", str(port), str(total), str(chunk)]
        )
        try:
            conn, _ = listener.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                rtts = []
                for _ in range(pings):
                    t0 = time.perf_counter()
                    conn.sendall(b"pingpong")
                    got = 0
                    while got < 8:
                        got += len(conn.recv(8 - got))
                    rtts.append(time.perf_counter() - t0)
                conn.sendall(b"go")
                view = memoryview(bytearray(chunk))
                received = conn.recv_into(view)
                t0 = time.perf_counter()
                while True:
                    n = conn.recv_into(view)
                    if n == 0:
                        break
                    received += n
                elapsed = time.perf_counter() - t0
                conn.sendall(b"x")
        finally:
            sender.wait(timeout=60)
    return {
        "bytes_per_s": received / elapsed,
        "MB_per_s": received / elapsed / 1e6,
        "round_trip_us": float(np.median(rtts)) * 1e6,
        "bytes": float(received),
    }


# --- reference figures ----------------------------------------------------------------------------
def load_reference(path: Path | None, today: dt.date | None = None) -> dict[str, Any] | None:
    """Another system's figures, or None: ratios are printed only against a same-day run.

    The JSON names its provenance: ``{"system": "DGL 2.1", "date": "YYYY-MM-DD", "machine": ...,
    "set_up": ..., <figures>}``. Figures from another day (another machine state) are refused.
    """
    if path is None:
        return None
    ref: dict[str, Any] = json.loads(Path(path).read_text())
    missing = [k for k in ("system", "date", "machine") if k not in ref]
    if missing:
        raise SystemExit(f"{path}: reference results need provenance fields {missing}")
    day = today or dt.date.today()
    if dt.date.fromisoformat(str(ref["date"])) != day:
        print(
            f"{path}: measured {ref['date']}, not today ({day}); ratios omitted", file=sys.stderr, flush=True
        )
        return None
    return ref


def provenance(ref: dict[str, Any]) -> str:
    """``DGL 2.1, 2025-01-01, <machine>``: what a ratio is against."""
    return f"{ref['system']}, {ref['date']}, {ref['machine']}"
