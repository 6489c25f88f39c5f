"""`eliminate_all` keeps its variables' weights in a heap; here it meets the scan over every
remaining variable it replaced, on random factor graphs: the same order, so the same joins and
the same frontier, bit for bit (points, keys and their order)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from search.algorithm.factor_graph import JoinMemo, eliminate_all
from search.algorithm.frontier import Factor, Stats, eliminate_var, join, leaf


def _scan_eliminate_all(factors: list[Factor], domain: dict[str, int], keep: tuple[str, ...]) -> Factor:
    """The elimination as it ran before the heap: every step scans every remaining variable."""
    live: dict[int, Factor] = dict(enumerate(factors))
    next_id = len(live)
    by_var: dict[str, set[int]] = {}
    for fid, f in live.items():
        for v in f.scope:
            by_var.setdefault(v, set()).add(fid)
    remaining = set(by_var) - set(keep)
    id_of = {id(f): fid for fid, f in live.items()}

    def weight(v: str) -> tuple[float, str]:
        scope: set[str] = set()
        est = 1.0
        for fid in by_var[v]:
            f = live[fid]
            scope.update(f.scope)
            keys = 1
            for u in f.scope:
                keys *= domain[u]
            est *= max(len(f), 1) / keys
        for u in scope:
            est *= domain[u]
        return (est, v)

    while remaining:
        v = min(remaining, key=weight)
        mine = sorted((live.pop(fid) for fid in by_var.pop(v)), key=len)
        for f in mine:
            for u in f.scope:
                if u != v:
                    by_var[u].discard(id_of[id(f)])
        if len(mine) == 1:
            acc = eliminate_var(mine[0], v, domain)
        else:
            acc = mine[0]
            for k, f in enumerate(mine[1:]):
                acc = join(acc, f, drop=(v,) if k == len(mine) - 2 else (), domain=domain)
        live[next_id] = acc
        id_of[id(acc)] = next_id
        for u in acc.scope:
            by_var[u].add(next_id)
        next_id += 1
        remaining.discard(v)
    rest = sorted(live.values(), key=len)
    acc = rest[0]
    for f in rest[1:]:
        acc = join(acc, f, domain=domain)
    return acc


@st.composite
def factor_graphs(draw):
    """Up to 10 variables, tables of 1 to 3 of them with several points per assignment (so that
    the weights, which count points, differ and tie)."""
    names = [f"v{i}" for i in range(draw(st.integers(1, 10)))]
    domain = {v: draw(st.integers(1, 3)) for v in names}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    factors = []
    for _ in range(draw(st.integers(1, 12))):
        scope = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)))
        keys = [k for k in itertools.product(*(range(domain[v]) for v in scope)) for _ in range(int(rng.integers(1, 3)))]
        t = np.round(rng.uniform(0.0, 10.0, len(keys)), 1)
        m = np.round(rng.uniform(0.0, 10.0, len(keys)), 1)
        factors.append(leaf(scope, np.array(keys, dtype=np.int32).reshape(len(keys), len(scope)), t, m))
    keep = tuple(draw(st.lists(st.sampled_from(names), max_size=2, unique=True)))
    return domain, factors, keep


@settings(max_examples=200, deadline=None)
@given(factor_graphs())
def test_heap_order_is_the_scan_order(case):
    domain, factors, keep = case
    got = eliminate_all(factors, domain, keep)
    want = _scan_eliminate_all(factors, domain, keep)
    assert got.scope == want.scope
    assert np.array_equal(got.keys, want.keys)
    assert np.array_equal(got.t, want.t) and np.array_equal(got.m, want.m)


@settings(max_examples=100, deadline=None)
@given(factor_graphs(), st.integers(0, 2**32 - 1))
def test_a_shared_memo_changes_nothing(case, seed):
    """Two problems of one mesh (a ZeRO stage, another), the second with some tables re-priced
    and the others equal but made anew: with one JoinMemo each frontier and each Stats is the
    plain elimination's, bit for bit; the second reuses joins when it has anything in common."""
    domain, factors, keep = case
    rng = np.random.default_rng(seed)
    redo = rng.random(len(factors)) < 0.3
    changed = [leaf(f.scope, f.keys, f.t * 2.0 + 1.0, f.m, note=f.note) if r
               else leaf(f.scope, f.keys.copy(), f.t.copy(), f.m.copy(), note=f.note) for f, r in zip(factors, redo, strict=True)]
    memo = JoinMemo()
    for problem in (factors, changed):
        plain_stats, memo_stats = Stats(), Stats()
        want = eliminate_all(problem, domain, keep, stats=plain_stats)
        made = len(memo.done)
        got = eliminate_all([memo.leaf(f) for f in problem], domain, keep, stats=memo_stats, memo=memo)
        assert got.scope == want.scope
        assert np.array_equal(got.keys, want.keys)
        assert np.array_equal(got.t, want.t) and np.array_equal(got.m, want.m)
        assert memo_stats == plain_stats
    if not redo.any():
        assert len(memo.done) == made  # the same problem again: every join and elimination reused
