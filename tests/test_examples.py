"""The examples run standalone on Cora for one epoch, as a user would start them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncgraph.testing import subprocess_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script", ["node_classification.py", "node_embedding.py", "link_prediction.py"])
def test_example_runs_one_epoch_standalone(script: str) -> None:
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("ASYNCGRAPH_")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=os.fspath(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 0: loss" in proc.stdout


def test_link_prediction_learns() -> None:
    """Three epochs on Cora score held-out edges well above chance (AUC 0.5)."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("ASYNCGRAPH_")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "link_prediction.py"), "--epochs", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=os.fspath(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    auc = float(proc.stdout.rsplit("held-out AUC", 1)[1].split()[0])
    assert auc > 0.75, proc.stdout


def test_serve_example_trains_serves_and_answers() -> None:
    """examples/serve_model.py: train on Cora, save, serve (standalone), query over msgpack and
    HTTP (equal answers), SIGTERM drains and exits 0."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("ASYNCGRAPH_")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "serve_model.py"), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=os.fspath(ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "msgpack and HTTP answers equal: True" in proc.stdout, proc.stdout
    assert "serve process exited with 0" in proc.stdout, proc.stdout


def test_train_dist_saves_a_model_the_serve_process_loads(cora2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """examples/train_dist.py --save-model DIR writes an artifact that the serve process's loader
    rebuilds (class, shapes, fanouts, trained weights) (issue 36 item 6)."""
    from asyncgraph.serve.artifact import load_model

    env = {k: v for k, v in subprocess_env().items() if not k.startswith("ASYNCGRAPH_")}
    cmd = [sys.executable, str(ROOT / "examples" / "train_dist.py"), "--part-config", str(cora2.part_config),
           "--epochs", "1", "--no-progress", "--save-model", str(tmp_path / "model")]  # fmt: skip
    res = subprocess.run(
        cmd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-3000:]
    spec, model = load_model(tmp_path / "model")
    assert spec.fanouts == [25, 10] and spec.class_path == "asyncgraph.nn.sage:GraphSAGE"
    assert not model.training and model.layers[0].in_feats == 1433
    assert any(p.abs().sum() > 0 for p in model.parameters())
