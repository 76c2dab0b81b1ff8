"""Serving under faults (issue 36, step 4): a graph server killed mid-load gives typed errors
within each request's deadline and the service recovers once the server is back; two serve
processes share one port with ``--reuse-port`` and one can drain while the other serves."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _serve_helpers import ServeProcess

import asyncgraph
from asyncgraph.errors import AsyncGraphError, RequestTimeoutError, ServerUnavailableError
from asyncgraph.nn import GraphSAGE
from asyncgraph.serve.artifact import save_model
from asyncgraph.testing import start_servers

DEADLINE_S = 1.5


def wait_ready(serve: ServeProcess, status: int, seconds: float) -> tuple[int, Any]:
    """Poll ``/v2/health/ready`` until it answers ``status`` (or ``seconds`` pass); the last answer."""
    end = time.monotonic() + seconds
    while True:
        got = serve.request("GET", "/v2/health/ready")
        if got[0] == status or time.monotonic() > end:
            return got
        time.sleep(0.2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return save_model(
        tmp_path_factory.mktemp("model"),
        GraphSAGE(1433, 16, 7, n_layers=2),
        name="sage",
        kwargs={"in_feats": 1433, "hidden": 16, "n_classes": 7, "n_layers": 2},
        fanouts=[5, 5],
    )


def test_server_killed_mid_load_typed_errors_within_deadline_then_recovers(
    cora2: Any, model_dir: Path, tmp_path: Path
) -> None:
    group = start_servers(cora2.part_config, tmp_path / "servers", num_parts=2)
    serve = None
    try:
        serve = ServeProcess(
            tmp_path / "serve",
            ["--servers", str(group.ip_config()), "--model", str(model_dir), "--msgpack-port", "0",
             "--deadline-ms", str(DEADLINE_S * 1e3)],
        )  # fmt: skip
        outcomes: list[tuple[float, str, float]] = []  # (start, outcome, seconds)
        stop = threading.Event()

        def load() -> None:
            with asyncgraph.InferenceClient(f"tcp://127.0.0.1:{serve.msgpack_port}", model="sage") as client:
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        client.infer(list(range(0, 2700, 37)))
                        outcome = "ok"
                    except (RequestTimeoutError, ServerUnavailableError) as exc:
                        outcome = type(exc).__name__
                    except AsyncGraphError as exc:  # typed, but not what a lost server should give
                        outcome = f"other {type(exc).__name__}: {exc}"
                    outcomes.append((t0, outcome, time.monotonic() - t0))
                    time.sleep(0.02)

        loader = threading.Thread(target=load)
        loader.start()
        try:
            end = time.monotonic() + 30
            while time.monotonic() < end and sum(o == "ok" for _, o, _ in outcomes) < 3:
                time.sleep(0.05)  # answering under load before the kill
            group.kill(1)
            killed = time.monotonic()
            readiness = [wait_ready(serve, 503, 10)]  # withdrawn while the server is gone
            time.sleep(3 * DEADLINE_S)
            group.restart(1)
            restarted = time.monotonic()
            readiness.append(wait_ready(serve, 200, 30))  # and back once it answers again
            end = restarted + 30
            while time.monotonic() < end and not any(t > restarted and o == "ok" for t, o, _ in outcomes):
                time.sleep(0.1)
        finally:
            stop.set()
            loader.join(timeout=30)
        assert sum(o == "ok" for t, o, _ in outcomes if t < killed) >= 3, outcomes
        failed = [(o, s) for t, o, s in outcomes if o != "ok" and t > killed - DEADLINE_S]
        assert failed, "no request failed while a server was down"
        assert all(o in ("RequestTimeoutError", "ServerUnavailableError") for o, _ in failed), failed
        assert max(s for _, s in failed) < DEADLINE_S + 1.0, failed  # within the deadline (+ slack)
        assert any(t > restarted and o == "ok" for t, o, _ in outcomes), outcomes[-5:]
        assert readiness[0][0] == 503 and "does not answer" in readiness[0][1]["reason"], readiness
        assert readiness[1] == (200, {"ready": True}), readiness
    finally:
        if serve is not None:
            serve.stop()
        group.stop()
    assert serve.proc.returncode == 0


def test_two_processes_share_one_port(cora2: Any, model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = ["--part-config", str(cora2.part_config), "--model", str(model_dir), "--port", str(port),
              "--reuse-port"]  # fmt: skip
    first = ServeProcess(tmp_path / "a", common)
    second = None
    try:
        second = ServeProcess(tmp_path / "b", common)  # binding the same port: refused without it
        assert first.port == second.port == port
        for _ in range(10):  # a fresh connection each: the kernel spreads them over both
            status, answer = first.infer([1, 2, 3])
            assert status == 200 and answer["outputs"][0]["shape"] == [3, 7]
        first.stop()  # drains and exits; the other keeps the port
        assert first.proc.returncode == 0
        for _ in range(5):
            status, _ = second.infer([4])
            assert status == 200
    finally:
        first.stop()
        if second is not None:
            second.stop()
