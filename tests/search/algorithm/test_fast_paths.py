"""The search's fast paths against the general ones they stand in for: each must give the same
result to the bit (bench/frontier_diff.py checks whole frontiers; these check the parts)."""

from __future__ import annotations

import numpy as np
import pytest

from search.algorithm import frontier
from search.algorithm.frontier import Factor, Stats, join, leaf


def _factor(rng: np.random.Generator, scope: tuple[str, ...], domain: dict[str, int], n: int, ties: bool) -> Factor:
    keys = np.stack([rng.integers(0, domain[v], n) for v in scope], axis=1) if scope else np.zeros((n, 0), int)
    # few distinct values make equal sums (and equal-time clusters) common
    t = rng.integers(1, 6, n).astype(float) if ties else rng.uniform(1.0, 10.0, n)
    m = rng.integers(1, 6, n).astype(float) if ties else rng.uniform(1.0, 10.0, n)
    return leaf(scope, keys, t, m)


def _same(x: Factor, y: Factor) -> None:
    assert x.scope == y.scope
    assert x.keys.dtype == y.keys.dtype and np.array_equal(x.keys, y.keys)
    assert np.array_equal(x.t, y.t) and np.array_equal(x.m, y.m)
    assert all(np.array_equal(p, q) for p, q in zip(x.parent_idx, y.parent_idx, strict=True))
    assert x.parents == y.parents


@pytest.mark.parametrize("seed", range(300))
def test_small_join_equals_numpy_join(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    names = ["u", "v", "w", "x"]
    domain = {v: int(rng.integers(1, 4)) for v in names}
    a_scope = tuple(v for v in names if rng.random() < 0.6)
    b_scope = tuple(v for v in names if rng.random() < 0.6)
    ties = bool(rng.random() < 0.3)
    a = _factor(rng, a_scope, domain, int(rng.integers(0, 12)), ties)
    b = _factor(rng, b_scope, domain, int(rng.integers(0, 12)), ties)
    shared = [v for v in a_scope if v in b_scope]
    drop = tuple(v for v in shared if rng.random() < 0.5)
    s_small, s_numpy = Stats(), Stats()
    small = join(a, b, drop=drop, domain=domain, stats=s_small)
    monkeypatch.setattr(frontier, "SMALL_PAIRS", -1)  # the numpy path only
    ref = join(a, b, drop=drop, domain=domain, stats=s_numpy)
    _same(small, ref)
    assert s_small == s_numpy


def test_small_join_is_taken() -> None:
    """Without equal times the plain-Python path answers (a test of the path, not of speed)."""
    domain = {"u": 2}
    a = leaf(("u",), np.array([[0], [1]]), np.array([1.0, 2.0]), np.array([2.0, 1.0]))
    b = leaf(("u",), np.array([[0], [1]]), np.array([0.5, 0.25]), np.array([1.0, 3.0]))
    assert frontier._join_small(a, b, ("u",), domain, None) is not None
    tied = leaf(("u",), np.array([[0], [0]]), np.array([1.0, 1.0]), np.array([2.0, 1.0]))
    assert frontier._join_small(tied, b, ("u",), domain, None) is None
