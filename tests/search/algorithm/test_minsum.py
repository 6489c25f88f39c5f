"""The min-sum elimination (search/algorithm/minsum.py) against brute force over every
assignment: the pipeline search drops a shape on its minima, so they must be the true ones."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from search.algorithm.frontier import leaf
from search.algorithm.minsum import _combined, eliminated, least_sums

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


def _plain_elimination(tables, domain, keep):
    """The elimination as it ran before the index: every step scans every table for the
    variable whose tables' union of scopes is smallest (ties: by name) and for its tables."""
    tables = list(tables)
    remaining = {v for own, _ in tables for v in own} - set(keep)
    order = []

    def size(v):
        n = 1
        for u in {u for own, _ in tables if v in own for u in own}:
            n *= domain[u]
        return n, v

    while remaining:
        v = min(remaining, key=size)
        mine = [t for t in tables if v in t[0]]
        tables = [t for t in tables if v not in t[0]]
        scope, arr = _combined(mine, domain)
        axis = scope.index(v)
        tables.append((scope[:axis] + scope[axis + 1:], arr.min(axis=axis)))
        remaining.discard(v)
        order.append(v)
    return tables, order


@st.composite
def dense_tables(draw):
    """Random tables over up to 12 variables: chains, stars and cycles of scopes, many ties of
    size so that the tie-breaking matters."""
    names = [f"v{i}" for i in range(draw(st.integers(1, 12)))]
    domain = {v: draw(st.integers(1, 3)) for v in names}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tables = []
    for _ in range(draw(st.integers(1, 14))):
        scope = tuple(draw(st.lists(st.sampled_from(names), min_size=0, max_size=3, unique=True)))
        arr = rng.uniform(0.0, 10.0, [domain[v] for v in scope] + [2])
        arr[rng.uniform(size=arr.shape) < 0.1] = np.inf
        tables.append((scope, arr))
    keep = tuple(draw(st.lists(st.sampled_from(names), max_size=2, unique=True)))
    return domain, tables, keep


@settings(max_examples=300, deadline=None)
@given(dense_tables())
def test_indexed_elimination_is_the_plain_one(case):
    """The indexed elimination goes in the same order and leaves the same tables, bit for bit
    (the same sums in the same order), as the scan over every table it replaced."""
    domain, tables, keep = case
    got, got_order = eliminated(tables, domain, keep)
    want, want_order = _plain_elimination(tables, domain, keep)
    assert got_order == want_order
    assert [own for own, _ in got] == [own for own, _ in want]
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)
