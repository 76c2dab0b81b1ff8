"""Reports: text tables, latency CDFs, sweep plots, the saturation knee, JSON results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS
from benchmarks.loadgen.worker import LatencyHistogram


def format_report(result: dict[str, Any], ceilings: dict[str, Any] | None = None) -> str:
    """A plain table per op, the servers' resources and the ceilings."""
    cfg = result["config"]
    mode = f"open loop at {cfg['rate']:,.0f} req/s" if cfg["rate"] else "closed loop"
    lines = [
        f"{mode}, {cfg['clients']} clients in {cfg['processes']} processes, rows {cfg['rows']}, "
        f"fanout {cfg['fanout']}, window {result['window_s']:.1f} s",
        f"{'op':>7} {'req/s':>9} {'rows/s':>11} {'MB/s':>8} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'max ms':>8} {'dropped':>8}  errors",
    ]
    for op, r in result["ops"].items():
        errors = ", ".join(f"{k}={v}" for k, v in r["errors"].items()) or "none"
        lines.append(
            f"{op:>7} {r['requests_per_s']:>9,.0f} {r['rows_per_s']:>11,.0f} {r['MB_per_s']:>8,.1f} "
            f"{r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.1f} "
            f"{r['dropped']:>8}  {errors}"
        )
    srv = result["servers"]
    if "peak_rss" in srv:
        for i, (idle, peak, cpu) in enumerate(
            zip(srv["idle_rss"], srv["peak_rss"], srv["cpu_percent"], strict=True)
        ):
            lines.append(
                f"server {i}: RSS idle {idle / 2**20:,.0f} MiB, peak {peak / 2**20:,.0f} MiB, CPU {cpu:.0f}%"
            )
    if ceilings:
        lines.append(f"ceiling: loopback TCP {ceilings['loopback_MB_per_s']:,.0f} MB/s (one stream)")
        if "gather" in ceilings:
            g, k = ceilings["gather"], ceilings["sample_kernel"]
            lines.append(
                f"ceiling: numpy gather of {cfg['rows']} rows {g['rows_per_s']:,.0f} rows/s "
                f"({g['MB_per_s']:,.0f} MB/s); sample_csc {k['seeds_per_s']:,.0f} seeds/s "
                f"({k['edges_per_s']:,.0f} edges/s), one core, in-process"
            )
    return "\n".join(lines)


def plot_cdf(result: dict[str, Any], path: Path, title: str) -> None:
    """Latency CDF per op (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for op, r in result["ops"].items():
        x, y = LatencyHistogram.from_dict(r["hist"]).cdf()
        if x.size:
            ax.step(x * 1e3, y, where="post", label=f"{op} (p99 {r['p99_ms']:.1f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(points: list[dict[str, Any]], path: Path, title: str) -> None:
    """Throughput and p99 against client count, one line per partition count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for parts in sorted({p["partitions"] for p in points}):
        pts = sorted((p for p in points if p["partitions"] == parts), key=lambda p: p["clients"])
        xs = [p["clients"] for p in pts]
        ax1.plot(xs, [p["result"]["total"]["requests_per_s"] for p in pts], "o-", label=f"{parts} partitions")
        for op in pts[0]["result"]["ops"]:
            ax2.plot(
                xs, [p["result"]["ops"][op]["p99_ms"] for p in pts], "o-", label=f"{op}, {parts} partitions"
            )
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("requests/s (all ops)")
    ax2.set_ylabel("p99 latency (ms, log)")
    ax2.set_yscale("log")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def saturation(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per partition count: peak throughput, the fewest clients reaching 90% of it, and p99 there."""
    out: dict[str, Any] = {}
    for parts in sorted({p["partitions"] for p in points}):
        pts = sorted((p for p in points if p["partitions"] == parts), key=lambda p: p["clients"])
        peak = max(p["result"]["total"]["requests_per_s"] for p in pts)
        knee = next(p for p in pts if p["result"]["total"]["requests_per_s"] >= 0.9 * peak)
        out[str(parts)] = {
            "peak_requests_per_s": peak,
            "saturating_clients": knee["clients"],
            "p99_ms_at_knee": knee["result"]["total"]["p99_ms"],
            "p99_ms_at_max_clients": pts[-1]["result"]["total"]["p99_ms"],
            "max_clients": pts[-1]["clients"],
        }
    return out


def save(data: dict[str, Any], name: str, out: Path = RESULTS) -> Path:
    """Write ``out/<name>.json`` (creating ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=float))
    return path


def strip_hists(result: dict[str, Any]) -> dict[str, Any]:
    return {
        **result,
        "ops": {op: {k: v for k, v in r.items() if k != "hist"} for op, r in result["ops"].items()},
    }
