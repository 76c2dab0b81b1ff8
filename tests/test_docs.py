"""The documentation site's code: every Python block of ``docs/`` compiles and its imports resolve,
the chunked-format end-to-end example of "Coming from DGL" runs as written (its Python block and
its partition command, on the bundled PubMed), and the benchmark page is generated from every
JSON result file. The site itself is built with ``mkdocs build --strict`` in ``.ci/run``."""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def _blocks(language: str) -> list[tuple[str, int, str]]:
    """(page, block number, source) of every fenced block of ``language`` in the docs pages."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        blocks = [m.group(2) for m in FENCE.finditer(page.read_text()) if m.group(1) == language]
        found += [(str(page.relative_to(ROOT)), i, src) for i, src in enumerate(blocks)]
    return found


PYTHON_BLOCKS = _blocks("python")


def test_docs_have_python_blocks() -> None:
    """The extraction finds the pages' examples (a broken pattern would pass every check below)."""
    pages = {page for page, _, _ in PYTHON_BLOCKS}
    assert len(PYTHON_BLOCKS) >= 10, PYTHON_BLOCKS
    assert {"docs/guides/train.md", "docs/coming-from-pyg.md", "docs/coming-from-dgl.md"} <= pages


def _imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    """(module, name) for every import of a block; name None for ``import module``."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, alias.name) for alias in node.names]
    return out


@pytest.mark.parametrize(
    ("page", "number", "source"), [pytest.param(*b, id=f"{b[0]}#{b[1]}") for b in PYTHON_BLOCKS]
)
def test_python_block_compiles_and_imports_resolve(page: str, number: int, source: str) -> None:
    """Each block is valid Python (top-level ``await`` allowed: the async API's snippet) and every
    name it imports exists, so a renamed module or function breaks the docs' build, not a reader."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(source, f"{page}#{number}", "exec", flags=flags)
    for module, name in _imports(tree):
        mod = importlib.import_module(module)
        if name is not None and name != "*" and not hasattr(mod, name):
            importlib.import_module(f"{module}.{name}")  # a submodule: ImportError if it is not one


def test_dgl_chunked_end_to_end_example_runs(tmp_path: Path) -> None:
    """The "Coming from DGL" example as written: its Python block writes DGL's chunked format,
    then its first shell command partitions it out of core into a servable 2-part config."""
    from asyncgraph.partition import load_partition_book
    from asyncgraph.testing import subprocess_env

    page = (DOCS / "coming-from-dgl.md").read_text()
    section = page.split("## End to end: from DGL's chunked format", 1)[1].split("\n## ", 1)[0]
    blocks = {m.group(1): m.group(2) for m in FENCE.finditer(section)}
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 120}
    res = subprocess.run([sys.executable, "-c", blocks["python"]], **run, check=False)  # type: ignore[call-overload]
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "data/pubmed_chunked/metadata.json").read_text())["graph_name"] == "pubmed"
    partition_cmd = blocks["bash"].split("python -m asyncgraph.launch", 1)[0].replace("\\\n", " ")
    argv = shlex.split(partition_cmd)
    assert argv[:3] == ["python", "-m", "asyncgraph.partition"], argv
    res = subprocess.run([sys.executable, *argv[1:]], **run, check=False)  # type: ignore[call-overload]
    assert res.returncode == 0, res.stderr[-3000:]
    book, name, _, _ = load_partition_book(str(tmp_path / "data/pubmed2c/pubmed.json"))
    assert name == "pubmed" and book.num_partitions() == 2


def _gen_benchmarks():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(DOCS))
    try:
        return importlib.import_module("gen_benchmarks")
    finally:
        sys.path.remove(str(DOCS))


def test_benchmark_page_covers_every_result_file() -> None:
    """The generated page has a section per JSON result, the headline ones first, and numbers
    taken from the files (train_bench's epoch time appears as the file has it)."""
    gen = _gen_benchmarks()
    page = gen.render_page()
    results = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    for path in results:
        assert f"`benchmarks/results/{path.name}`" in page, path.name
    headline = page.index("## Training epoch and sampling")
    assert headline < page.index("## Every other result file")
    epoch = json.loads((ROOT / "benchmarks/results/train_bench.json").read_text())["training"]["prefetch2"]
    rows = [line for line in page.splitlines() if line.startswith("| epoch\\_s | ")]
    assert any(f" {gen._number(epoch['epoch_s'])} |" in row for row in rows), rows


def test_side_by_side_table_is_generated_from_the_results() -> None:
    """The Benchmarks page's table against DGL 2.1 is built from the JSON files where its marker
    stands: every row present, DGL's start-up and our epoch as the files have them."""
    gen = _gen_benchmarks()
    page = (DOCS / "benchmarks" / "index.md").read_text()
    assert gen.SIDE_BY_SIDE in page and "| partition, METIS 2-way |" not in page  # not by hand
    table = gen.on_page_markdown(page, None, None, None)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "asyncgraph | DGL" not in line]
    assert len(rows) == 8, rows
    results = ROOT / "benchmarks" / "results"
    startup = json.loads((results / "dgl_reference.json").read_text())["startup_s"]
    epoch = json.loads((results / "train_bench_dgl20.json").read_text())["training"]["prefetch2"]["epoch_s"]
    (startup_row,) = [row for row in rows if row.startswith("| start-up")]
    assert startup_row.endswith(f"| {startup:.1f} s |"), startup_row
    assert f"| {epoch:.2f} s (waiting for data" in table
