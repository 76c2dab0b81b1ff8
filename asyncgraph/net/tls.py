"""Optional TLS with client certificates, for links that cross networks one does not trust.

Off by default: the handshake's HMACs authenticate both sides but do not encrypt, so on a
trusted cluster network TLS only costs CPU. With it, every connection (clients, a replica's
link to its primary, the primary's check of a replica, the launcher's health probe) is TLS 1.2+
and both ends present a certificate signed by the job's CA (``CERT_REQUIRED`` on both sides);
the shared-secret handshake still runs inside it. Host names are not checked (servers are
addressed by IP from the ip_config): the CA is the authority, as in Dask's TLS set-up, whose
option names these follow:

- server: ``--tls-ca-file``, ``--tls-cert``, ``--tls-key``;
- clients: ``AsyncClient.connect(tls=TlsConfig(...))`` / ``asyncgraph.initialize(tls=...)``, or
  the environment: ``ASYNCGRAPH_TLS_CA_FILE``, ``ASYNCGRAPH_TLS_CERT``, ``ASYNCGRAPH_TLS_KEY``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENV_TLS_CA_FILE", "ENV_TLS_CERT", "ENV_TLS_KEY", "TlsConfig"]

ENV_TLS_CA_FILE = "ASYNCGRAPH_TLS_CA_FILE"
ENV_TLS_CERT = "ASYNCGRAPH_TLS_CERT"
ENV_TLS_KEY = "ASYNCGRAPH_TLS_KEY"


@dataclass(frozen=True)
class TlsConfig:
    """The job's CA (to verify the peer) and this end's certificate and key (PEM files)."""

    ca_file: str
    cert: str
    key: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TlsConfig | None:
        """The ``ASYNCGRAPH_TLS_*`` variables: all three, or None when none is set;
        ``ValueError`` naming the missing ones when only some are."""
        env = os.environ if env is None else env
        names = (ENV_TLS_CA_FILE, ENV_TLS_CERT, ENV_TLS_KEY)
        values = [env.get(n, "") for n in names]
        if not any(values):
            return None
        missing = [n for n, v in zip(names, values, strict=True) if not v]
        if missing:
            raise ValueError(f"TLS needs ${', $'.join(names)}; missing: ${', $'.join(missing)}")
        return cls(*values)

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        ctx = ssl.create_default_context(purpose, cafile=self.ca_file)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.check_hostname = False  # peers are named by IP; the job's CA is the authority
        ctx.verify_mode = ssl.CERT_REQUIRED  # both ends: a client certificate is required too
        return ctx

    def server_context(self) -> ssl.SSLContext:
        """For the server's listening socket: requires a client certificate from the CA."""
        return self._context(ssl.Purpose.CLIENT_AUTH)

    def client_context(self) -> ssl.SSLContext:
        """For a connection to a server: presents this certificate, verifies the server's."""
        return self._context(ssl.Purpose.SERVER_AUTH)
