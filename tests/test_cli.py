"""Every command-line tool answers bad input with one line on stderr and exit status 2 (never a
traceback), accepts DGL's underscore spellings, has --log-level and documents every option."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncgraph.testing import PACKAGE_ROOT, subprocess_env

TOOLS = {
    "server": "asyncgraph.server",
    "partition": "asyncgraph.partition",
    "launch": "asyncgraph.launch",
    "stage": "asyncgraph.launch.stage",
    "health": "asyncgraph.launch.health",
    "loadgen": "benchmarks.loadgen",
}


def run_tool(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(),
        cwd=PACKAGE_ROOT,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def _cases(part_config: Path, tmp: Path) -> list[tuple[str, list[str], list[str]]]:
    """(tool, argv, words the error line must contain)."""
    cfg = str(part_config)
    nope = str(tmp / "nope.json")
    ip = tmp / "ip.txt"
    ip.write_text("127.0.0.1 1\n127.0.0.1 2\n")
    return [
        ("server", ["--part-id", "0"], ["required", "--part-config"]),
        ("server", ["--part-config", nope, "--part-id", "0"], ["does not exist", "nope.json"]),
        ("server", ["--part-config", cfg, "--part-id", "7"], ["--part-id 7 out of range", "0..1"]),
        ("server", ["--part-config", cfg, "--part-id", "x"], ["invalid int value"]),
        ("server", ["--part-config", cfg, "--part-id", "0", "--secret-file", nope], ["does not exist"]),
        ("server", ["--part-config", str(PACKAGE_ROOT / "pyproject.toml"), "--part-id", "0"], ["invalid"]),
        ("partition", ["--graph-name", "g", "--num-parts", "2", "--out", str(tmp / "o")], ["--input"]),
        (
            "partition",
            ["--input", nope, "--graph-name", "g", "--num-parts", "2", "--out", str(tmp / "o")],
            ["does not exist"],
        ),
        ("launch", ["--", "true"], ["required", "--part-config"]),
        ("launch", ["--part-config", nope, "--", "true"], ["does not exist"]),
        ("launch", ["--part-config", cfg, "--ip-config", nope, "--", "true"], ["does not exist"]),
        ("launch", ["--part-config", cfg], ["trainer command"]),
        ("stage", ["--part-config", cfg, "--ip-config", str(ip)], ["required", "--dest"]),
        (
            "stage",
            ["--part-config", nope, "--ip-config", str(ip), "--dest", str(tmp / "d")],
            ["does not exist"],
        ),
        ("health", [], ["required", "--port"]),
        ("health", ["--port", "1", "--secret-file", nope], ["does not exist"]),
        ("health", ["--port", "0"], ["--port"]),
        ("loadgen", ["--part-config", nope, "--duration", "0.1"], ["does not exist"]),
        ("loadgen", ["--part-config", cfg, "--partitions", "3"], ["has 2 partitions"]),
        ("loadgen", ["--ip-config", nope], ["does not exist"]),
        ("loadgen", ["--secret-file", nope], ["--secret-file goes with --ip-config"]),
        ("loadgen", ["--clients"], ["expected one argument"]),
    ]


def test_bad_input_is_one_line_and_status_2(cora2, tmp_path: Path) -> None:
    failures = []
    for tool, argv, needles in _cases(cora2.part_config, tmp_path):
        proc = run_tool(TOOLS[tool], *argv)
        try:
            assert_one_line_error(proc, *needles)
        except AssertionError as exc:
            failures.append(f"{tool} {argv}: {exc}")
    assert not failures, "\n".join(failures)


def test_underscore_aliases_are_accepted(cora2, tmp_path: Path) -> None:
    # each reaches the check after parsing (so the alias was understood), not an argparse error
    proc = run_tool("asyncgraph.server", "--part_config", str(cora2.part_config), "--part_id", "9")
    assert_one_line_error(proc, "--part-id 9 out of range")
    proc = run_tool(
        "asyncgraph.launch", "--part_config", str(cora2.part_config), "--num_trainers", "0", "--", "true"
    )
    assert_one_line_error(proc, "--num-trainers must be at least 1")
    proc = run_tool(
        "asyncgraph.partition",
        "--input",
        str(tmp_path / "x.npz"),
        "--graph_name",
        "g",
        "--num_parts",
        "2",
        "--out",
        str(tmp_path / "o"),
    )
    assert_one_line_error(proc, "does not exist")
    proc = run_tool(
        "asyncgraph.launch",
        "--part_config",
        str(cora2.part_config),
        "--ip_config",
        str(tmp_path / "none"),
        "--",
        "true",
    )
    assert_one_line_error(proc, "does not exist")


def test_dgl_launch_spellings(cora2) -> None:
    proc = run_tool(
        "asyncgraph.launch", "--part_config", str(cora2.part_config), "--num_servers", "0", "--", "true"
    )
    assert_one_line_error(proc, "at least one server per partition")
    args = _parsers()["launch"].parse_args(
        [
            "--part_config",
            "x.json",
            "--num_trainers",
            "2",
            "--num_servers",
            "1",
            "--ip_config",
            "ip.txt",
            "--",
            "t",
        ]
    )
    assert (args.part_config.name, args.num_trainers, args.num_servers, args.ip_config.name) == (
        "x.json",
        2,
        1,
        "ip.txt",
    )
    args = _parsers()["partition"].parse_args(
        ["--input", "g.npz", "--graph_name", "g", "--num_parts", "4", "--part_method", "random", "--out", "o"]
    )
    assert (args.num_parts, args.method, args.graph_name) == (4, "random", "g")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from asyncgraph.launch import build_parser as launch_parser
    from asyncgraph.launch.health import main as _health  # noqa: F401 - imported for its module
    from asyncgraph.launch.stage import build_parser as stage_parser
    from asyncgraph.partition.__main__ import build_parser as partition_parser
    from asyncgraph.server.__main__ import build_parser as server_parser
    from benchmarks.loadgen.cli import build_parser as loadgen_parser

    return {
        "server": server_parser(),
        "partition": partition_parser(),
        "launch": launch_parser(),
        "stage": stage_parser(),
        "loadgen": loadgen_parser(),
    }


@pytest.mark.parametrize("tool", ["server", "partition", "launch", "stage", "loadgen"])
def test_help_documents_every_option_and_log_level(tool: str) -> None:
    parser = _parsers()[tool]
    undocumented = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
    assert not undocumented, undocumented
    assert any("--log-level" in a.option_strings for a in parser._actions)
    shown = parser.format_help()
    assert "--log-level" in shown and "--log_level" not in shown  # aliases stay out of --help


def test_health_help_and_log_level() -> None:
    proc = run_tool("asyncgraph.launch.health", "--help")
    assert proc.returncode == 0 and "--log-level" in proc.stdout and "--secret-file" in proc.stdout
    assert "server port" in proc.stdout


def test_loadgen_serves_every_partition_and_writes_to_out(cora2, tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = run_tool(
        "benchmarks.loadgen",
        "--part-config", str(cora2.part_config),
        "--duration", "0.5", "--warmup", "0.1", "--clients", "2", "--processes", "1",
        "--rows", "20", "--no-progress", "--out", str(out), "--tag", "t",
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "loadgen-t.json").read_text())
    assert len(result["servers"]["peak_rss"]) == 2  # one server per partition of cora2
    assert result["total"]["requests_per_s"] > 0 and result["total"]["errors"] == 0
    assert (out / "loadgen-t-cdf.png").stat().st_size > 0
    loadgen = PACKAGE_ROOT / "benchmarks" / "loadgen"
    assert not [
        p for p in loadgen.glob("*.py") if "from tests" in p.read_text() or "import tests" in p.read_text()
    ]
