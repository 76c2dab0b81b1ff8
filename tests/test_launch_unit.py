"""Launcher pieces that need no processes: argument checks, ports, thread shares (ssh command
lines and the remote agent: tests/test_launch_remote.py)."""

from __future__ import annotations

from asyncgraph.launch import main
from asyncgraph.launch.processes import free_port


def test_free_port_is_bindable() -> None:
    assert 1024 <= free_port() <= 65535


def test_missing_command_and_bad_trainer_count_exit_2(cora2, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--part-config", str(cora2.part_config)]) == 2
    assert "trainer command" in capsys.readouterr().err
    assert main(["--part-config", str(cora2.part_config), "--num-trainers", "0", "--", "true"]) == 2


def test_omp_threads_share_and_remote_form() -> None:
    from asyncgraph.launch.processes import omp_threads

    assert omp_threads(16, 4) == 4 and omp_threads(2, 4) == 1 and omp_threads(7, 2) == 3


def test_launcher_sets_omp_num_threads_unless_user_did(cora2, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from asyncgraph.launch.processes import local_cores, omp_threads
    from asyncgraph.testing import subprocess_env

    probe = [sys.executable, "-c", "import os; print('OMP=' + os.environ['OMP_NUM_THREADS'])"]
    cmd = [sys.executable, "-m", "asyncgraph.launch", "--part-config", str(cora2.part_config)]
    cmd += ["--num-trainers", "2", "--", *probe]
    env = subprocess_env()
    env.pop("OMP_NUM_THREADS", None)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    want = omp_threads(local_cores(), 4)  # 2 partitions x 2 trainers, all on this host
    assert res.stdout.count(f"OMP={want}") == 4, res.stdout
    res = subprocess.run(
        cmd, env={**env, "OMP_NUM_THREADS": "3"}, capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0 and res.stdout.count("OMP=3") == 4, res.stdout + res.stderr[-2000:]
