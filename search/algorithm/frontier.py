"""Pareto frontiers as numpy arrays, grouped by the configurations of the variables in scope.

A `Factor` is a table of frontiers: for every assignment of configurations to the variables in
its scope, the non-dominated (time, memory) points of some part of the graph. Points of all
assignments live in flat arrays (`keys[i]` is the assignment of point i), so every operation is
a handful of vectorised numpy calls, never a Python loop over points:
- `join(a, b)`: Minkowski sum per matching assignment of the shared variables;
- `reduce`: Pareto reduction per assignment (sort, then a segmented running minimum);
- `eliminate_var`: drop a variable from the scope, keeping per remaining assignment the Pareto
  set of the union over the dropped variable's configurations.
Each point remembers which parent points made it, so the configuration of every op can be read
back for any final point (`assignments`).

Exactness and floats: sums taken in different orders differ in the last bits, so points whose
times agree within `RTOL` are treated as one time and the lower memory wins, and a point is kept
only if its memory is lower than every faster point's by more than `RTOL`. Without that, a
2-point layer frontier summed over 96 layers grows to over a thousand "distinct" points instead
of 97 (docs/design.md, FT).

Approximate mode (`eps > 0`): within each assignment, at most one point per cell of a fixed
log-spaced grid of ratio (1 + eps) in both objectives survives a reduction; every dropped point
is within a factor (1 + eps) in both objectives of a kept one, so after d reductions every exact
point is within (1 + eps)^d of a point of the returned frontier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.ma  # noqa: F401  np.unique imports it on its first call (~10 ms): once here, not inside the first search

RTOL = 1e-9


@dataclass(eq=False)
class Factor:
    scope: tuple[str, ...]
    keys: np.ndarray                      # [n, len(scope)] int configuration indices
    t: np.ndarray                         # [n] seconds
    m: np.ndarray                         # [n] bytes
    parents: tuple[Factor, ...] = ()
    parent_idx: tuple[np.ndarray, ...] = ()
    # chains of identical layers (see ft.py): this factor covers `layers` consecutive layers
    layers: int = 0
    layer_leaf: bool = False              # the points below use the template layer's op names
    is_union: bool = False                # parent_idx = (which parent, index in it) per point
    note: str = ""
    # a second memory component kept apart (pipeline.py: activations, weighed per stage after the
    # elimination); with it, reductions keep what is Pareto in (t, m, m2)
    m2: np.ndarray | None = None
    # a layer factor's read-back under the template's names, every point at once (`assignments`)
    table: dict[str, np.ndarray] | None = field(default=None, repr=False)
    # a stack of one block family among several (families.py): the layer maps its layers read
    # back through, from its first layer on (overrides those `assignments` was given)
    maps: list[dict[str, str]] | None = field(default=None, repr=False)
    # a renamed view (segments.py): its one parent's points under other names, read back through
    # this map (the parent's variable names -> this factor's), composed with any map in force
    rename: dict[str, str] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.t)


@dataclass
class Stats:
    joins: int = 0
    pairs: int = 0
    max_factor_points: int = 0


def add_stats(stats: Stats, more: Stats) -> None:
    """Count `more` into `stats` (work counted once, credited again where it is shared)."""
    stats.joins += more.joins
    stats.pairs += more.pairs
    stats.max_factor_points = max(stats.max_factor_points, more.max_factor_points)


def leaf(scope: tuple[str, ...], keys: np.ndarray, t: np.ndarray, m: np.ndarray, note: str = "",
         m2: np.ndarray | None = None) -> Factor:
    return Factor(scope=scope, keys=np.asarray(keys, dtype=np.int32).reshape(len(t), len(scope)),
                  t=np.asarray(t, dtype=np.float64), m=np.asarray(m, dtype=np.float64), note=note,
                  m2=None if m2 is None else np.asarray(m2, dtype=np.float64))


def _group_ids(keys: np.ndarray, radix: np.ndarray) -> np.ndarray:
    if keys.shape[1] == 0:
        return np.zeros(keys.shape[0], dtype=np.int64)
    return keys.astype(np.int64) @ radix


def _radix(domain: list[int]) -> np.ndarray:
    r = np.ones(len(domain), dtype=np.int64)
    for i in range(len(domain) - 2, -1, -1):
        r[i] = r[i + 1] * domain[i + 1]
    return r


def pareto_mask(group: np.ndarray, t: np.ndarray, m: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Indices (sorted by group, then time) of the points that survive Pareto reduction within
    their group."""
    n = len(t)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if eps > 0.0:
        # one point per log-spaced cell: keep the fastest (then leanest) of each cell
        lg = np.log1p(eps)
        tc = np.floor(np.log(np.maximum(t, 1e-300)) / lg).astype(np.int64)
        mc = np.floor(np.log(np.maximum(m, 1e-300)) / lg).astype(np.int64)
        o = np.lexsort((m, t, mc, tc, group))
        first = np.ones(n, dtype=bool)
        first[1:] = (group[o][1:] != group[o][:-1]) | (tc[o][1:] != tc[o][:-1]) | (mc[o][1:] != mc[o][:-1])
        sub = o[first]
        keep = pareto_mask(group[sub], t[sub], m[sub], 0.0)
        return sub[keep]
    # sort by (group, time): two argsorts beat one lexsort by several times here
    o1 = np.argsort(t)  # ties in time are resolved by the clusters below, so no need for stable
    if n and group.min() != group.max():
        o1 = o1[np.argsort(group[o1], kind="stable")]
    g1, t1, m1 = group[o1], t[o1], m[o1]
    newg = np.ones(n, dtype=bool)
    newg[1:] = g1[1:] != g1[:-1]
    # clusters of times equal within RTOL: only the leanest point of a cluster can survive
    newc = newg.copy()
    newc[1:] |= t1[1:] > t1[:-1] * (1.0 + RTOL) + 1e-300
    starts = np.flatnonzero(newc)
    if len(starts) == n:
        cand, cm, start = o1, m1, newg
    else:
        cmin = np.minimum.reduceat(m1, starts)
        cl = np.cumsum(newc) - 1
        at_min = np.flatnonzero(m1 == cmin[cl])
        first = np.unique(cl[at_min], return_index=True)[1]
        pos = at_min[first]
        cand, cm, start = o1[pos], m1[pos], newg[starts]
    k = len(cand)
    gi = np.cumsum(start) - 1
    # exclusive running minimum of memory within each group, on integer ranks (exact)
    order = np.argsort(cm, kind="stable")
    ranks = np.empty(k, dtype=np.int64)
    ranks[order] = np.arange(k)
    acc = np.minimum.accumulate(ranks - gi * k)
    prev = np.empty(k, dtype=np.int64)
    prev[0] = 0
    prev[1:] = acc[:-1]
    prev_m = np.where(start, np.inf, cm[order][np.minimum(np.maximum(prev + gi * k, 0), k - 1)])
    keep = cm < prev_m * (1.0 - RTOL)
    return cand[keep]


