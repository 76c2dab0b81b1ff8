"""The ip_config file: one server per line, ``host [port]``, in partition order (DGL's format).

Validated by a pydantic model whose errors name the offending line.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

DEFAULT_PORT = 30050


class ServerEntry(BaseModel):
    """One server line."""

    host: str = Field(min_length=1)
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)

    @field_validator("host")
    @classmethod
    def _valid_host(cls, host: str) -> str:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not all(part and (part.isalnum() or "-" in part) for part in host.split(".")):
                raise ValueError(f"{host!r} is neither an IP address nor a host name") from None
        return host


class IpConfig(BaseModel):
    """All servers of a job, in partition order (several may share a host)."""

    servers: list[ServerEntry] = Field(min_length=1)

    @classmethod
    def parse(cls, text: str, source: str = "<ip_config>") -> IpConfig:
        servers: list[ServerEntry] = []
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            # errors name the line and the field, never its text (issue 32: the file may be any
            # readable file, e.g. /etc/shadow given by mistake or on purpose)
            fields = line.split()
            if len(fields) > 2:
                raise ValueError(f"{source} line {lineno}: expected 'host [port]', found {len(fields)} words")
            port = DEFAULT_PORT
            if len(fields) == 2:
                if not (fields[1].isascii() and fields[1].isdigit() and 1 <= int(fields[1]) <= 65535):
                    raise ValueError(f"{source} line {lineno}: the port (field 2) is not in [1, 65535]")
                port = int(fields[1])
            try:
                entry = ServerEntry(host=fields[0], port=port)
            except ValueError:
                raise ValueError(
                    f"{source} line {lineno}: the host (field 1) is neither an IP address nor a host name"
                ) from None
            servers.append(entry)
        if not servers:
            raise ValueError(f"{source}: no servers listed")
        return cls(servers=servers)

    @classmethod
    def load(cls, path: str | Path) -> IpConfig:
        return cls.parse(Path(path).read_text(), source=str(path))

    def addresses(self) -> list[tuple[str, int]]:
        return [(s.host, s.port) for s in self.servers]

    def dump(self) -> str:
        return "".join(f"{s.host} {s.port}\n" for s in self.servers)
