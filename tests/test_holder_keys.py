"""Issue 32 item 6, the rest: a holder is proved by a key of its own, so invented holders do not
pass ``--max-connections-per-holder``. Real server processes (Cora, 2 partitions, a secret) on
loopback; the launcher test runs ``python -m asyncgraph.launch`` with a probe trainer.

``holder_key = HMAC-SHA256(secret, "asyncgraph-holder\\0" + holder)``: a trainer given only its
holder's key (the launcher's trainers) proves that holder and no other; a process with the cluster
secret (servers, the launcher, admin tools) derives any holder's key and stays trusted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import AuthenticationError, ServerUnavailableError
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.handshake import holder_key
from asyncgraph.protocol.ops import Op
from asyncgraph.testing import PACKAGE_ROOT, ServerGroup, start_servers, subprocess_env

SECRET = b"issue32-holder-keys"
T = 10.0
PROBE = PACKAGE_ROOT / "tests" / "workers" / "holder_probe.py"


@pytest.fixture(params=["required", "default"])
def servers(request: pytest.FixtureRequest, cora2: Any, tmp_path: Path) -> Iterator[ServerGroup]:
    """Servers with a cap of 4 connections per holder; with or without ``--require-holder-keys``."""
    extra = ["--log-level", "INFO", "--max-connections-per-holder", "4"]
    if request.param == "required":
        extra.append("--require-holder-keys")
    group = start_servers(cora2.part_config, tmp_path / "run", num_parts=2, secret=SECRET, extra_args=extra)
    group.required = request.param == "required"  # type: ignore[attr-defined]
    yield group
    group.stop()


async def _open(
    group: ServerGroup, holder: str | None, *, secret: bytes | None = None, holder_key: bytes | None = None
) -> Connection:
    host, port = group.addresses[0]
    return await Connection.open(
        host, port, graph_name="cora", holder=holder, timeout=T, secret=secret, holder_key=holder_key
    )


@pytest.mark.timeout(90)
async def test_a_holder_key_proves_its_own_holder_and_no_other(servers: ServerGroup) -> None:
    key_a = holder_key(SECRET, "a")
    mine = await _open(servers, "a", holder_key=key_a)
    await mine.call(Op.PING, {}, T)
    mine.close()
    with pytest.raises(AuthenticationError, match="authentication failed"):
        await _open(servers, "b", holder_key=key_a)  # another holder's name with my key
    with pytest.raises(AuthenticationError, match="authentication failed"):
        await _open(servers, None, secret=key_a)  # my key is not the cluster secret
    with pytest.raises(ValueError, match="holder key"):
        await _open(servers, None, holder_key=key_a)  # a holder key proves a named holder only
    # a whole client with only the key: every partition, its holder the key's
    client = await AsyncClient.connect(
        servers.addresses, holder="a", holder_key=key_a, use_shared_memory=False
    )
    try:
        assert client.holder == "a"
        n = client.book.num_nodes
        assert (await client.pull("node:feat", np.arange(n))).numpy().shape[0] == n
        origin = client.state.origin  # what a loader's worker process connects with
        assert origin["holder"] == "a" and origin["holder_key"] == key_a and origin["secret"] is None
        from asyncgraph.dataloading.worker_main import open_client

        worker = await open_client(origin, None)
        try:
            assert worker.holder == "a"
            await worker.pull("node:feat", np.arange(4))
        finally:
            await worker.close()
    finally:
        await client.close()
    # the cluster secret is trusted: any holder (its key derived), or none
    for holder in ("admin-tool", None):
        admin = await _open(servers, holder, secret=SECRET)
        await admin.call(Op.PING, {}, T)
        admin.close()
    # a holder proved by the bare cluster secret (an older client's hello): only without the flag
    required = servers.required  # type: ignore[attr-defined]
    if required:
        with pytest.raises(AuthenticationError, match="requires holder keys"):
            await _open(servers, "old-style", holder_key=SECRET)
    else:
        old = await _open(servers, "old-style", holder_key=SECRET)
        await old.call(Op.PING, {}, T)
        old.close()


@pytest.mark.timeout(90)
async def test_twenty_invented_holders_do_not_pass_a_cap_of_four(servers: ServerGroup) -> None:
    """The issue's attack from a trainer's seat: it holds the key of holder "a" only."""
    key_a = holder_key(SECRET, "a")
    opened: list[Connection] = []
    try:
        for i in range(20):
            with pytest.raises(AuthenticationError):
                await _open(servers, f"invented-{i}", holder_key=key_a)
            with pytest.raises(AuthenticationError):  # nor with a key made up for it
                await _open(servers, f"invented-{i}", holder_key=bytes(32))
        for _ in range(4):
            opened.append(await _open(servers, "a", holder_key=key_a))
            await opened[-1].call(Op.PING, {}, T)
        fifth = await _open(servers, "a", holder_key=key_a)
        opened.append(fifth)
        with pytest.raises(ServerUnavailableError, match=r"holder 'a' .*--max-connections-per-holder 4"):
            await fifth.call(Op.PING, {}, T)
        for conn in opened[:4]:  # the four within the cap are served on
            await conn.call(Op.PING, {}, T)
    finally:
        for conn in opened:
            conn.close()
    log = servers.log_text(0)
    assert log.count("reason=auth") >= 40, log[-3000:]


@pytest.mark.timeout(240)
def test_a_launched_trainer_gets_its_holder_key_and_not_the_cluster_secret(
    cora2: Any, tmp_path: Path
) -> None:
    """The launcher's trainers get ``ASYNCGRAPH_HOLDER`` and a key file, no secret file; their
    servers require holder keys, so the trainer can act as its own holder only."""
    env = subprocess_env()
    cmd = [
        sys.executable, "-m", "asyncgraph.launch", "--part-config", str(cora2.part_config),
        "--num-trainers", "1", "--", sys.executable, str(PROBE), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env, cwd=PACKAGE_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(records) == 2
    holders = {r["holder"] for r in records}
    assert len(holders) == 2  # one holder per trainer
    for rec in records:
        assert rec["secret_file"] is None  # no cluster secret in the trainer's environment
        assert rec["holder"] and rec["key_file_mode"] == "0o600"
        assert rec["client_holder"] == rec["holder"]
        assert rec["rows"] == 2  # it reaches both partitions with its key
        assert rec["other_holder"] == "AuthenticationError"  # not another trainer's holder
        assert rec["as_secret"] == "AuthenticationError"  # its key is not the cluster secret


@pytest.mark.timeout(90)
async def test_the_fault_soaks_invented_holder_abuse_is_refused(servers: ServerGroup) -> None:
    """``benchmarks.faults --abuse`` runs this abuser under load; one bounded round here."""
    import asyncio

    from benchmarks.faults_holders import INVENTED_PER_ROUND, invented_holders

    refused: dict[str, int] = {}
    accepted: list[str] = []

    def note(what: str, exc: BaseException | None) -> None:
        if exc is None:
            accepted.append(what)
        else:
            refused[what] = refused.get(what, 0) + 1

    until = asyncio.get_running_loop().time() + 0.1  # one round
    await invented_holders(servers.addresses, SECRET, 4, note, until)
    assert accepted == []
    assert refused == {
        "invented holder": 2 * INVENTED_PER_ROUND,
        "holder key as the secret": 1,
        "past the per-holder cap": 1,
    }