PAIRS3 = 4_000_000  # point pairs compared at once by `pareto_mask3`


def pareto_mask3(group: np.ndarray, t: np.ndarray, m: np.ndarray, m2: np.ndarray) -> np.ndarray:
    """Indices (sorted by group, then time) of the points no other point of their group beats
    or equals in all of (t, m, m2), compared exactly (no tolerance: a point is dropped only if
    another is no worse in every component, so every weighing m + c m2, c >= 0, of the
    survivors has the Pareto set of the whole). Pairwise within groups, in chunks."""
    n = len(t)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    o = np.lexsort((m2, m, t, group))
    g, m_, m2_ = group[o], m[o], m2[o]
    # after sorting, only an earlier point of the same group can beat a point
    newg = np.ones(n, dtype=bool)
    newg[1:] = g[1:] != g[:-1]
    start = np.maximum.accumulate(np.where(newg, np.arange(n), 0))
    before = np.arange(n) - start  # earlier points of the same group
    beaten = np.zeros(n, dtype=bool)
    ends = np.cumsum(before)
    lo = 0
    while lo < n:
        hi = int(np.searchsorted(ends, ends[lo] - before[lo] + PAIRS3, side="right"))
        hi = max(hi, lo + 1)
        rows = np.arange(lo, hi)
        c = before[rows]
        i = np.repeat(rows, c)
        j = np.repeat(start[rows], c) + (np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c))
        hit = (m_[j] <= m_[i]) & (m2_[j] <= m2_[i])
        beaten[np.unique(i[hit])] = True
        lo = hi
    return o[~beaten]


