"""The min-sum elimination (search/algorithm/minsum.py) against brute force over every
assignment: the pipeline search drops a shape on its minima, so they must be the true ones."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from search.algorithm.frontier import leaf
from search.algorithm.minsum import least_sums

VARS = ("a", "b", "c", "d", "e")


@st.composite
def factor_graphs(draw):
    domain = {v: draw(st.integers(1, 3)) for v in VARS}
    factors = []
    for _ in range(draw(st.integers(1, 7))):
        scope = tuple(draw(st.lists(st.sampled_from(VARS), min_size=0, max_size=3, unique=True)))
        keys = list(itertools.product(*(range(domain[v]) for v in scope)))
        # a leaf need not cover every assignment: a missing one is no plan (inf)
        keep = draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)))
        keys = [k for k, ok in zip(keys, keep, strict=True) if ok] or keys[:1]
        t = draw(st.lists(st.floats(0.0, 10.0), min_size=len(keys), max_size=len(keys)))
        m = draw(st.lists(st.floats(0.0, 10.0), min_size=len(keys), max_size=len(keys)))
        factors.append(leaf(scope, np.array(keys, dtype=np.int32).reshape(len(keys), len(scope)), t, m))
    keep_vars = tuple(draw(st.lists(st.sampled_from(VARS), max_size=2, unique=True)))
    return domain, factors, keep_vars


@settings(max_examples=150, deadline=None)
@given(factor_graphs())
def test_least_sums_equal_brute_force(case):
    domain, factors, keep = case
    weights = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.5], [0.25, 2.0]])
    got = least_sums([factors], domain, keep, weights)[..., 0, :]
    assert got.shape == (*(domain[v] for v in keep), len(weights))
    want = np.full(got.shape, np.inf)
    tables = [{tuple(int(x) for x in k): (t, m) for k, t, m in zip(f.keys, f.t, f.m, strict=True)} for f in factors]
    for full in itertools.product(*(range(domain[v]) for v in VARS)):
        at = dict(zip(VARS, full, strict=True))
        t = m = 0.0
        for f, table in zip(factors, tables, strict=True):
            pt = table.get(tuple(at[v] for v in f.scope))
            if pt is None:
                break
            t, m = t + pt[0], m + pt[1]
        else:
            idx = tuple(at[v] for v in keep)
            want[idx] = np.minimum(want[idx], weights @ np.array([t, m]))
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-12, atol=1e-12)
