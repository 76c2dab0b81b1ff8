"""Trainer-side feature cache: served results equal uncached ones, writes never read stale rows,
hits and misses are counted, and loaders with a cache give the same batches as without."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from asyncgraph.client import Client
from asyncgraph.client.cache import FeatureCache, pick_cached_ids
from asyncgraph.client.traffic import Traffic
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.distributed import DistGraph
from asyncgraph.errors import InvalidRequestError
from asyncgraph.testing import ServerGroup


@pytest.fixture
def client(served: ServerGroup) -> Iterator[Client]:
    """Partition 0 through shared memory, partition 1 over the socket (a trainer of part 0)."""
    c = Client.connect(served.addresses, local_partitions=[0])
    yield c
    c.close()


def test_lookup_and_pick_are_exact() -> None:
    cache = FeatureCache("x", np.array([3, 7, 9]), np.array([[30.0], [70.0], [90.0]]))
    hit, slot = cache.lookup(np.array([9, 1, 3, 10, 7, 7]))
    np.testing.assert_array_equal(hit, [True, False, True, False, True, True])
    np.testing.assert_array_equal(cache.rows[slot[hit], 0], [90.0, 30.0, 70.0, 70.0])
    with pytest.raises(InvalidRequestError):
        FeatureCache("x", np.array([7, 3]), np.zeros((2, 1)))
    scores = np.array([0.0, 5.0, 1.0, 9.0, 0.0, 2.0])
    np.testing.assert_array_equal(pick_cached_ids(scores, np.array([0, 1, 2, 3, 4]), 2), [1, 3])
    np.testing.assert_array_equal(pick_cached_ids(scores, np.array([0, 4, 5]), 5), [5])  # score 0 never


def test_cached_pulls_equal_uncached_and_are_counted(client: Client, pubmed2) -> None:
    aio = client.aio
    remote = aio.remote_ids("node")
    lo, hi = client.book.node_range(1)
    np.testing.assert_array_equal(remote, np.arange(lo, hi))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, client.book.num_nodes, 5000)
    uncached = Traffic()
    expected = client.loop.run(aio.pull_numpy("node:feat", ids, uncached))
    np.testing.assert_array_equal(expected, pubmed2.original_rows("feat", ids))
    n_remote = int(np.count_nonzero(ids >= lo))
    assert uncached.remote_rows == n_remote and uncached.cache_hits == 0
    assert uncached.remote_bytes == n_remote * 500 * 4  # PubMed: 500 float32 per row

    cached_ids = remote[::2]
    cache = client.loop.run(aio.build_cache("node:feat", cached_ids))
    assert len(cache) == cached_ids.size
    traffic = Traffic()
    got = client.loop.run(aio.pull_numpy("node:feat", ids, traffic))
    np.testing.assert_array_equal(got, expected)
    hits = int(np.count_nonzero(np.isin(ids, cached_ids)))
    assert traffic.cache_hits == hits > 0
    assert traffic.cache_misses == n_remote - hits
    assert traffic.remote_rows == n_remote - hits
    all_hits = Traffic()
    got = client.loop.run(aio.pull_numpy("node:feat", cached_ids[::-3], all_hits))
    np.testing.assert_array_equal(got, pubmed2.original_rows("feat", cached_ids[::-3]))
    assert all_hits.remote_requests == 0 and all_hits.cache_misses == 0


def test_writes_to_a_cached_tensor_are_never_read_stale(client: Client) -> None:
    aio = client.aio
    lo, _ = client.book.node_range(1)
    client.loop.run(aio.create_tensor("node:w", "node", [client.book.num_nodes, 3], "float32"))
    ids = np.arange(lo, lo + 50)
    client.loop.run(aio.build_cache("node:w", ids))
    np.testing.assert_array_equal(client.loop.run(aio.pull_numpy("node:w", ids)), 0.0)
    client.loop.run(aio.push("node:w", ids[:10], np.ones((10, 3), np.float32)))
    assert aio.feature_cache("node:w") is None
    got = client.loop.run(aio.pull_numpy("node:w", ids))
    np.testing.assert_array_equal(got[:10], 1.0)
    np.testing.assert_array_equal(got[10:], 0.0)
    client.loop.run(aio.build_cache("node:w", ids))
    grads = np.ones((5, 3), np.float32)
    client.loop.run(aio.sparse_update("node:w", ids[:5], grads, {"kind": "adagrad", "lr": 1.0}))
    got = client.loop.run(aio.pull_numpy("node:w", ids[:5]))
    assert not np.any(got == 1.0)  # the update was applied and read back, not the cached ones
    client.loop.run(aio.delete_tensor("node:w"))


def test_loader_with_a_cache_gives_the_same_batches(served: ServerGroup, pubmed2) -> None:
    runs = []
    for cache_bytes in (0, 2_000_000):
        c = Client.connect(served.addresses, local_partitions=[0])
        try:
            g = DistGraph("pubmed", client=c)
            lo, hi = c.book.node_range(0)  # the seeds of a trainer of partition 0
            nids = np.arange(lo, hi, 7)
            loader = DistNodeDataLoader(
                g, nids, NeighborSampler([5, 3]), 128, prefetch=2, seed=5,
                feature_cache_bytes=cache_bytes, carry_features=False,
            )  # fmt: skip
            batches = [(i.numpy(), b[0].srcdata["feat"].numpy()) for i, _, b in loader]
            runs.append((batches, loader.stats.traffic, loader.cache_info))
        finally:
            c.close()
    (b0, t0, info0), (b1, t1, info1) = runs
    assert info0 == {} and 0 < info1["rows"] <= 2_000_000 // 2000  # 1,000 rows of 2,000 bytes fit
    for (i0, f0), (i1, f1) in zip(b0, b1, strict=True):
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(f0, f1)
        np.testing.assert_array_equal(f1, pubmed2.original_rows("feat", i1))
    assert t0.cache_hits == 0 and t1.cache_hits > 0
    assert t1.cache_hits + t1.cache_misses == t0.remote_rows  # the same remote lookups
    assert t1.remote_bytes < t0.remote_bytes
    assert t0.waves >= len(b0)  # at least the feature wave of every batch went to a server


@pytest.mark.parametrize("local", [[0], []])
def test_features_carried_by_sampling_equal_the_two_wave_path(served: ServerGroup, pubmed2, local) -> None:
    runs = []
    cases = [(False, 0), (True, 0), (True, 50_000_000)]  # (carry, cache bytes): 50 MB holds all remote rows
    for carry, cache_bytes in cases:
        c = Client.connect(served.addresses, local_partitions=local)
        try:
            g = DistGraph("pubmed", client=c)
            lo, hi = c.book.node_range(0)
            loader = DistNodeDataLoader(
                g, np.arange(lo, hi, 11), NeighborSampler([4, 3]), 100, seed=9, carry_features=carry,
                feature_cache_bytes=cache_bytes,
            )  # fmt: skip
            batches = [(b.input_nodes.numpy(), b.blocks[0].srcdata["feat"].numpy(),
                        b.blocks[-1].dstdata["label"].numpy()) for b in loader]  # fmt: skip
            runs.append((batches, loader.stats.traffic))
        finally:
            c.close()
    (two_wave, t_two), (carried, t_carried), (cached, t_cached) = runs
    for (i0, f0, l0), (i1, f1, l1), (i2, f2, l2) in zip(two_wave, carried, cached, strict=True):
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(i0, i2)
        np.testing.assert_array_equal(f0, f1)
        np.testing.assert_array_equal(f0, f2)
        np.testing.assert_array_equal(l0, l1)
        np.testing.assert_array_equal(l0, l2)
        np.testing.assert_array_equal(f1, pubmed2.original_rows("feat", i1))
    n = len(two_wave)
    if local:  # seeds local: layer 1 is sampled here; layer 2 and the features each take a wave
        assert t_two.waves == 2 * n
        # carried: the sources sampled here that partition 1 owns ride in its layer-2 answer
        assert t_carried.waves == n
        assert t_cached.waves == n
        assert t_carried.remote_rows == t_two.remote_rows  # the same rows, one wave fewer
        # with a cache, cached rows sampled here are not asked for: fewer rows, still one wave
        assert t_cached.cache_hits > 0 and t_cached.cache_misses == 0
        assert t_cached.remote_rows == t_two.remote_rows - t_cached.cache_hits
    else:  # everything over sockets: labels and the rows other owners sampled keep the last wave
        assert t_two.waves == 3 * n
        assert t_carried.waves <= 3 * n
    assert t_carried.remote_rows > 0


def test_carried_ids_must_be_owned(client: Client, served: ServerGroup) -> None:
    part1 = client.aio.partitions[1]
    lo, hi = client.book.node_range(1)
    seeds = np.arange(lo, lo + 20)
    r = client.loop.run(part1.sample_with_features(seeds, 3, False, 1, ["node:feat"], np.array([hi - 1])))
    assert hi - 1 in r.ids and set(seeds) <= set(r.ids.tolist())
    with pytest.raises(InvalidRequestError):  # node 0 belongs to partition 0
        client.loop.run(part1.sample_with_features(seeds, 3, False, 1, ["node:feat"], np.array([0])))
    again = client.loop.run(part1.sample_with_features(seeds, 3, False, 1, ["node:feat"]))
    np.testing.assert_array_equal(again.src, r.src)  # still serving, same sample


def test_sample_args_features_are_checked() -> None:
    from asyncgraph.protocol.ops import SampleArgs

    seeds = np.arange(3)
    a = SampleArgs.decode(SampleArgs(seeds, 2, features=("node:feat",)).encode())
    assert a.features == ("node:feat",)
    assert "features" not in SampleArgs(seeds, 2).encode()  # old peers see the old request
    with pytest.raises(InvalidRequestError, match="features"):
        SampleArgs.decode({"seeds": seeds, "fanout": 2, "features": [1]})
    with pytest.raises(InvalidRequestError, match="features"):
        SampleArgs.decode({"seeds": seeds, "fanout": 2, "features": "node:feat"})


def test_cached_pulls_without_a_local_partition(served: ServerGroup, pubmed2) -> None:
    """With every partition over a socket, partial cache hits still give the uncached rows and
    only the misses are requested."""
    c = Client.connect(served.addresses, local_partitions=[])
    try:
        aio = c.aio
        lo, hi = c.book.node_range(1)
        c.loop.run(aio.build_cache("node:feat", np.arange(lo, hi, 3)))
        ids = np.random.default_rng(5).integers(0, c.book.num_nodes, 3000)
        traffic = Traffic()
        got = c.loop.run(aio.pull_numpy("node:feat", ids, traffic))
        np.testing.assert_array_equal(got, pubmed2.original_rows("feat", ids))
        hits = int(np.count_nonzero((ids >= lo) & ((ids - lo) % 3 == 0)))
        assert traffic.cache_hits == hits > 0
        assert traffic.remote_rows == ids.size - hits
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_loader_workers_read_the_loaders_cache(served: ServerGroup, pubmed2, mode: str) -> None:
    """With ``num_workers``, the cache built by the loader is mapped by its workers (one copy per
    host): the batches equal those of the loader alone, the workers' pulls hit it, and every
    feature row is still copied on the host once."""
    runs = []
    for workers in (0, 2):
        c = Client.connect(served.addresses, local_partitions=[0])
        try:
            g = DistGraph("pubmed", client=c)
            lo, hi = c.book.node_range(0)
            loader = DistNodeDataLoader(
                g, np.arange(lo, hi, 7), NeighborSampler([5, 3]), 128, prefetch=2, seed=5,
                feature_cache_bytes=2_000_000, carry_features=False, num_workers=workers,
                worker_mode=mode,
            )  # fmt: skip
            try:
                batches = [(i.numpy(), b[0].srcdata["feat"].numpy()) for i, _, b in loader]
                runs.append((batches, loader.stats, loader.cache_info))
            finally:
                loader.close()
        finally:
            c.close()
    (b0, s0, info0), (b2, s2, info2) = runs
    assert info0 == info2 and info2["rows"] > 0
    assert len(b0) == len(b2)
    for (i0, f0), (i2, f2) in zip(b0, b2, strict=True):
        np.testing.assert_array_equal(i0, i2)
        np.testing.assert_array_equal(f0, f2)
        np.testing.assert_array_equal(f2, pubmed2.original_rows("feat", i2))
    assert s2.traffic.cache_hits == s0.traffic.cache_hits > 0
    assert s2.traffic.cache_misses == s0.traffic.cache_misses
    assert s2.host_copy_bytes == s2.feature_bytes > 0  # cached rows copied once too
