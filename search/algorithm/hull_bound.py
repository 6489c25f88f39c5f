"""Is every completion of a partial plan beaten by plans known to exist? The convex-hull test.

A partial plan (time t, memory m) still has parts to add - more layers, the ops around the
stack. Each part costs at least its least time and its least memory (the ideal corner) and,
for every slope lam >= 0, at least its least t + lam m (a line under its frontier's lower convex
hull); sums of parts add those minima. So every plan completing the partial one lies in the
region {x >= T0, y >= M0, x + lam y >= B} for each slope, far smaller than the corner's
quadrant when the parts trade time for memory (recomputation: fast and heavy or slow and lean,
never fast and lean). If the known plans' staircase beats every point of such a region, no
completion can reach the frontier and the partial plan goes (exact). The flat search's stack
(ft.py `_StackBound`) and the stage search's one-stage shapes (pipeline.py `_Completion`) ask it.
"""

from __future__ import annotations

import numpy as np

SLOPES = 7  # slopes per test: quantiles of the staircase's own steps, where the test has bite


class HullTest:
    """The test against one staircase of known plans: `env_t` ascending, `env_m` strictly
    descending (a Pareto staircase: each point the least memory within its time)."""

    def __init__(self, env_t: np.ndarray, env_m: np.ndarray) -> None:
        self.env_t, self.env_m = env_t, env_m
        steps = (env_t[1:] - env_t[:-1]) / np.maximum(env_m[:-1] - env_m[1:], 1e-300)
        steps = steps[np.isfinite(steps) & (steps > 0)]
        self.lams = np.unique(np.quantile(steps, np.linspace(0.05, 0.95, SLOPES))) if len(steps) else np.zeros(0)
        # per slope, a step's outer corner (t of the next point, m of this one) lies under the line
        # x + lam y = b iff lam m_i + t_{i+1} <= b: the test takes the max of that over a range
        self.tables = [_sparse_max(lam * env_m[:-1] + env_t[1:]) for lam in self.lams]

    def beaten(self, t0: np.ndarray, m0: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per point i, whether for some slope j the staircase beats the whole region
        {x >= t0[i], y >= m0[i], x + lams[j] y >= b[i, j]}: its lower-left boundary (the segment
        of the line between the two bounds, then the ray along y = m0) lies in the area the
        staircase dominates, checked step by step (a range max). Each slope's region holds the
        true region, so any one beaten suffices. The caller pulls the bounds toward the origin
        by its rounding margin."""
        et, em = self.env_t, self.env_m
        beaten = np.zeros(len(t0), dtype=bool)
        if not len(et):
            return beaten
        i0 = np.searchsorted(et, t0, side="right") - 1
        for j, lam in enumerate(self.lams):
            t1 = b[:, j] - lam * m0  # where the line meets y = m0
            i1 = np.searchsorted(et, t1, side="right") - 1
            ok = (i0 >= 0) & (em[np.maximum(i1, 0)] <= m0)
            inner = i1 > i0
            steps_max = _range_max(self.tables[j], np.maximum(i0, 0), np.maximum(i1 - 1, 0))
            beaten |= ok & (~inner | (steps_max <= b[:, j]))
        return beaten


def weighted_least(keys: np.ndarray, t: np.ndarray, m: np.ndarray, configs: int, lams: np.ndarray) -> np.ndarray:
    """Per configuration (rows, `keys` the configuration of each point; inf where none) and per
    slope (columns), the least t + lam m over the points."""
    out = np.full((configs, len(lams)), np.inf)
    for j, lam in enumerate(lams):
        np.minimum.at(out[:, j], keys, t + lam * m)
    return out


def _sparse_max(values: np.ndarray) -> np.ndarray:
    """Sparse table for O(1) range maxima: row k holds the max of each window of 2**k."""
    rows = [values.astype(np.float64)]
    k = 1
    while (1 << k) <= len(values):
        prev = rows[-1]
        half = 1 << (k - 1)
        rows.append(np.maximum(prev[:-half], prev[half:]) if len(prev) > half else prev[:0])
        k += 1
    width = len(values)
    table = np.full((len(rows), max(width, 1)), -np.inf)
    for i, row in enumerate(rows):
        table[i, : len(row)] = row
    return table


def _range_max(table: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo..hi]) per query (inclusive); -inf where hi < lo."""
    length = hi - lo + 1
    valid = length >= 1
    k = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    k = np.minimum(k, table.shape[0] - 1)
    a = table[k, np.minimum(np.maximum(lo, 0), table.shape[1] - 1)]
    b = table[k, np.minimum(np.maximum(hi - (1 << k) + 1, 0), table.shape[1] - 1)]
    return np.where(valid, np.maximum(a, b), -np.inf)
