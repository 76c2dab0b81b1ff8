"""Benchmark tables generated from ``benchmarks/results/*.json``: an MkDocs hook, and a script.

The site's "Results (generated)" page is written at build time from the JSON files the benchmarks
themselves write, so its figures never drift from the measurements the way hand-copied tables
did. MkDocs runs ``on_files`` (``hooks:`` in ``mkdocs.yml``); ``python docs/gen_benchmarks.py``
prints the same page. Any JSON shape renders: scalars as a field/value table, a dict of records
(or a list of them) as one table, deeper dicts under their own heading; long lists of numbers
are summarised. The headline benchmarks come first, with a line on what each measures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
PAGE = "benchmarks/results.md"

# (file stem, title, what it measures and the command that writes it)
HEADLINE: list[tuple[str, str, str]] = [
    ("train_bench", "Training epoch and sampling",
     "GraphSAGE epochs on 2^20 nodes / 10.6M edges with 2 servers and 2 trainers, prefetch 0 and 2, "
     "and `sample_neighbors` rates, next to DGL 2.1's figures (`python -m benchmarks.train_bench`)."),
    ("gpu_suite", "The data path that feeds an accelerator",
     "Loader alone with 0 / 1 / 2 worker processes and threads, a GIL-holding step against the "
     "data path's limit, CPU trainers, and GPU epochs where CUDA is present "
     "(`python -m benchmarks.gpu_suite`)."),
    ("inference_bench", "Layer-wise inference",
     "Nodes per second of `layerwise_inference` with 1 and 2 trainers, next to a compute-only "
     "ceiling and DGL 2.1's layer-wise `inference()` on the same graph "
     "(`python -m benchmarks.inference_bench`)."),
    ("pull_bench", "Pulls and pushes",
     "Rows per second of feature pulls and pushes of 1k / 10k / 100k rows: local (shared "
     "memory), remote (socket) and mixed, against the gather and socket ceilings "
     "(`python -m benchmarks.pull_bench`)."),
    ("link_bench", "Across hosts: pulls and samples over a shaped link",
     "Two network-namespace hosts, links shaped by `tc tbf`: pulls as a share of the link, "
     "`sample_neighbors` requests per second (`python -m benchmarks.link_bench`, root)."),
    ("link_bench_dgl", "Across hosts: DGL 2.1 on the same links",
     "DGL 2.1's pulls and samples on the same shaped links, for comparison with the above."),
    ("partition_bench", "Partitioning",
     "Wall time and peak memory of METIS and random partitioning of the 2^20-node graph "
     "(`python -m benchmarks.partition_bench`)."),
    ("chunked_bench", "Out-of-core partitioning from DGL's chunked format",
     "Time, peak memory, cut and balance of `python -m asyncgraph.partition` on chunked input "
     "(`python -m benchmarks.chunked_bench`)."),
    ("pyg_bench", "PyG's loaders over asyncgraph",
     "`asyncgraph.pyg` loaders against asyncgraph's own (`python -m benchmarks.pyg_bench`)."),
    ("live_bench", "A live graph: updates, staleness, sampling under updates, compaction",
     "On the 2^20-node graph with 2 servers: edges/s acknowledged for batches of 1, 100 and 10k "
     "(with and without `--wal`), acknowledgement-to-sample staleness, sampling while 10k edges/s "
     "are added beside the static rate, and compaction of a 10% overlay "
     "(`python -m benchmarks.live_bench`)."),
]

MAX_ROWS = 40  # rows of one table; the rest are counted
MAX_LIST = 8  # a list of scalars longer than this is summarised (count, min, max)
MAX_DEPTH = 3  # nested dicts below this many headings are flattened into one table


def _cell(value: Any) -> str:
    """One table cell: numbers formatted for reading, text escaped for Markdown."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    text = " ".join(str(value).split())
    if len(text) > 160:
        text = text[:157] + "..."
    for char in "\\|*_`[]<>":
        text = text.replace(char, "\\" + char)
    return text


