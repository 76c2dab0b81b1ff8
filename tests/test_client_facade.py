"""The blocking ``Client`` is derived from ``AsyncClient`` (issue 21): the same public methods
with the same signatures, every coroutine method blocking, and nothing outside ``client/``
reaching into the facade's async client."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient, Client, Traffic
from asyncgraph.client.sync_client import SYNC_ONLY, blocking, mirror

ROOT = Path(__file__).resolve().parent.parent


def public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_client_has_every_public_name_of_async_client_and_no_other() -> None:
    assert public(Client) - SYNC_ONLY == public(AsyncClient)
    assert public(Client) >= SYNC_ONLY


@pytest.mark.parametrize("name", sorted(public(AsyncClient)))
def test_same_kind_and_signature(name: str) -> None:
    """Parameters (names, kinds, defaults, annotations) and result types agree; a coroutine
    method of ``AsyncClient`` is a plain (blocking) method of ``Client``."""
    a, s = inspect.getattr_static(AsyncClient, name), inspect.getattr_static(Client, name)
    if isinstance(a, property):
        assert isinstance(s, property), name
        assert a.fget is not None and s.fget is not None
        assert a.fget.__annotations__["return"] == s.fget.__annotations__["return"], name
        return
    assert isinstance(s, classmethod) == isinstance(a, classmethod), name
    fa, fs = getattr(AsyncClient, name), getattr(Client, name)
    sa, ss = inspect.signature(fa), inspect.signature(fs)
    assert list(sa.parameters.values()) == list(ss.parameters.values()), name
    want = str(sa.return_annotation).replace("AsyncClient", "Client")
    assert want == str(ss.return_annotation), name
    assert not inspect.iscoroutinefunction(fs), name


def test_wrappers_refuse_the_wrong_kind_of_method() -> None:
    """``mirror`` of a coroutine method would hand callers an un-run coroutine: refused at import."""
    with pytest.raises(TypeError, match="blocking"):
        mirror(AsyncClient.push)
    with pytest.raises(TypeError, match="mirror"):
        blocking(AsyncClient.tensor_names)  # type: ignore[arg-type]


def test_nothing_outside_the_client_reaches_into_aio() -> None:
    """Library code, examples and benchmarks use the facade's methods (or ``async_client`` for
    coroutines run on its loop), never ``.aio``."""
    found = []
    pattern = re.compile(r"(?<!asyncgraph)\.aio\b")
    for folder in ("asyncgraph", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.is_relative_to(ROOT / "asyncgraph" / "client"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_blocking_methods_answer_like_the_async_ones(pubmed2: Any) -> None:
    """Standalone PubMed, two partitions: methods the facade lacked before (``pull_numpy``,
    ``traffic=``, ``find_edges``, ``remote_ids``) answer as ``AsyncClient`` does."""
    client = Client.standalone(pubmed2.part_config)
    try:
        aio, run = client.async_client, client.loop.run
        seeds = np.arange(0, pubmed2.orig_nids.size, 997, dtype=np.int64)
        assert client.tensor_names() == aio.tensor_names()
        assert client.local_partitions() == [0, 1] and client.remote_ids().size == 0
        np.testing.assert_array_equal(
            client.pull_numpy("node:feat", seeds), run(aio.pull_numpy("node:feat", seeds))
        )
        traffic = Traffic()
        got = client.sample_neighbors(seeds, 5, seed=3, traffic=traffic)
        want = run(aio.sample_neighbors(seeds, 5, seed=3))
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
        assert traffic.remote_requests == 0  # every partition is local
        src, dst = client.find_edges(got[2])
        np.testing.assert_array_equal(src, got[0])
        np.testing.assert_array_equal(dst, got[1])
    finally:
        client.close()
