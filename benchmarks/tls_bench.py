"""What TLS costs (issue 32): remote pulls over loopback, plain against ``--tls-*``.

PubMed (500 float32 = 2,000 B rows, as ``link_bench``) in 2 random partitions, 2 servers with a
secret, one client in this process with ``use_shared_memory=False`` (every row over the socket).
For each mode (plain, then TLS with client certificates from a throwaway CA made with the
openssl CLI) it times the connect (both handshakes) and, for 1k and 10k uniform random IDs per
call, a fixed time of back-to-back pulls: rows/s, MB/s and p50/p99 latency. Loopback is the
worst case for TLS's share of the cost (no wire time to hide behind); on a 1 Gbit link a pull
is bound by the link until the cipher's rate is below ~120 MB/s.

``python -m benchmarks.tls_bench [--seconds 3]`` writes ``benchmarks/results/tls_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import ROOT, partitioned

RESULTS = ROOT / "benchmarks" / "results"
SECRET = b"tls-bench"
SIZES = (1_000, 10_000)


def make_pki(folder: Path) -> dict[str, str]:
    """A CA, a server and a client certificate (EC P-256, 1 day) in ``folder``; their paths."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=ca")
    for name in ("server", "client"):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "1")  # fmt: skip
    return {k: str(folder / v) for k, v in {
        "ca": "ca.pem", "server_cert": "server.pem", "server_key": "server.key",
        "client_cert": "client.pem", "client_key": "client.key"}.items()}  # fmt: skip


async def measure(addresses: list[tuple[str, int]], tls: Any, seconds: float) -> dict[str, Any]:
    from asyncgraph.client import AsyncClient

    t0 = time.perf_counter()
    client = await AsyncClient.connect(
        addresses, secret=SECRET, use_shared_memory=False, use_replicas=False, tls=tls
    )
    out: dict[str, Any] = {"connect_ms": (time.perf_counter() - t0) * 1e3}
    rng = np.random.default_rng(0)
    n = client.book.num_nodes
    try:
        for size in SIZES:
            await client.pull_numpy("node:feat", rng.integers(0, n, size))  # warm-up
            times: list[float] = []
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                ids = rng.integers(0, n, size)
                t = time.perf_counter()
                rows = await client.pull_numpy("node:feat", ids)
                times.append(time.perf_counter() - t)
            total = sum(times)
            out[str(size)] = {
                "calls": len(times),
                "rows_s": size * len(times) / total,
                "mb_s": rows.nbytes * len(times) / total / 1e6,
                "p50_ms": float(np.percentile(times, 50) * 1e3),
                "p99_ms": float(np.percentile(times, 99) * 1e3),
            }
    finally:
        await client.close()
    return out


def main() -> int:
    from asyncgraph.net.tls import TlsConfig
    from asyncgraph.testing import start_servers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="pull time per size and mode")
    ap.add_argument("--out", type=Path, default=RESULTS / "tls_bench.json")
    args = ap.parse_args()
    config = partitioned(ROOT / "examples" / "data" / "pubmed.npz", 2, "random")
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "graph": "pubmed"}
    with tempfile.TemporaryDirectory(prefix="tls-bench-") as tmp:
        pki = make_pki(Path(tmp))
        server_tls = ["--tls-ca-file", pki["ca"], "--tls-cert", pki["server_cert"]]
        server_tls += ["--tls-key", pki["server_key"]]
        client_tls = TlsConfig(pki["ca"], pki["client_cert"], pki["client_key"])
        for mode, extra, tls in (("plain", [], None), ("tls", server_tls, client_tls)):
            extra_args = ["--log-level", "WARNING", *extra]
            group = start_servers(config, Path(tmp) / mode, num_parts=2, secret=SECRET, extra_args=extra_args)
            try:
                result[mode] = asyncio.run(measure(group.addresses, tls, args.seconds))
            finally:
                group.stop()
    for size in map(str, SIZES):
        plain, tls_ = result["plain"][size], result["tls"][size]
        result[f"tls_over_plain_{size}"] = tls_["rows_s"] / plain["rows_s"]
        print(
            f"{size:>6} rows/call: plain {plain['mb_s']:7.1f} MB/s p50 {plain['p50_ms']:6.2f} ms | "
            f"TLS {tls_['mb_s']:7.1f} MB/s p50 {tls_['p50_ms']:6.2f} ms | "
            f"TLS/plain {tls_['rows_s'] / plain['rows_s']:.2f}"
        )
    print(f"connect: plain {result['plain']['connect_ms']:.1f} ms, TLS {result['tls']['connect_ms']:.1f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
