"""Pulls and sampling across real links: namespace hosts (tests/nethosts.py) shaped by ``tc tbf``.

Needs root, ``ip``, ``tc`` and ``sshd`` (``ops/ci/system-deps.sh``). For each host count (2, 4)
and link rate (``1gbit``, ``10gbit``, or ``none`` for an unshaped veth), the first half of the
hosts run clients, the second half the PubMed servers (2 partitions: both on the one server host
with 2 hosts; one each with 4), and every host's egress is shaped to the rate. Each client host
runs one client (``python -m benchmarks.link_bench --worker``) that pulls ``feat`` rows (500
float32 = 2,000 B) of uniform random IDs over the socket, all partitions remote, in calls of 1k,
10k and 100k rows for a fixed time, then ``sample_neighbors`` (1,024 seeds, fanout 10). Clients
on different hosts run at once; rates are added.

Printed beside each figure, measured in the same run: the **link limit** (rate / 8 per server
host: the physical ceiling; what a pull of remote rows cannot beat) and a raw TCP stream over the
same shaped path (one sender per server host to a client host, 2 s). Target (issue 24): pulls of
100k rows at ≥ 0.8× the link at 1 Gbit.

Then (``--epochs N``, default 5; 0 skips it) the launched GraphSAGE job on 2 hosts per rate:
epoch time against max(link transfer, compute), the transfer being the bytes each host sent
through its tbf (``tc -s qdisc``) divided by the rate. Target: ≤ 1.1×.

``python -m benchmarks.link_bench [--hosts 2 4] [--rates 1gbit 10gbit] [--seconds 3] [--epochs 5]``
writes ``benchmarks/results/link_bench.json`` (pulls, sampling) and ``link_epoch.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZES = (1_000, 10_000, 100_000)
ROW_BYTES = 500 * 4


def _rate_bytes(rate: str) -> float | None:
    """``1gbit`` -> bytes/s (None for ``none``)."""
    if rate == "none":
        return None
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale / 8
    raise ValueError(f"rate {rate!r}: use e.g. 100mbit, 1gbit, 10gbit or none")


# --- the client, run on a client host --------------------------------------------------------
async def _worker(
    servers: list[tuple[str, int]], secret: bytes, seconds: float, start_at: float, chunk_mb: float | None
) -> dict[str, Any]:
    from asyncgraph.client import AsyncClient
    from asyncgraph.client.remote import RemotePartition

    if chunk_mb is not None:  # 0: no chunks (one request per owner, as before issue 24's fix)
        RemotePartition.chunk_bytes = int(chunk_mb * (1 << 20)) if chunk_mb > 0 else 1 << 40

    client = await AsyncClient.connect(servers, secret=secret, use_shared_memory=False, call_timeout=120)
    n = client.book.num_nodes
    rng = np.random.default_rng(os.getpid())
    await client.pull_numpy("node:feat", rng.integers(0, n, 1000))  # warm up
    while time.time() < start_at:  # clients on all hosts start together
        await asyncio.sleep(0.005)
    out: dict[str, Any] = {"pull": {}}
    for size in SIZES:
        ids = [rng.integers(0, n, size) for _ in range(4)]
        calls, lat = 0, []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds or calls < 3:
            t1 = time.perf_counter()
            await client.pull_numpy("node:feat", ids[calls % 4])
            lat.append(time.perf_counter() - t1)
            calls += 1
        wall = time.perf_counter() - t0
        out["pull"][str(size)] = {
            "rows_s": calls * size / wall,
            "calls": calls,
            "p50_ms": 1e3 * float(np.median(lat)),
        }
    # the largest size again with two calls in flight: a transfer overlaps the other's gather/copy
    size = SIZES[-1]
    ids = [rng.integers(0, n, size) for _ in range(4)]
    calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or calls < 4:
        await asyncio.gather(*(client.pull_numpy("node:feat", ids[(calls + k) % 4]) for k in range(2)))
        calls += 2
    out["pull_inflight2"] = {"size": size, "rows_s": calls * size / (time.perf_counter() - t0)}
    seeds = [rng.integers(0, n, 1024) for _ in range(4)]
    calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await client.sample_neighbors(seeds[calls % 4], 10)
        calls += 1
    out["sample_req_s"] = calls / (time.perf_counter() - t0)
    await client.close()
    return out


def _tcp_receive(port: int, seconds: float) -> None:
    """Accept one stream, count bytes for ``seconds`` after the first one, print bytes/s."""
    with socket.create_server(("0.0.0.0", port)) as listener:
        print("listening", flush=True)
        conn, _ = listener.accept()
        with conn:
            buf = memoryview(bytearray(4 << 20))
            conn.recv_into(buf)
            got, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                got += n
            print(json.dumps({"bytes_s": got / (time.perf_counter() - t0)}), flush=True)


def _tcp_send(host: str, port: int) -> None:
    chunk = bytes(4 << 20)
    with socket.create_connection((host, port)) as sock:
        try:
            while True:
                sock.sendall(chunk)
        except OSError:
            pass


# --- the driver, run as root in the root namespace ------------------------------------------
def _partition(work: Path) -> Path:
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    out = work / "pubmed2"
    partition_graph(Graph.from_npz(ROOT / "examples" / "data" / "pubmed.npz"), "pubmed", 2, out)
    return out / "pubmed.json"


def tcp_ceiling(server_hosts: list[Any], client_hosts: list[Any], seconds: float = 2.0) -> float:
    """Raw TCP over the same shaped paths: one stream per server host to a client host for
    ``seconds``; the bytes/s received, added over the streams."""
    ceiling = 0.0
    receivers, senders = [], []
    for i, host in enumerate(server_hosts):
        client_host = client_hosts[i % len(client_hosts)]
        code = "import sys; from benchmarks.link_bench import _tcp_receive as r; r(int(sys.argv[1]), float(sys.argv[2]))"  # noqa: E501
        rx = client_host.popen(
            [sys.executable, "-c", code, str(5201 + i), str(seconds)], stdout=subprocess.PIPE, cwd=ROOT
        )
        assert rx.stdout is not None
        rx.stdout.readline()
        send = f"from benchmarks.link_bench import _tcp_send; _tcp_send('{client_host.addr}', {5201 + i})"
        senders.append(host.popen([sys.executable, "-c", send], cwd=ROOT))
        receivers.append(rx)
    for rx in receivers:
        assert rx.stdout is not None
        ceiling += json.loads(rx.stdout.readline())["bytes_s"]
        rx.wait(timeout=30)
    for tx in senders:
        tx.kill()
        tx.wait(timeout=10)
    return ceiling


def _run_case(
    n_hosts: int,
    rate: str,
    part_config: Path,
    work: Path,
    seconds: float,
    chunk_mb: float | None = None,
    slow_start_after_idle: int | None = None,
    pki: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One host count and rate; ``pki`` (``tls_bench.make_pki``'s files): servers and clients
    speak TLS with client certificates."""
    sys.path.insert(0, str(ROOT / "tests"))
    from nethosts import NetHosts  # type: ignore[import-not-found]

    from asyncgraph.launch.processes import server_argv, wait_ready_files

    secret = work / "secret"
    secret.write_text(os.urandom(16).hex())
    with NetHosts(n_hosts) as nh:
        clients, server_hosts = nh.hosts[: n_hosts // 2], nh.hosts[n_hosts // 2 :]
        if rate != "none":
            bits = _rate_bytes(rate) or 0.0
            burst = f"{max(64 << 10, int(bits / 100))}b"  # 10 ms of the rate (>= HZ granularity)
            for i in range(n_hosts):
                nh.shape(i, rate, burst=burst, latency="100ms")
        if slow_start_after_idle is not None:  # per network namespace: the root one is untouched
            for host in nh.hosts:
                _sysctl(host.name, "net.ipv4.tcp_slow_start_after_idle", slow_start_after_idle)
        procs, ready = [], []
        for part in range(2):
            host = server_hosts[part % len(server_hosts)]
            ready.append(work / f"ready-{n_hosts}-{rate}-{part}.json")
            ready[-1].unlink(missing_ok=True)  # an earlier case's file names ports now closed
            extra = ["--log-level", "WARNING"]
            if pki is not None:
                extra += [
                    "--tls-ca-file",
                    pki["ca"],
                    "--tls-cert",
                    pki["server_cert"],
                    "--tls-key",
                    pki["server_key"],
                ]
            argv = server_argv(part_config, part, ready[-1], host=host.addr, num_clients=len(clients),
                               secret_file=secret, extra_args=extra)  # fmt: skip
            procs.append(host.popen(argv, cwd=ROOT))
        servers = wait_ready_files(procs, ready, 120)
        ceiling = tcp_ceiling(server_hosts, clients)
        start_at = time.time() + 3.0
        workers = []
        for host in clients:
            argv = [sys.executable, "-m", "benchmarks.link_bench", "--worker", json.dumps(servers),
                    str(secret), str(seconds), str(start_at)]  # fmt: skip
            if chunk_mb is not None:
                argv += ["--chunk-mb", str(chunk_mb)]
            env = None
            if pki is not None:
                from asyncgraph.net.tls import ENV_TLS_CA_FILE, ENV_TLS_CERT, ENV_TLS_KEY

                env = {**os.environ, ENV_TLS_CA_FILE: pki["ca"], ENV_TLS_CERT: pki["client_cert"],
                       ENV_TLS_KEY: pki["client_key"]}  # fmt: skip
            workers.append(host.popen(argv, stdout=subprocess.PIPE, cwd=ROOT, env=env))
        results = []
        for w in workers:
            out, _ = w.communicate(timeout=600)
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    link = _rate_bytes(rate)
    limit = link * len(server_hosts) if link is not None else None
    case: dict[str, Any] = {"hosts": n_hosts, "rate": rate, "client_hosts": len(clients),
                            "server_hosts": len(server_hosts), "link_limit_bytes_s": limit,
                            "tcp_ceiling_bytes_s": ceiling, "pull": {}, "chunk_mb": chunk_mb,
                            "slow_start_after_idle": slow_start_after_idle,
                            "tls": pki is not None}  # fmt: skip
    for size in SIZES:
        rows = sum(r["pull"][str(size)]["rows_s"] for r in results)
        p50 = max(r["pull"][str(size)]["p50_ms"] for r in results)
        case["pull"][str(size)] = {"rows_s": rows, "bytes_s": rows * ROW_BYTES, "p50_ms": p50,
                                   "of_link": rows * ROW_BYTES / limit if limit else None,
                                   "of_tcp": rows * ROW_BYTES / ceiling if ceiling else None}  # fmt: skip
    rows2 = sum(r["pull_inflight2"]["rows_s"] for r in results)
    case["pull_inflight2"] = {"size": SIZES[-1], "rows_s": rows2, "bytes_s": rows2 * ROW_BYTES,
                              "of_link": rows2 * ROW_BYTES / limit if limit else None}  # fmt: skip
    case["sample_req_s"] = sum(r["sample_req_s"] for r in results)
    return case


def _sysctl(netns: str, key: str, value: int) -> None:
    """Set ``key`` inside network namespace ``netns`` only (TCP sysctls are per namespace)."""
    subprocess.run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", f"{key}={value}"], check=True)


def _epoch_case(
    rate: str, part_config: Path, epochs: int, batch_size: int, threads: int = 0
) -> dict[str, Any]:
    """The launched GraphSAGE job (``examples/train_dist.py``, 2 partitions x 1 trainer, one per
    host) over links shaped to ``rate``: its epoch time against max(link transfer, compute),
    the transfer being the bytes each host sent through its tbf (``tc -s``) / the rate."""
    sys.path.insert(0, str(ROOT / "tests"))
    from nethosts import NetHosts

    with NetHosts(2) as nh:
        if rate != "none":
            bits = _rate_bytes(rate) or 0.0
            for i in range(2):
                nh.shape(i, rate, burst=f"{max(64 << 10, int(bits / 100))}b", latency="100ms")
        ip_config = nh.ip_config(nh.tmp / "ip_config.txt")
        argv = [sys.executable, "-m", "asyncgraph.launch", "--part-config", str(part_config),
                "--ip-config", str(ip_config), "--", sys.executable, "examples/train_dist.py",
                "--no-progress", "--eval-every", "0", "--epochs", str(epochs),
                "--batch-size", str(batch_size), "--num-threads", str(threads)]  # fmt: skip
        done = nh[0].run(argv, timeout=900, cwd=ROOT)
        if done.returncode != 0:
            tail = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            raise RuntimeError(f"launch failed ({done.returncode}):\n{tail}")
        sent = [nh.shaped_bytes(i) for i in range(2)] if rate != "none" else [0, 0]
    line = next(x for x in done.stdout.splitlines() if " RESULT " in x)
    result = json.loads(line.split(" RESULT ", 1)[1])
    link = _rate_bytes(rate)
    transfer = max(sent) / link if link else 0.0
    t = result["time"]
    bound = max(transfer, t["compute"])
    return {"rate": rate, "epochs": epochs, "batch_size": batch_size, "threads": threads,
            "epoch_s": t["epoch"] / epochs,
            "compute_s": t["compute"] / epochs, "wait_s": t["wait"] / epochs,
            "bytes_sent_per_host": sent, "transfer_s": transfer / epochs,
            "of_bound": t["epoch"] / bound if bound else None}  # fmt: skip


def _show_epoch(case: dict[str, Any]) -> None:
    busiest = max(case["bytes_sent_per_host"]) / 1e6 / case["epochs"]
    threads = f", {case['threads']} torch thread(s)" if case.get("threads") else ""
    print(f"epoch over {case['rate']} (2 hosts, 2 x 1 trainers, batch {case['batch_size']}{threads}): "
          f"{case['epoch_s']:.2f} s per epoch; compute {case['compute_s']:.2f} s, link transfer "
          f"{case['transfer_s']:.3f} s ({busiest:.1f} MB/epoch on the busiest link), waiting for "
          f"data {case['wait_s']:.3f} s: {case['of_bound']:.2f}x max(transfer, compute)")  # fmt: skip


def _show(case: dict[str, Any]) -> None:
    limit = case["link_limit_bytes_s"]
    head = f"{case['hosts']} hosts, {case['rate']}: link limit " + (
        f"{limit / 1e6:.0f} MB/s" if limit else "none"
    )
    knobs = ""
    if case.get("chunk_mb") is not None:
        knobs += f", pull chunks {case['chunk_mb']:g} MB" if case["chunk_mb"] else ", pull chunks off"
    if case.get("slow_start_after_idle") is not None:
        knobs += f", tcp_slow_start_after_idle={case['slow_start_after_idle']}"
    if case.get("tls"):
        knobs += ", TLS with client certificates"
    print(f"{head}, raw TCP {case['tcp_ceiling_bytes_s'] / 1e6:.0f} MB/s (same run){knobs}")
    for size, fig in case["pull"].items():
        ratio = f"{fig['of_link']:.2f}x link, " if fig["of_link"] is not None else ""
        rate = f"{fig['rows_s'] / 1e3:8.0f}k rows/s {fig['bytes_s'] / 1e6:7.0f} MB/s"
        print(f"  pull {int(size):>7,} rows: {rate} "
              f"({ratio}{fig['of_tcp']:.2f}x raw TCP), p50 {fig['p50_ms']:.1f} ms")  # fmt: skip
    two = case["pull_inflight2"]
    ratio2 = f" ({two['of_link']:.2f}x link)" if two["of_link"] is not None else ""
    print(f"  pull {two['size']:>7,} rows, 2 calls in flight: {two['bytes_s'] / 1e6:.0f} MB/s{ratio2}")
    print(f"  sample_neighbors 1,024 seeds fanout 10: {case['sample_req_s']:.0f} req/s")


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.link_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--hosts", type=int, nargs="*", default=[2, 4], help="host counts (none: no pulls)")
    parser.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per figure")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of the launched job (0: skip)")
    parser.add_argument("--batch-size", type=int, default=10, help="train_dist's (PubMed: 60 train nodes)")
    parser.add_argument("--out", type=Path, default=RESULTS / "link_bench.json", help="pulls, sampling")
    parser.add_argument(
        "--num-threads", type=int, default=0, help="torch threads per trainer (0: torch's default)"
    )
    parser.add_argument(
        "--chunk-mb", type=float, nargs="*", default=[None],
        help="pull chunk sizes to compare, MB (0: no chunks; default: the client's own)",
    )  # fmt: skip
    parser.add_argument(
        "--slow-start-after-idle", type=int, nargs="*", choices=(0, 1), default=[None],
        help="net.ipv4.tcp_slow_start_after_idle in the hosts' namespaces (default: as they start)",
    )  # fmt: skip
    parser.add_argument(
        "--tls", choices=("off", "on", "both"), default="off",
        help="servers and clients with TLS and client certificates (both: each case plain, then TLS)",
    )  # fmt: skip
    parser.add_argument(
        "--worker", nargs=4, metavar=("SERVERS", "SECRET", "SECONDS", "START"), help=argparse.SUPPRESS
    )
    ns = parser.parse_args()
    if ns.worker:
        servers = [(str(h), int(p)) for h, p in json.loads(ns.worker[0])]
        secret = Path(ns.worker[1]).read_bytes().strip()
        chunk = ns.chunk_mb[0] if ns.chunk_mb else None
        out = asyncio.run(_worker(servers, secret, float(ns.worker[2]), float(ns.worker[3]), chunk))
        print(json.dumps(out), flush=True)
        return 0
    for rate in ns.rates:
        _rate_bytes(rate)
    cases = []
    with tempfile.TemporaryDirectory(prefix="link-bench-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        part_config = _partition(work)
        pkis: list[dict[str, str] | None] = [None] if ns.tls == "off" else []
        if ns.tls != "off":
            from benchmarks.tls_bench import make_pki

            (work / "pki").mkdir()
            pkis += ([None] if ns.tls == "both" else []) + [make_pki(work / "pki")]
        for n_hosts in ns.hosts:
            for rate in ns.rates:
                for chunk in ns.chunk_mb:
                    for idle in ns.slow_start_after_idle:
                        for pki in pkis:
                            case = _run_case(n_hosts, rate, part_config, work, ns.seconds, chunk, idle, pki)
                            _show(case)
                            cases.append(case)
        epochs = []
        for rate in ns.rates if ns.epochs else ():
            epoch = _epoch_case(rate, part_config, ns.epochs, ns.batch_size, ns.num_threads)
            _show_epoch(epoch)
            epochs.append(epoch)
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0], "command": " ".join(sys.argv)}  # fmt: skip
    for path, rows in ((ns.out, cases), (RESULTS / "link_epoch.json", epochs)):
        if rows:  # each file keeps its last run's figures
            path.write_text(json.dumps({**meta, "cases": rows}, indent=1))
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
