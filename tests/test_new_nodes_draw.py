"""The documented draw of an inductive request's given neighbours (``NewNodes.sample_in_edges``):
checked against a scalar Python reference of its rule, for independence between new nodes, and
for uniformity over many seeds."""

from __future__ import annotations

import numpy as np
import pytest

from asyncgraph.kernels.partition_sampling import keyed_words
from asyncgraph.serve.new_nodes import NewNodes

MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _word(seed: int, row: int, counter: int) -> int:
    """The rule's word, one at a time in Python integers."""
    key = _mix(_mix(seed & MASK) ^ ((seed >> 64) & MASK))
    return _mix(_mix(key ^ row) ^ counter)


def _reference(
    given: list[list[int]], rows: list[int], fanout: int, seed: int, replace: bool
) -> tuple[list[int], list[int]]:
    src: list[int] = []
    dst: list[int] = []
    for row in rows:
        nbrs = given[row]
        if fanout == -1 or not nbrs or (not replace and len(nbrs) <= fanout):
            picked = list(nbrs)
        elif replace:
            picked = [nbrs[int((_word(seed, row, k) >> 11) * 2.0**-53 * len(nbrs))] for k in range(fanout)]
        else:
            ranked = sorted(range(len(nbrs)), key=lambda j: (_word(seed, row, j), j))[:fanout]
            picked = [nbrs[j] for j in sorted(ranked)]
        src += picked
        dst += [-1 - row] * len(picked)
    return src, dst


def _new_nodes(given: list[list[int]]) -> NewNodes:
    offsets = np.cumsum([0] + [len(g) for g in given]).astype(np.int64)
    flat = np.array([v for g in given for v in g], dtype=np.int64)
    return NewNodes(np.zeros((len(given), 2), np.float32), flat, offsets)


GIVEN = [[5, 9, 2, 7, 7, 30, 1], [], [4], [11, 12, 13], list(range(100, 140))]


@pytest.mark.parametrize("fanout", [-1, 1, 3, 10])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("seed", [0, 7, -3, 2**70 + 5])
def test_the_draw_follows_its_documented_rule(fanout: int, replace: bool, seed: int) -> None:
    rows = [4, 0, 1, 3, 2]
    src, dst = _new_nodes(GIVEN).sample_in_edges(np.array(rows), fanout, seed, replace=replace)
    want_src, want_dst = _reference(GIVEN, rows, fanout, seed, replace)
    assert src.tolist() == want_src
    assert dst.tolist() == want_dst
    assert src.dtype == dst.dtype == np.int64


def test_a_nodes_draw_depends_on_its_own_position_only() -> None:
    new = _new_nodes(GIVEN)
    together_src, together_dst = new.sample_in_edges(np.arange(5), 3, 11)
    for row in range(5):
        alone_src, _ = new.sample_in_edges(np.array([row]), 3, 11)
        assert alone_src.tolist() == together_src[together_dst == -1 - row].tolist()
    other_layer, _ = new.sample_in_edges(np.array([4]), 3, 12)
    assert other_layer.tolist() != together_src[together_dst == -5].tolist()


def test_no_rows_and_no_neighbours_give_no_edges() -> None:
    new = _new_nodes([[], []])
    for replace in (False, True):
        src, dst = new.sample_in_edges(np.arange(2), 2, 0, replace=replace)
        assert src.size == dst.size == 0
    src, dst = _new_nodes(GIVEN).sample_in_edges(np.empty(0, np.int64), 2, 0)
    assert src.size == dst.size == 0


def test_each_neighbour_is_kept_about_equally_often() -> None:
    """Over 4,000 seeds, each of 8 given neighbours is kept ~3/8 of the time (without
    replacement) and drawn ~3/8 times per request (with): within 4 standard errors."""
    given = [list(range(8))]
    new = _new_nodes(given)
    seeds = 4000
    for replace in (False, True):
        counts = np.zeros(8)
        for seed in range(seeds):
            src, _ = new.sample_in_edges(np.array([0]), 3, seed, replace=replace)
            assert src.size == 3
            if not replace:
                assert np.unique(src).size == 3 and (np.diff(src) > 0).all()  # distinct, in order
            counts += np.bincount(src, minlength=8)
        share = counts / seeds
        spread = 4 * np.sqrt(3 / 8 * (1 - 3 / 8) / seeds)
        assert np.abs(share - 3 / 8).max() < spread, share


def test_keyed_words_are_the_scalar_rule() -> None:
    rows = np.array([0, 1, 2, 2**40], dtype=np.int64)
    counters = np.array([0, 5, 0, 3], dtype=np.int64)
    for seed in (0, 1, -1, 2**64 + 1):
        got = keyed_words(seed, rows, counters).tolist()
        assert got == [_word(seed, int(r), int(c)) for r, c in zip(rows, counters, strict=True)]
