"""Tests of node_split / edge_split."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from asyncgraph.distributed.split import edge_split, node_split
from asyncgraph.errors import DTypeMismatchError, ShapeMismatchError
from asyncgraph.partition.book import RangePartitionBook

NODE_BOUNDS = [0, 1000, 2100, 2900, 4000]
EDGE_BOUNDS = [0, 5000, 9000, 15000, 20000]


def shares(
    mask: Any,
    book: RangePartitionBook | None,
    world: int,
    force_even: bool,
    fn: Callable[..., torch.Tensor] = node_split,
) -> list[np.ndarray]:
    out = [fn(mask, book, rank=r, world_size=world, force_even=force_even) for r in range(world)]
    for s in out:
        assert s.dtype == torch.int64 and bool((s[1:] > s[:-1]).all())
    return [s.numpy() for s in out]


def check_partition_of_mask(parts: list[np.ndarray], mask: np.ndarray) -> None:
    every = np.concatenate(parts)
    assert np.unique(every).size == every.size, "shares overlap"
    np.testing.assert_array_equal(np.sort(every), np.flatnonzero(mask))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8, 12])
@pytest.mark.parametrize("density", [0.1, 0.5])
def test_force_even(world: int, density: float) -> None:
    book = RangePartitionBook(NODE_BOUNDS, EDGE_BOUNDS)
    mask = np.random.default_rng(world).random(4000) < density
    parts = shares(mask, book, world, True)
    check_partition_of_mask(parts, mask)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    n = int(mask.sum())
    assert sizes == [n // world + (r < n % world) for r in range(world)]
    if world % 4 == 0:  # equal trainer groups and a mask roughly balanced across partitions
        owner = book.nid2partid(np.concatenate(parts))
        trainer_part = np.repeat(np.arange(world) * 4 // world, sizes)
        assert np.mean(owner == trainer_part) > 0.9


def test_force_even_unbalanced_mask_and_determinism() -> None:
    book = RangePartitionBook(NODE_BOUNDS, EDGE_BOUNDS)
    mask = np.zeros(4000, dtype=bool)
    mask[:900] = True  # nearly everything in partition 0
    mask[2950:2960] = True
    parts = shares(mask, book, 4, True)
    check_partition_of_mask(parts, mask)
    assert [p.size for p in parts] == [228, 228, 227, 227]
    assert np.all(parts[0] < 1000)  # trainer 0 stays fully local
    again = shares(torch.from_numpy(mask), book, 4, True)
    for a, b in zip(parts, again, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 8])
def test_force_even_false(world: int) -> None:
    book = RangePartitionBook(NODE_BOUNDS, EDGE_BOUNDS)
    mask = np.random.default_rng(0).random(4000) < 0.3
    parts = shares(mask, book, world, False)
    check_partition_of_mask(parts, mask)
    if world >= 4:  # each trainer holds only IDs of its own partition
        for r, p in enumerate(parts):
            assert np.all(book.nid2partid(p) == r * 4 // world)


def test_edge_split_and_no_book() -> None:
    book = RangePartitionBook(NODE_BOUNDS, EDGE_BOUNDS)
    mask = np.random.default_rng(1).random(20000) < 0.2
    parts = shares(mask, book, 8, True, fn=edge_split)
    check_partition_of_mask(parts, mask)
    owner = book.eid2partid(np.concatenate(parts))
    assert np.mean(owner == np.repeat(np.arange(8) // 2, [p.size for p in parts])) > 0.9
    parts = shares(mask[:100], None, 3, True)
    check_partition_of_mask(parts, mask[:100])
    with pytest.raises(ShapeMismatchError):
        edge_split(mask[:10], book, 0, 2)


def test_rank_resolution_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    mask = torch.arange(10) % 2 == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert node_split(mask).tolist() == [6, 8]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert node_split(mask).tolist() == [0, 2, 4, 6, 8]
    assert node_split(np.arange(10) % 2).tolist() == [1, 3, 5, 7, 9]  # 0/1 integer mask
    with pytest.raises(ValueError):
        node_split(mask, rank=2, world_size=2)
    with pytest.raises(DTypeMismatchError):
        node_split(np.ones(4, dtype=np.float32))
    empty = node_split(np.zeros(5, dtype=bool), rank=0, world_size=3)
    assert empty.numel() == 0 and empty.dtype == torch.int64
