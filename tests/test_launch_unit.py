"""Launcher pieces that need no processes: ssh command construction, argument checks."""

from __future__ import annotations

import shlex

from asyncgraph.launch import _remote, free_port, main


def test_remote_command_quotes_everything() -> None:
    argv = _remote("node-3", ["python", "train.py", "--name", "a b"], {"RANK": "1", "X": "it's"}, "/work dir")
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"]
    assert argv[5] == "node-3"
    words = shlex.split(argv[6])
    assert words[:3] == ["cd", "/work dir", "&&"]
    assert words[3:6] == ["env", "RANK=1", "X=it's"]
    assert words[6:] == ["python", "train.py", "--name", "a b"]


def test_free_port_is_bindable() -> None:
    assert 1024 <= free_port() <= 65535


def test_missing_command_and_bad_trainer_count_exit_2(cora2, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--part-config", str(cora2.part_config)]) == 2
    assert "trainer command" in capsys.readouterr().err
    assert main(["--part-config", str(cora2.part_config), "--num-trainers", "0", "--", "true"]) == 2
