"""The plot of ``benchmarks.e2e_scale`` (and its DGL counterpart's) results JSON.

Top: memory over time, the stages one after the other (the stage's process tree's PSS, the
machine's memory "used" and its shared memory); bottom: each stage's wall time.
``python -m benchmarks.e2e_plot RESULTS.json`` redraws ``RESULTS.png`` from the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def plot(doc: dict[str, Any], path: Path) -> None:
    """Draw ``doc`` (a results JSON as written) into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = float(1 << 30)
    cols = doc["series_columns"]
    stages = [(k, v) for k, v in doc["stages"].items() if not v.get("cached")]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.2, 6.0), gridspec_kw={"height_ratios": [3, 1.4]})
    offset = 0.0
    labels = {
        "tree_pss": "stage's processes (PSS)",
        "machine_used": 'machine "used"',
        "shmem": "shared memory",
    }
    for i, (name, row) in enumerate(stages):
        pts = doc["series"].get(name, [])
        if pts:
            t = [offset + p[0] for p in pts]
            for key, color in (("tree_pss", "C0"), ("machine_used", "C3"), ("shmem", "C2")):
                j = cols.index(key)
                top.plot(
                    t, [p[j] / gib for p in pts], color=color, lw=1.2, label=labels[key] if i == 0 else None
                )
        top.axvline(offset, color="0.6", lw=0.6, ls=":")
        top.text(
            offset, 0.98, f" {name}", transform=top.get_xaxis_transform(), va="top", rotation=90, fontsize=8
        )
        offset += float(row.get("wall_s", 0.0))
    g = doc["graph"]
    top.set_ylabel("GiB")
    top.set_xlabel("seconds (stages one after the other)")
    top.set_title(
        f"{doc['benchmark']}: 2^{g['scale']} nodes, {g.get('edges', 0):,} edges, "
        f"input {g.get('input_bytes', 0) / gib:.2f} GiB ({doc['date'][:10]})",
        fontsize=9,
        pad=14,
    )
    top.grid(True, alpha=0.3)
    top.legend(fontsize=8, loc="upper right")
    names = [n for n, _ in stages]
    walls = [float(r.get("wall_s", 0.0)) for _, r in stages]
    bars = bottom.barh(names, walls, color="C1")
    bottom.bar_label(bars, labels=[f"{w:.1f} s" for w in walls], fontsize=8, padding=2)
    bottom.invert_yaxis()
    bottom.set_xlabel("wall seconds")
    bottom.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        plot(json.loads(Path(arg).read_text()), Path(arg).with_suffix(".png"))
        print(f"wrote {Path(arg).with_suffix('.png')}")
