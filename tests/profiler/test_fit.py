"""Alpha-beta fitting (profiler/fit.py) recovers known parameters from synthetic timings."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.fit import collective_fit, fit_alpha_beta

SIZES = [4096 * 4**k for k in range(7)]  # 4 KiB .. 16 MiB, as the benchmark sweeps


@pytest.mark.parametrize("alpha,beta", [(25e-6, 1 / 12e9), (3e-3, 1 / 0.8e9), (2e-6, 1 / 400e9)])
def test_exact_timings_give_exact_parameters(alpha: float, beta: float) -> None:
    times = [alpha + beta * s for s in SIZES]
    a, b, res = fit_alpha_beta(SIZES, times)
    assert a == pytest.approx(alpha, rel=1e-9)
    assert b == pytest.approx(beta, rel=1e-9)
    assert res < 1e-9


def test_noisy_timings_recover_latency_and_bandwidth() -> None:
    """5% multiplicative noise: the relative-error fit still finds the latency, which only the
    small messages see (an unweighted fit would let the 16 MiB point swamp it)."""
    rng = np.random.default_rng(0)
    alpha, beta = 50e-6, 1 / 10e9
    sizes = np.repeat(SIZES, 5)
    times = (alpha + beta * sizes) * rng.normal(1.0, 0.05, len(sizes))
    a, b, res = fit_alpha_beta(sizes, times)
    assert a == pytest.approx(alpha, rel=0.1)
    assert b == pytest.approx(beta, rel=0.1)
    assert 0.02 < res < 0.1  # the residual reports the noise


def test_negative_latency_is_clamped_to_zero() -> None:
    """Pure bandwidth with a sub-linear small point would fit a negative intercept; the fit
    keeps alpha at 0 and refits beta alone."""
    times = [1e-9 * s for s in SIZES]
    times[0] *= 0.5
    a, b, _ = fit_alpha_beta(SIZES, times)
    assert a == 0.0
    assert b > 0


def test_one_size_is_all_latency() -> None:
    a, b, res = fit_alpha_beta([1024, 1024, 1024], [1e-4, 1e-4, 1e-4])
    assert (a, b) == (pytest.approx(1e-4), 0.0)
    assert res == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("sizes,times", [([], []), ([1, 2], [1.0]), ([1, 2], [1.0, float("nan")]),
                                         ([1, 2], [1.0, -1.0])])
def test_bad_points_are_rejected(sizes, times) -> None:
    with pytest.raises(ValueError):
        fit_alpha_beta(sizes, times)


def test_collective_fit_keeps_its_points() -> None:
    times = [1e-5 + 2e-10 * s for s in SIZES]
    f = collective_fit("all_gather", 4, SIZES, times)
    assert (f.kind, f.group_size) == ("all_gather", 4)
    assert f.sizes == [float(s) for s in SIZES] and f.times == pytest.approx(times)
    assert f(SIZES[-1]) == pytest.approx(times[-1])