def _number(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    size = abs(value)
    if size == 0:
        return "0"
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _is_scalar(value: Any) -> bool:
    if isinstance(value, list):
        return len(value) <= MAX_LIST and all(_is_scalar(v) and not isinstance(v, list) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _summary(values: list[Any]) -> str:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if numbers and len(numbers) == len(values):
        return f"{len(values):,} values, {_number(float(min(numbers)))} to {_number(float(max(numbers)))}"
    return f"{len(values):,} item{'s' if len(values) != 1 else ''}"


def _flatten(record: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """A record's scalar fields, nested dicts as ``a.b`` (two levels), long lists summarised."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if _is_scalar(value):
            flat[name] = value
        elif isinstance(value, dict) and depth < 2:
            flat.update(_flatten(value, name + ".", depth + 1))
        elif isinstance(value, list):
            flat[name] = _summary(value)
        else:
            flat[name] = f"{len(value):,} fields"
    return flat


def _is_records(value: Any) -> bool:
    """A dict or list whose items are all dicts: one table, a row per item."""
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    return bool(items) and all(isinstance(item, dict) for item in items)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        lines += ["", f"({len(rows) - MAX_ROWS:,} more rows in the JSON file)"]
    return [*lines, ""]


def _records_table(value: dict[str, Any] | list[Any]) -> list[str]:
    keys = list(value.keys()) if isinstance(value, dict) else [str(i) for i in range(len(value))]
    items = list(value.values()) if isinstance(value, dict) else list(value)
    flats = [_flatten(item) for item in items]
    columns: list[str] = []
    for flat in flats:
        columns += [c for c in flat if c not in columns]
    if len(columns) > 10 and len(keys) < len(columns):  # wide and short: a column per record
        return _table(["", *keys], [[c, *(f.get(c) for f in flats)] for c in columns])
    rows = [[k, *(f.get(c) for c in columns)] for k, f in zip(keys, flats, strict=True)]
    return _table(["", *columns], rows)


def render(value: Any, level: int, depth: int = 0) -> list[str]:
    """Markdown for one JSON value, headings starting at ``level``."""
    if _is_records(value):
        return _records_table(value)
    if not isinstance(value, dict):
        return [_cell(value) if _is_scalar(value) else _summary(value), ""]
    if depth >= MAX_DEPTH:
        return _table(["field", "value"], [[k, v] for k, v in _flatten(value).items()])
    lines: list[str] = []
    scalars = [[k, v if _is_scalar(v) else _summary(v)] for k, v in value.items()
               if _is_scalar(v) or (isinstance(v, list) and not _is_records(v))]
    if scalars:
        lines += _table(["field", "value"], scalars)
    for key, child in value.items():
        if _is_scalar(child) or (isinstance(child, list) and not _is_records(child)):
            continue
        lines += [f"{'#' * min(level, 6)} {_cell(key)}", ""]
        lines += render(child, level + 1, depth + 1)
    return lines


def render_file(path: Path, level: int) -> list[str]:
    """One result file: its tables, or one line saying why it could not be read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"`{path.name}` could not be read: {_cell(str(exc))}", ""]
    return [f"Generated from `benchmarks/results/{path.name}`.", "", *render(data, level)]


def render_page(results: Path = RESULTS) -> str:
    """The whole page: headline benchmarks first, then every other result file by name."""
    files = {p.stem: p for p in sorted(results.glob("*.json"))}
    lines = [
        "# Benchmark results (generated)",
        "",
        "Every table on this page is generated when the site is built, from the JSON files the",
        "benchmarks write into `benchmarks/results/` (`docs/gen_benchmarks.py`): rerun a benchmark",
        "and rebuild, and the page follows. What each figure means, the ceilings measured beside",
        "it and which targets are met: `benchmarks/README.md` and the [Benchmarks](index.md) page.",
        "Times are seconds, rates per second, unless a field's name says otherwise.",
        "",
    ]
    shown = set()
    for stem, title, what in HEADLINE:
        if stem not in files:
            continue
        shown.add(stem)
        lines += [f"## {title}", "", what, ""]
        lines += render_file(files[stem], 3)
    others = [stem for stem in files if stem not in shown]
    if others:
        lines += ["## Every other result file", ""]
        for stem in others:
            lines += [f"### {stem}", ""]
            lines += render_file(files[stem], 4)
    return "\n".join(lines) + "\n"


SIDE_BY_SIDE = "<!-- generated: side-by-side -->"


def _load(results: Path, stem: str) -> Any:
    return json.loads((results / f"{stem}.json").read_text())


def _mrows(runs: dict[str, Any]) -> str:
    return " / ".join(f"{runs[size]['rows_s'] / 1e6:.2f}" for size in ("1000", "10000", "100000"))


def side_by_side(results: Path = RESULTS) -> str:
    """The same-day table against DGL 2.1 (``benchmarks/README.md`` §0), from its result files:
    ours from the ``*_dgl20`` runs on DGL's graph, DGL's from ``dgl_reference.json``. A row whose
    file or field is missing is left out rather than guessed."""

    def partition() -> tuple[str, str]:
        ours = next(r for r in _load(results, "partition_bench_dgl20")["results"] if r["method"] == "metis")
        dgl = _load(results, "dgl_reference")["partition"]["metis2"]
        return (f"{ours['wall_s']:.1f} s, {ours['peak_rss_gib']:.1f} GiB peak",
                f"{dgl['wall_s']:.1f} s, {dgl['peak_rss_gib']:.1f} GiB")

    def startup() -> tuple[str, str]:
        ours = _load(results, "pull_bench_dgl20")["startup"]["clients_ready_s"]
        return f"{ours:.1f} s", f"{_load(results, 'dgl_reference')['startup_s']:.1f} s"

    def pulls(kind: str) -> tuple[str, str]:
        ours = _load(results, "pull_bench_dgl20")[kind]["mixed"]
        dgl = _load(results, "dgl_reference")[f"{kind}_mixed"]
        note = (", acknowledged", ", never acknowledged") if kind == "push" else ("", "")
        return _mrows(ours) + note[0], _mrows(dgl) + note[1]

    def sampling() -> tuple[str, str]:
        ours = _load(results, "sample_trainers_dgl20")["sample_neighbors"]
        dgl = _load(results, "dgl_reference")["sample_neighbors"]
        cases = ("trainers2_own_partition_shm", "trainers2_socket", "standalone")
        return (" / ".join(f"{ours[c]['requests_per_s']:,.0f}" for c in cases),
                f"{dgl['distributed']['requests_per_s']:,.0f} (its distributed mode: own partition in shm)"
                f" / – / {dgl['standalone']['requests_per_s']:,.0f}")

    def compute() -> tuple[str, str]:
        run = _load(results, "compute_vs_dgl")
        return f"{run['ours_ms_per_batch']:.1f} ms", f"{run['dgl_ms_per_batch']:.1f} ms"

    def epoch() -> tuple[str, str]:
        ours = _load(results, "train_bench_dgl20")["training"]["prefetch2"]
        dgl = _load(results, "dgl_reference")["training"]
        return (f"{ours['epoch_s']:.2f} s (waiting for data {ours['wait_fraction']:.1%})",
                f"{dgl['epoch_s']:.2f} s (no overlap)")

    def accelerator() -> tuple[str, str]:
        ours = _load(results, "train_bench_dgl20")["accelerator_like"]["sim40"]
        dgl = _load(results, "dgl_reference")["training_sim"]
        return f"{ours['epoch_s']:.2f} s (limit {ours['limit_s']:.2f} s)", f"{dgl['epoch_s']:.2f} s"

    rows = [
        ("partition, METIS 2-way", partition),
        ("start-up: servers started -> trainers ready", startup),
        ("mixed pulls 1k / 10k / 100k rows (M rows/s)", lambda: pulls("pull")),
        ("mixed pushes 1k / 10k / 100k rows (M rows/s)", lambda: pulls("push")),
        ("`sample_neighbors` 1,024 seeds, 2 trainers at once, rates added (DGL's harness), req/s: own "
         "partition in shm, the other over the socket / everything over the socket / standalone (1 process)",
         sampling),
        ("GraphSAGE compute per batch, same blocks, one thread", compute),
        ("GraphSAGE epoch, real compute (2 trainers, 53 batches each)", epoch),
        ("same epoch with a 40 ms accelerator-like step", accelerator),
    ]
    lines = ["| | asyncgraph | DGL 2.1 |", "|---|---|---|"]
    for label, cells in rows:
        try:
            ours, dgl = cells()
        except (OSError, ValueError, KeyError, StopIteration, TypeError):
            continue
        lines.append(f"| {label} | {ours} | {dgl} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the Benchmarks page's side-by-side table, generated where its marker stands."""
    return markdown.replace(SIDE_BY_SIDE, side_by_side()) if SIDE_BY_SIDE in markdown else markdown


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the site's files before the nav is built."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render_page()))
    return files


if __name__ == "__main__":
    print(render_page(), end="")
