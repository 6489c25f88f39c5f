"""The convex-hull test (search/algorithm/hull_bound.py): a region it calls beaten holds no point
the known plans do not dominate (the search's exactness rests on it), and it beats regions the
ideal corner alone cannot."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from search.algorithm.frontier import pareto_mask, staircase
from search.algorithm.hull_bound import HullTest, weighted_least


def _staircase(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t, m = rng.uniform(1, 100, n), rng.uniform(1, 100, n)
    keep = pareto_mask(np.zeros(n, dtype=np.int64), t, m)
    return staircase(t[keep], m[keep])


def _dominated(et: np.ndarray, em: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per point, whether a known plan is no slower and no heavier."""
    return ((et[None, :] <= x[:, None]) & (em[None, :] <= y[:, None])).any(axis=1)


def _region_boundary(t0: float, m0: float, lam: float, b: float, samples: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Points on the lower-left boundary of {x >= t0, y >= m0, x + lam y >= b}: the corner where
    the line meets x = t0, the segment of the line, and the corner where it meets y = m0, each
    ray beyond it (a point further out is dominated whenever its ray's start is)."""
    y_top = max(m0, (b - t0) / lam)
    t1 = max(t0, b - lam * m0)
    x = np.linspace(t0, t1, samples)
    y = np.maximum(m0, (b - x) / lam)
    return np.r_[t0, x, t1], np.r_[y_top, y, m0]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 40), points=st.integers(1, 30))
def test_a_region_called_beaten_holds_only_dominated_points(seed: int, n: int, points: int):
    et, em = _staircase(seed, n)
    hull = HullTest(et, em)
    rng = np.random.default_rng(seed + 1)
    t0, m0 = rng.uniform(0, 50, points), rng.uniform(0, 50, points)
    # lines through a point beyond the corner (a completion's weighted least)
    extra = rng.uniform(0, 40, (points, 1))
    b = t0[:, None] + hull.lams[None, :] * m0[:, None] + extra
    beaten = hull.beaten(t0, m0, b)
    for i in np.flatnonzero(beaten):
        # some slope's region is beaten: find one whose boundary is all dominated
        assert any(_dominated(et, em, *_region_boundary(t0[i], m0[i], lam, b[i, j])).all()
                   for j, lam in enumerate(hull.lams)), (t0[i], m0[i], b[i])


def test_the_hull_beats_regions_the_corner_alone_cannot():
    """Known plans on a convex staircase; completions that trade time for memory along a line
    above it (their corner, the least time with the least memory, lies below it): the corner
    test keeps them, the hull's drops them."""
    x = np.linspace(1.0, 10.0, 10)
    et, em = x, 10.0 / x  # t m = 10
    hull = HullTest(et, em)
    assert len(hull.lams)
    t0 = np.array([1.5, 3.0])
    m0 = np.array([1.5, 1.5])  # below the staircase: the corner is not dominated
    assert not _dominated(et, em, t0, m0).any()
    b = np.array([[t + lam * 12.0 for lam in hull.lams] for t in (9.0, 12.0)])  # far above it
    assert hull.beaten(t0, m0, b).all()
    # with the lines through the corner itself the region is the corner's quadrant: kept
    assert not hull.beaten(t0, m0, t0[:, None] + hull.lams[None, :] * m0[:, None]).any()


def test_weighted_least_per_configuration_and_slope():
    keys = np.array([0, 0, 2])
    t, m = np.array([1.0, 3.0, 5.0]), np.array([4.0, 1.0, 2.0])
    out = weighted_least(keys, t, m, 3, np.array([0.0, 1.0, 10.0]))
    assert out[0].tolist() == [1.0, 4.0, 13.0]
    assert np.isinf(out[1]).all()
    assert out[2].tolist() == [5.0, 7.0, 25.0]
