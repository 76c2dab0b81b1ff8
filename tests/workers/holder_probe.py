"""A trainer for ``tests/test_holder_keys.py`` under ``python -m asyncgraph.launch``: it writes to
``OUT/rank<RANK>.json`` what credentials the launcher gave it and what they allow: a client of
every partition as its own holder; another holder's name, or its key used as the cluster secret,
refused.

    python -m asyncgraph.launch ... -- python tests/workers/holder_probe.py OUT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import asyncgraph
from asyncgraph.client.ipconfig import IpConfig
from asyncgraph.distributed import get_client
from asyncgraph.env import ENV_HOLDER, ENV_HOLDER_KEY_FILE, ENV_IP_CONFIG, ENV_SECRET_FILE
from asyncgraph.errors import AsyncGraphError
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.ops import Op


async def _try(host: str, port: int, **kw: object) -> str:
    """The error a connection with these credentials gets at its first call ("ok" if none)."""
    try:
        conn = await Connection.open(host, port, graph_name=None, timeout=10.0, **kw)  # type: ignore[arg-type]
        try:
            await conn.call(Op.PING, {}, 10.0)
        finally:
            conn.close()
    except AsyncGraphError as exc:
        return type(exc).__name__
    return "ok"


def main(out: Path) -> None:
    holder, key_file = os.environ.get(ENV_HOLDER), os.environ.get(ENV_HOLDER_KEY_FILE)
    assert key_file is not None
    key = bytes.fromhex(Path(key_file).read_text().strip())
    config = asyncgraph.PartitionConfig.load(os.environ["ASYNCGRAPH_PART_CONFIG"])
    asyncgraph.initialize()
    try:
        g = asyncgraph.DistGraph(config.graph_name)
        client_holder = get_client().holder
        book = g.get_partition_book()
        rows = [g.ndata["feat"][book.node_range(p)[0] : book.node_range(p)[0] + 1] for p in range(2)]
    finally:
        asyncgraph.finalize()
    host, port = IpConfig.load(os.environ[ENV_IP_CONFIG]).addresses()[0]
    record = {
        "holder": holder,
        "secret_file": os.environ.get(ENV_SECRET_FILE),
        "key_file_mode": oct(os.stat(key_file).st_mode & 0o777),
        "client_holder": client_holder,
        "rows": len(rows),
        "other_holder": asyncio.run(_try(host, port, holder=f"{holder}-other", holder_key=key)),
        "as_secret": asyncio.run(_try(host, port, secret=key)),
    }
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
