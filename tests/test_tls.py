"""Issue 32 item 4, optional TLS: servers with ``--tls-*`` (a throwaway CA made with the openssl
CLI in tmp_path), clients and a replica with certificates; without one, or with another CA's,
no connection. Real server processes on loopback."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import AsyncGraphError
from asyncgraph.net.connection import Connection
from asyncgraph.net.tls import TlsConfig
from asyncgraph.protocol.info import ServerInfo
from asyncgraph.protocol.ops import Op
from asyncgraph.testing import start_servers

SECRET = b"issue32-tls"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> Path:
    """A CA in ``folder``: ``<name>-ca.pem`` / ``.key``."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.pem", "-days", "1",
             "-subj", f"/CN={name}-ca", cwd=folder)  # fmt: skip
    return folder / f"{name}-ca.pem"


def make_cert(folder: Path, ca: str, name: str) -> TlsConfig:
    """A certificate ``name`` signed by CA ``ca`` (both in ``folder``)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}-ca.pem", "-CAkey", f"{ca}-ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", cwd=folder)  # fmt: skip
    return TlsConfig(str(folder / f"{ca}-ca.pem"), str(folder / f"{name}.pem"), str(folder / f"{name}.key"))


@pytest.mark.timeout(120)
async def test_tls_with_client_certificates(cora2, tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki, "job")
    make_ca(pki, "rogue")
    server_tls = make_cert(pki, "job", "server")
    client_tls = make_cert(pki, "job", "trainer")
    rogue_tls = make_cert(pki, "rogue", "intruder")
    tls_args = ["--tls-ca-file", server_tls.ca_file, "--tls-cert", server_tls.cert]
    tls_args += ["--tls-key", server_tls.key]
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, num_servers=2, secret=SECRET,
        extra_args=["--log-level", "INFO", *tls_args],
    )  # fmt: skip
    try:
        client = await AsyncClient.connect(
            group.addresses, secret=SECRET, use_shared_memory=False, tls=client_tls
        )
        try:
            n = client.book.num_nodes
            feat = (await client.pull("node:feat", np.arange(n))).numpy()
            assert feat.shape[0] == n
            await client.create_tensor("emb", "node", [n, 3], "float32")
            await client.push("emb", np.arange(n), np.ones((n, 3), np.float32))
            assert float((await client.pull("emb", np.arange(n))).numpy().sum()) == 3 * n
        finally:
            await client.close()
        # the replicas linked to their primaries over TLS and were checked and listed
        host, port = group.addresses[0]
        conn = await Connection.open(host, port, graph_name="cora", secret=SECRET, tls=client_tls, timeout=10)
        assert ServerInfo.from_wire(await conn.call(Op.INFO, {}, 10.0)).replicas == [group.bound[2][1]]
        conn.close()
        # no certificate, or one from another CA: no connection, and nothing for the server
        for tls in (None, rogue_tls):
            with pytest.raises((AsyncGraphError, OSError)):
                c = await Connection.open(host, port, graph_name="cora", secret=SECRET, tls=tls, timeout=5)
                await c.call(Op.PING, {}, 5.0)
        assert "Traceback" not in group.log_text(0)
    finally:
        group.stop()