def staircase(t: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points sorted by time with the running minimum of memory: `least_memory` looks it up."""
    order = np.argsort(t)
    return t[order], np.minimum.accumulate(m[order])


def least_memory(stair: tuple[np.ndarray, np.ndarray], within: np.ndarray) -> np.ndarray:
    """Per query, the least memory of the staircase's points whose time is <= `within` (inf if none)."""
    st, sm = stair
    i = np.searchsorted(st, within, side="right") - 1
    return np.where(i >= 0, sm[np.maximum(i, 0)] if len(sm) else np.inf, np.inf)


CHUNK_PAIRS = 2_000_000  # pairs materialised at once: bounds memory on long block stacks


def join(a: Factor, b: Factor, drop: tuple[str, ...] = (), domain: dict[str, int] | None = None,
         eps: float = 0.0, stats: Stats | None = None,
         admit: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None,
         bound: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> Factor:
    """Minkowski sum of `a` and `b` per shared assignment, then reduce with `drop` eliminated.

    Pairs are formed in chunks of at most CHUNK_PAIRS and reduced as they go, so memory stays
    bounded however large the two frontiers are (the reduction is associative). `admit(t, m,
    keys)` may veto pairs before the reduction (exact bounds from the caller). `bound(t, m)`,
    with `admit`: False only where `admit` vetoes every pair of time >= t and memory >= m; a row
    of `a` or `b` whose least conceivable pair (its own costs plus the least time and the least
    memory of the rows it meets) it refuses is left out before its pairs are formed - the same
    pairs reach the reduction, in the same order and chunks, with far fewer made when known
    plans beat most of them."""
    if eps == 0.0 and a.m2 is None and b.m2 is None and len(a) * len(b) <= SMALL_PAIRS:
        small = _join_small(a, b, drop, domain or {}, stats, admit)
        if small is not None:
            return small
    shared = [v for v in a.scope if v in b.scope]
    dom = domain or {}
    if shared:
        ra = _radix([dom[v] for v in shared])
        ka = _group_ids(a.keys[:, [a.scope.index(v) for v in shared]], ra)
        kb = _group_ids(b.keys[:, [b.scope.index(v) for v in shared]], ra)
    else:
        ka = np.zeros(len(a), dtype=np.int64)
        kb = np.zeros(len(b), dtype=np.int64)
    ob = np.argsort(kb, kind="stable")
    lo = np.searchsorted(kb[ob], ka, "left")
    cnt = np.searchsorted(kb[ob], ka, "right") - lo
    total = int(cnt.sum())
    chunk_cnt = cnt  # chunks are cut as if every pair were formed: the same chunks reach `reduce`
    if bound is not None and admit is not None and total:
        ob, lo, cnt = _bounded_rows(a, b, ka, kb, ob, lo, cnt, bound)
    out_scope = tuple(v for v in a.scope if v not in drop) + tuple(
        v for v in b.scope if v not in a.scope and v not in drop)
    radix = _radix([dom[v] for v in out_scope])
    from_a = [(v in a.scope, a.scope.index(v) if v in a.scope else b.scope.index(v)) for v in out_scope]

    def pairs(rows: np.ndarray) -> tuple[np.ndarray, ...]:
        c = cnt[rows]
        n = int(c.sum())
        ia = np.repeat(rows, c)
        ib = ob[np.repeat(lo[rows], c) + (np.arange(n) - np.repeat(np.cumsum(c) - c, c))]
        cols = [a.keys[ia, j] if in_a else b.keys[ib, j] for in_a, j in from_a]
        keys = np.stack(cols, axis=1) if cols else np.zeros((n, 0), dtype=np.int32)
        return a.t[ia] + b.t[ib], a.m[ia] + b.m[ib], keys, ia, ib

    three = a.m2 is not None
    assert three == (b.m2 is not None), "both factors keep the second memory component, or neither"

    def reduce(t: np.ndarray, m: np.ndarray, keys: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> tuple[np.ndarray, ...]:
        if admit is not None:
            ok = np.flatnonzero(admit(t, m, keys))
            t, m, keys, ia, ib = t[ok], m[ok], keys[ok], ia[ok], ib[ok]
        if three:
            assert a.m2 is not None and b.m2 is not None
            keep = pareto_mask3(_group_ids(keys, radix), t, m, a.m2[ia] + b.m2[ib])
        else:
            keep = pareto_mask(_group_ids(keys, radix), t, m, eps)
        return t[keep], m[keep], keys[keep], ia[keep], ib[keep]

    if total <= CHUNK_PAIRS:
        t, m, keys, ia, ib = reduce(*pairs(np.arange(len(a))))
    else:
        bounds = np.searchsorted(np.cumsum(chunk_cnt), np.arange(CHUNK_PAIRS, total + CHUNK_PAIRS, CHUNK_PAIRS), "left")
        acc: tuple[np.ndarray, ...] | None = None
        start = 0
        for stop in list(bounds) + [len(a)]:
            stop = max(int(stop) + 1, start + 1) if stop < len(a) else len(a)
            if start >= len(a):
                break
            part = reduce(*pairs(np.arange(start, stop)))
            acc = part if acc is None else reduce(*(np.concatenate([x, y]) for x, y in zip(acc, part, strict=True)))
            start = stop
        assert acc is not None
        t, m, keys, ia, ib = acc
    if stats is not None:
        stats.joins += 1
        stats.pairs += total
    f = Factor(scope=out_scope, keys=keys, t=t, m=m, parents=(a, b), parent_idx=(ia, ib),
               m2=a.m2[ia] + b.m2[ib] if a.m2 is not None and b.m2 is not None else None)
    if stats is not None:
        stats.max_factor_points = max(stats.max_factor_points, len(f))
    return f


def peak_join(a: Factor, b: Factor, drop: tuple[str, ...] = (), domain: dict[str, int] | None = None,
              eps: float = 0.0, stats: Stats | None = None,
              admit: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None) -> Factor:
    """`join` where a pair costs the larger time and the larger memory of the two, not their
    sums: two pipeline stages side by side, the slower and the heavier (stacks.py).

    Not every pair is formed. A pair (i, j) with t_i >= t_j costs (t_i, max(m_i, m_j)), and no
    more with j swapped for the leanest row of j's subgroup (b's rows of one kept assignment)
    whose time is within t_i: so the frontier of each kept assignment is among, for every row
    of one side and every subgroup of the other that it meets, that leanest row - linear in the
    rows where the pairs are quadratic. Which of several equal points survives may differ from
    forming every pair; the points do not."""
    dom = domain or {}
    shared = [v for v in a.scope if v in b.scope]
    out_scope = tuple(v for v in a.scope if v not in drop) + tuple(
        v for v in b.scope if v not in a.scope and v not in drop)
    radix = _radix([dom[v] for v in out_scope])
    from_a = [(v in a.scope, a.scope.index(v) if v in a.scope else b.scope.index(v)) for v in out_scope]
    # integer ranks of every time and memory, both sides together: exact comparisons in the keys below
    t_rank = np.unique(np.concatenate([a.t, b.t]), return_inverse=True)[1]
    m_rank = np.unique(np.concatenate([a.m, b.m]), return_inverse=True)[1]
    ranks = ((t_rank[:len(a)], m_rank[:len(a)]), (t_rank[len(a):], m_rank[len(a):]))

    def shared_ids(f: Factor) -> np.ndarray:
        return _group_ids(f.keys[:, [f.scope.index(v) for v in shared]], _radix([dom[v] for v in shared]))

    def own_ids(f: Factor) -> np.ndarray:
        mine = [v for v in out_scope if v in f.scope and v not in shared]
        return _group_ids(f.keys[:, [f.scope.index(v) for v in mine]], _radix([dom[v] for v in mine]))

    def leanest_within(x: Factor, xr: tuple[np.ndarray, np.ndarray], y: Factor, yr: tuple[np.ndarray, np.ndarray]
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Per row i of x and subgroup of y it meets, the leanest row of that subgroup whose time
        is within x's (first of equals): (i, j) pairs."""
        sx, sy = shared_ids(x), shared_ids(y)
        gy = np.unique(np.stack([sy, own_ids(y)], axis=1), axis=0, return_inverse=True)[1].reshape(-1)
        order = np.lexsort((yr[0], gy))  # y by subgroup, then time
        g_sorted, n_y = gy[order], len(y)
        starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
        sub_shared = sy[order][starts]  # each subgroup's shared key (subgroups sorted by it)
        # running leanest row within each subgroup: (memory rank, position) minimised, reset per subgroup
        big = (int(yr[1].max()) + 1) * n_y if n_y else 1
        code = yr[1][order].astype(np.int64) * n_y + np.arange(n_y) - np.repeat(np.arange(len(starts)), np.diff(
            np.r_[starts, n_y])) * big
        best = np.minimum.accumulate(code) if n_y else code
        best_pos = (best + np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n_y])) * big) % n_y
        # each row of x meets the subgroups of its shared key: a contiguous run of them
        lo = np.searchsorted(sub_shared, sx, "left")
        cnt = np.searchsorted(sub_shared, sx, "right") - lo
        n = int(cnt.sum())
        ix = np.repeat(np.arange(len(x)), cnt)
        g = np.repeat(lo, cnt) + (np.arange(n) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        # last row of subgroup g with time rank <= x's: keys (subgroup, time rank) in sorted order
        span = int(max(xr[0].max(initial=0), yr[0].max(initial=0))) + 1
        keys = g_sorted.astype(np.int64) * span + yr[0][order]
        k = np.searchsorted(keys, g.astype(np.int64) * span + xr[0][ix], "right") - 1
        ok = (k >= 0) & (k >= starts[g])
        return ix[ok], order[best_pos[k[ok]]]

    ia1, ib1 = leanest_within(a, ranks[0], b, ranks[1])
    ib2, ia2 = leanest_within(b, ranks[1], a, ranks[0])
    ia, ib = np.concatenate([ia1, ia2]), np.concatenate([ib1, ib2])
    cols = [a.keys[ia, j] if in_a else b.keys[ib, j] for in_a, j in from_a]
    keys = np.stack(cols, axis=1) if cols else np.zeros((len(ia), 0), dtype=np.int32)
    t, m = np.maximum(a.t[ia], b.t[ib]), np.maximum(a.m[ia], b.m[ib])
    if admit is not None:
        ok = np.flatnonzero(admit(t, m, keys))
        t, m, keys, ia, ib = t[ok], m[ok], keys[ok], ia[ok], ib[ok]
    keep = pareto_mask(_group_ids(keys, radix), t, m, eps)
    if stats is not None:
        stats.joins += 1
        stats.pairs += len(ia)
    return Factor(scope=out_scope, keys=keys[keep], t=t[keep], m=m[keep], parents=(a, b),
                  parent_idx=(ia[keep], ib[keep]))


def _bounded_rows(a: Factor, b: Factor, ka: np.ndarray, kb: np.ndarray, ob: np.ndarray, lo: np.ndarray,
                  cnt: np.ndarray, bound: Callable[[np.ndarray, np.ndarray], np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`join`'s (ob, lo, cnt) without the rows `bound` rules out: a row of `a` paired with the
    least time and the least memory of its group's rows of `b`, then a row of `b` with those of
    the rows of `a` left. Exact: float sums are monotone, so each pair left out costs at least
    the pair refused, which `bound` says `admit` would veto. Rows keep their order."""
    kbs = kb[ob]
    starts = np.flatnonzero(np.r_[True, kbs[1:] != kbs[:-1]])
    tb, mb = np.minimum.reduceat(b.t[ob], starts), np.minimum.reduceat(b.m[ob], starts)
    gi = np.minimum(np.searchsorted(kbs[starts], ka), len(starts) - 1)
    alive = (cnt > 0) & bound(a.t + tb[gi], a.m + mb[gi])
    cnt = np.where(alive, cnt, 0)
    rows = np.flatnonzero(alive)
    if not len(rows):
        return ob, lo, cnt
    # the rows of b: each group's least time and memory over the rows of a left in it
    oa = rows[np.argsort(ka[rows], kind="stable")]
    kas = ka[oa]
    a_starts = np.flatnonzero(np.r_[True, kas[1:] != kas[:-1]])
    ta, ma = np.minimum.reduceat(a.t[oa], a_starts), np.minimum.reduceat(a.m[oa], a_starts)
    ga = np.minimum(np.searchsorted(kas[a_starts], kbs), len(a_starts) - 1)
    met = kas[a_starts][ga] == kbs
    keep_b = met & bound(b.t[ob] + ta[ga], b.m[ob] + ma[ga])
    ob = ob[keep_b]
    kbs = kbs[keep_b]
    lo = np.searchsorted(kbs, ka, "left")
    cnt = np.where(alive, np.searchsorted(kbs, ka, "right") - lo, 0)
    return ob, lo, cnt


SMALL_PAIRS = 256  # at most this many point pairs: `_join_small` (numpy's per-call overhead dominates)


def _join_small(a: Factor, b: Factor, drop: tuple[str, ...], domain: dict[str, int], stats: Stats | None,
                admit: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None) -> Factor | None:
    """`join` of two small factors in plain Python: most joins of a layer's elimination pair a
    few points with a few, where numpy's per-call overhead costs several times the arithmetic.
    The result is `join`'s to the bit - the same sums, the same points kept in the same order -
    whenever no two pairs of one group have times equal within RTOL (the order is then the
    group's time order, which both paths sort by); otherwise None, and `join` reduces them
    (which of two equal-time pairs survives follows numpy's sort there). `admit` vetoes pairs as
    in `join`, asked once for every pair (its rows bound, `join`'s `bound`, only saves pairs it
    would veto)."""
    a_scope, b_scope = a.scope, b.scope
    shared_a = [a_scope.index(v) for v in a_scope if v in b_scope]
    shared_b = [b_scope.index(v) for v in a_scope if v in b_scope]
    out_scope = tuple(v for v in a_scope if v not in drop) + tuple(
        v for v in b_scope if v not in a_scope and v not in drop)
    take_a = [a_scope.index(v) for v in out_scope if v in a_scope]
    take_b = [b_scope.index(v) for v in out_scope if v not in a_scope]
    a_keys, b_keys = a.keys.tolist(), b.keys.tolist()
    at, am, bt, bm = a.t.tolist(), a.m.tolist(), b.t.tolist(), b.m.tolist()
    by_key: dict[tuple[int, ...], list[int]] = {}
    # a side whose every variable is shared, in scope order (a stack's powers: the boundary
    # alone), keys its rows by the whole row
    whole_b = shared_b == list(range(len(b_scope)))
    for j, k in enumerate(b_keys):
        by_key.setdefault(tuple(k) if whole_b else tuple(k[c] for c in shared_b), []).append(j)
    whole_a = shared_a == list(range(len(a_scope)))
    # (out keys, time, memory, i, j); out keys order as their group ids do (each key < its domain)
    pairs: list[tuple[tuple[int, ...], float, float, int, int]] = []
    for i, k in enumerate(a_keys):
        js = by_key.get(tuple(k) if whole_a else tuple(k[c] for c in shared_a))
        if not js:
            continue
        ka = [k[c] for c in take_a]
        ti, mi = at[i], am[i]
        if not take_b:  # every pair of row i has its out key
            out = tuple(ka)
            for j in js:
                pairs.append((out, ti + bt[j], mi + bm[j], i, j))
            continue
        for j in js:
            kb = b_keys[j]
            pairs.append((tuple(ka + [kb[c] for c in take_b]), ti + bt[j], mi + bm[j], i, j))
    total = len(pairs)
    if admit is not None and pairs:
        ok = admit(np.array([p[1] for p in pairs], dtype=np.float64), np.array([p[2] for p in pairs], dtype=np.float64),
                   np.array([p[0] for p in pairs], dtype=np.result_type(a.keys, b.keys)).reshape(total, len(out_scope)))
        pairs = [p for p, keep in zip(pairs, ok.tolist(), strict=True) if keep]
    # by (out keys, time): the whole tuples order so too, as two pairs of one group with equal
    # times return None below whichever comes first (and no key function runs per pair)
    pairs.sort()
    kept = []
    group: tuple[int, ...] | None = None
    prev_t = least = 0.0
    for p in pairs:
        g, t, m = p[0], p[1], p[2]
        if g != group:
            group, least = g, np.inf
            kept.append(p)
        else:
            if t <= prev_t * (1.0 + RTOL) + 1e-300:
                return None  # a cluster of equal times: numpy's tie order decides, `join` reduces it
            if m < least * (1.0 - RTOL):
                kept.append(p)
        prev_t = t
        least = min(least, m)
    if stats is not None:
        stats.joins += 1
        stats.pairs += total
    n = len(kept)
    keys = np.array([p[0] for p in kept], dtype=np.result_type(a.keys, b.keys)).reshape(n, len(out_scope))
    f = Factor(scope=out_scope, keys=keys, t=np.array([p[1] for p in kept], dtype=np.float64),
               m=np.array([p[2] for p in kept], dtype=np.float64), parents=(a, b),
               parent_idx=(np.array([p[3] for p in kept], dtype=np.int64), np.array([p[4] for p in kept], dtype=np.int64)))
    if stats is not None:
        stats.max_factor_points = max(stats.max_factor_points, n)
    return f


def eliminate_var(f: Factor, var: str, domain: dict[str, int], eps: float = 0.0) -> Factor:
    out_scope = tuple(v for v in f.scope if v != var)
    cols = [f.scope.index(v) for v in out_scope]
    keys = f.keys[:, cols]
    group = _group_ids(keys, _radix([domain[v] for v in out_scope]))
    keep = pareto_mask(group, f.t, f.m, eps) if f.m2 is None else pareto_mask3(group, f.t, f.m, f.m2)
    return Factor(scope=out_scope, keys=keys[keep], t=f.t[keep], m=f.m[keep], parents=(f,), parent_idx=(keep,),
                  m2=None if f.m2 is None else f.m2[keep])


def select(f: Factor, sel: np.ndarray) -> Factor:
    """The points `sel` of f (a pruning step): provenance and stack length carry over."""
    if len(sel) == len(f):
        return f
    return Factor(scope=f.scope, keys=f.keys[sel], t=f.t[sel], m=f.m[sel], parents=(f,), parent_idx=(sel,),
                  layers=f.layers, m2=None if f.m2 is None else f.m2[sel])


def restrict_equal(f: Factor, a: str, b: str, new_name: str) -> Factor:
    """Keep the points where variables a and b take the same configuration; name it new_name."""
    ia, ib = f.scope.index(a), f.scope.index(b)
    sel = np.nonzero(f.keys[:, ia] == f.keys[:, ib])[0]
    rest = [i for i, v in enumerate(f.scope) if v not in (a, b)]
    scope = (new_name,) + tuple(f.scope[i] for i in rest)
    keys = np.concatenate([f.keys[sel][:, [ia]], f.keys[sel][:, rest]], axis=1)
    return Factor(scope=scope, keys=keys, t=f.t[sel], m=f.m[sel], parents=(f,), parent_idx=(sel,),
                  m2=None if f.m2 is None else f.m2[sel])


def union(parts: list[Factor], var: str, note: str = "") -> Factor:
    """The points of several factors over the same scope, each tagged with its position in
    `parts` as the value of a new variable `var` (e.g. whether a block is recomputed)."""
    scope = parts[0].scope
    assert all(p.scope == scope for p in parts)
    which = np.concatenate([np.full(len(p), i, dtype=np.int64) for i, p in enumerate(parts)])
    inner = np.concatenate([np.arange(len(p)) for p in parts])
    keys = np.concatenate([np.c_[p.keys, np.full(len(p), i, dtype=p.keys.dtype)] for i, p in enumerate(parts)])
    return Factor(scope=scope + (var,), keys=keys, t=np.concatenate([p.t for p in parts]),
                  m=np.concatenate([p.m for p in parts]), parents=tuple(parts), parent_idx=(which, inner),
                  note=note or "union", is_union=True,
                  m2=np.concatenate([p.m2 for p in parts]) if all(p.m2 is not None for p in parts) else None)


def assignments(root: Factor, idx: np.ndarray, layer_maps: list[dict[str, str]] | None = None) -> dict[str, np.ndarray]:
    """Configuration of every variable for the points `idx` of `root`, read back through the
    provenance. Chain factors (see ft.py) map the template layer's names to each layer's."""
    idx = np.asarray(idx)
    n = len(idx)
    out: dict[str, np.ndarray] = {}
    # (factor, point indices, their positions in the output, layer offset, name mapping, the
    # layer maps in force)
    stack: list[tuple[Factor, np.ndarray, np.ndarray, int, dict[str, str] | None, list[dict[str, str]] | None]] = [
        (root, idx, np.arange(n), 0, None, layer_maps)]
    while stack:
        f, ix, pos, offset, mapping, maps = stack.pop()
        if f.maps is not None:
            maps, offset = f.maps, 0
        if f.layer_leaf and maps is not None:
            mapping = maps[offset]
        if f.layer_leaf and maps is not None and len(ix):
            # every layer of a stack reads back through the one template factor: walk its
            # provenance once for all its points, then each layer looks its points up (both
            # recomputation cases of a layer hold the same ops, so the names are the walk's)
            assert mapping is not None
            if f.table is None:
                f.table = assignments(f, np.arange(len(f)))
            for v, col in f.table.items():
                out.setdefault(mapping.get(v, v), np.zeros(n, dtype=np.int64))[pos] = col[ix]
            continue
        for j, v in enumerate(f.scope):
            name = mapping.get(v, v) if mapping else v
            out.setdefault(name, np.zeros(n, dtype=np.int64))[pos] = f.keys[ix, j]
        if f.rename is not None:
            stack.append((f.parents[0], f.parent_idx[0][ix], pos, offset, _compose(mapping, f.rename), maps))
            continue
        if f.is_union:
            which, inner = f.parent_idx
            for k, p in enumerate(f.parents):
                sel = which[ix] == k
                if sel.any():
                    stack.append((p, inner[ix[sel]], pos[sel], offset, mapping, maps))
            continue
        if f.layers and len(f.parents) == 2 and not f.layer_leaf:
            left, right = f.parents
            stack.append((left, f.parent_idx[0][ix], pos, offset, mapping, maps))
            stack.append((right, f.parent_idx[1][ix], pos, offset + left.layers, mapping, maps))
            continue
        for p, pix in zip(f.parents, f.parent_idx, strict=True):
            stack.append((p, pix[ix], pos, offset, mapping, maps))
    return out


def renamed(f: Factor, names: dict[str, str]) -> Factor:
    """f's points over its variables renamed by `names` (every variable of f's scope named):
    one solution of a part of the graph standing for another part whose factors are f's under
    those names (segments.py). Read back through `names`, so the parent's provenance is walked
    under this factor's names."""
    return Factor(scope=tuple(names[v] for v in f.scope), keys=f.keys, t=f.t, m=f.m, parents=(f,),
                  parent_idx=(np.arange(len(f)),), note=f"renamed {f.note}", m2=f.m2, rename=names)


def _compose(outer: dict[str, str] | None, inner: dict[str, str]) -> dict[str, str]:
    """The names `inner` gives, then `outer` (the map in force above a renamed view)."""
    if not outer:
        return inner
    return {**outer, **{k: outer.get(v, v) for k, v in inner.items()}}
