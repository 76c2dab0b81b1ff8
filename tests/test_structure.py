"""The package's shape, as docs/design.md states it: no import circle (imports under
``TYPE_CHECKING`` and inside functions count: they are coupling too), no module over the size
limit, and the arrows that must not exist (the server never imports the trainer's client).

Read from the source with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "asyncgraph"
MAX_LINES = 470


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target)
            if resolved is not None and resolved != module:
                found.add(resolved)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_the_detector_finds_a_circle() -> None:
    """The check itself works: a made-up circle is found."""
    saved = dict(GRAPH)
    try:
        GRAPH["asyncgraph.errors"] = {*GRAPH["asyncgraph.errors"], "asyncgraph.names"}
        GRAPH["asyncgraph.names"] = {*GRAPH["asyncgraph.names"], "asyncgraph.errors"}
        assert ["asyncgraph.errors", "asyncgraph.names"] in _cycles()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_no_import_circle() -> None:
    assert _cycles() == []


@pytest.mark.parametrize(
    ("below", "above"),
    [
        ("asyncgraph.server", "asyncgraph.client"),
        ("asyncgraph.server", "asyncgraph.distributed"),
        ("asyncgraph.storage", "asyncgraph.server"),
        ("asyncgraph.storage", "asyncgraph.client"),
        ("asyncgraph.protocol", "asyncgraph.net"),
        ("asyncgraph.net", "asyncgraph.client"),
        ("asyncgraph.kernels", "asyncgraph.client"),
        ("asyncgraph.dataloading", "asyncgraph.service"),
        # serving is a layer over the client, never over the server's internals
        ("asyncgraph.serve", "asyncgraph.server"),
        ("asyncgraph.client", "asyncgraph.serve"),
        ("asyncgraph.server", "asyncgraph.serve"),
    ],
)
def test_no_arrow_upwards(below: str, above: str) -> None:
    wrong = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        if m == below or m.startswith(below + ".")
        for t in targets
        if t == above or t.startswith(above + ".")
    )
    assert wrong == []


def test_production_code_does_not_import_the_test_helpers() -> None:
    users = sorted(m for m, targets in GRAPH.items() if "asyncgraph.testing" in targets)
    assert users == []


def test_no_module_over_the_size_limit() -> None:
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}
