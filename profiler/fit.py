"""Least-squares alpha-beta fits: time = alpha + beta * x (docs/cli.md, Profiling).

Message sizes span orders of magnitude, so the fit minimises the *relative* error of every point
(each row weighted by 1 / measured time); an unweighted fit would let the largest message decide
alone and leave alpha, the latency, meaningless. Both coefficients are kept non-negative: a
negative latency or bandwidth is noise, and the fit is redone with that coefficient at zero.
"""

from __future__ import annotations

import numpy as np

from search.prices.profile import CollectiveFit, LinearFit


def fit_alpha_beta(sizes, times) -> tuple[float, float, float]:
    """(alpha, beta, residual) of time = alpha + beta * size; residual is the RMS relative
    residual over the points. Needs at least one point with a positive time."""
    x = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if x.shape != t.shape or x.ndim != 1 or len(x) == 0:
        raise ValueError(f"need equal non-empty 1-D sizes and times, got {x.shape} and {t.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(t))) or np.any(t < 0) or np.any(x < 0):
        raise ValueError("sizes and times must be finite and non-negative")
    w = 1.0 / np.maximum(t, max(float(t.max()), 1e-30) * 1e-9)
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    b = t * w
    if len(x) >= 2 and np.ptp(x) > 0:
        (alpha, beta), *_ = np.linalg.lstsq(A, b, rcond=None)
    else:  # one size: all of it is latency
        alpha, beta = float(np.sum(b * A[:, 0]) / np.sum(A[:, 0] ** 2)), 0.0
    if beta < 0:
        alpha, beta = float(np.sum(b * A[:, 0]) / np.sum(A[:, 0] ** 2)), 0.0
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(b * A[:, 1]) / max(np.sum(A[:, 1] ** 2), 1e-300))
    pred = alpha + beta * x
    residual = float(np.sqrt(np.mean(((pred - t) * w) ** 2)))
    return float(alpha), float(max(beta, 0.0)), residual


def linear_fit(sizes, times) -> LinearFit:
    alpha, beta, res = fit_alpha_beta(sizes, times)
    return LinearFit(alpha=alpha, beta=beta, residual=res, sizes=[float(s) for s in sizes],
                     times=[float(t) for t in times])


def collective_fit(kind: str, group_size: int, sizes, times) -> CollectiveFit:
    alpha, beta, res = fit_alpha_beta(sizes, times)
    return CollectiveFit(kind=kind, group_size=group_size, alpha=alpha, beta=beta, residual=res,
                         sizes=[float(s) for s in sizes], times=[float(t) for t in times])
