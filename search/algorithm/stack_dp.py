"""The DP over a shape's stages (stacks.py: exact search, many cuts): the state after s stages is
the units they cover and the frontier of (slowest stage's time, heaviest stage's memory) per
configuration of the variables carried across that position; linear in the stages.
"""

from __future__ import annotations

import math

import numpy as np

from search.algorithm.frontier import (
    Factor,
    assignments,
    eliminate_var,
    leaf,
    peak_join,
    union,
)
from search.algorithm.results import Split
from search.algorithm.stack_bounds import RestBounds, Staircase
from search.algorithm.stack_solution import StacksSolution
from search.algorithm.stack_stages import MAX_INTERFACE, StageFactors


def by_stages(S: StageFactors, band: list[int], stair: Staircase, t_stage: list[np.ndarray], m_stage: list[np.ndarray],
               rest: RestBounds) -> StacksSolution | None:
    """The DP over the stages (stacks.py: exact search)."""
    tabs = S.tabs
    p, n = tabs.shape.stages, tabs.n_units
    solved = _dp(S, band, stair, t_stage, m_stage, rest)
    if solved is None:
        return None
    root, came_from = solved
    splits, final = _read_back(S, root, came_from, p, n)
    out = Factor(scope=(), keys=np.zeros((len(root), 0), dtype=np.int32), t=root.t, m=root.m + tabs.buffers)
    return StacksSolution(tables=tabs, root=out, partitions=splits, assigns=final, stats=S.stats)


def _dp(S: StageFactors, band: list[int], stair: Staircase, t_stage: list[np.ndarray], m_stage: list[np.ndarray],
        rest: RestBounds) -> tuple[Factor, dict[tuple[int, int], list[int]]] | None:
    """The stage DP over the cuts of the band: the frontier (memory without buffers) and, per
    (stage, end), each united part's start."""
    p, n = S.tabs.shape.stages, S.tabs.n_units
    carried = _carried(S)
    # state after s stages: the units they cover -> the frontier of (slowest stage's time,
    # heaviest stage's memory) over the configurations of the variables carried across that cut
    states: dict[int, Factor] = {0: leaf((), np.zeros((1, 0)), np.zeros(1), np.zeros(1))}
    came_from: dict[tuple[int, int], list[int]] = {}
    for s in range(p):
        parts: dict[int, list[tuple[int, Factor]]] = {}
        for a, state in states.items():
            for k in band:
                e = a + k
                if e > n or not np.isfinite(rest.t[s + 1, e]):
                    continue  # the stages left cannot cover the units left within the band
                lb_t, lb_m = max(t_stage[s][a, e], rest.t[s + 1, e]), max(m_stage[s][a, e], rest.m[s + 1, e])
                if stair.beats_all(np.maximum(state.t, lb_t), np.maximum(state.m, lb_m)).all():
                    continue  # every plan through this stage is beaten: the stage is never solved
                joined = _step(S, state, S.at(s, a, k), s, carried[a], carried[e], stair, lb_t, lb_m)
                if joined is not None and len(joined):
                    parts.setdefault(e, []).append((a, joined))
        states = {}
        for e, got in parts.items():
            came_from[(s, e)] = [a for a, _ in got]
            tag = f"cut:{s}"
            both = union([f for _, f in got], tag)
            states[e] = eliminate_var(both, tag, {**S.domain, tag: len(got)}, S.eps)
    root = states.get(n)
    return (root, came_from) if root is not None and len(root) else None


def _carried(S: StageFactors) -> list[tuple[str, ...]]:
    """Per cut position (0 .. n units), the variables the DP carries across it: every variable a
    stage's interface may hold, from the first position to the last where one of its edges
    crosses (a tied boundary stands for all its copies' outputs, so a stage may eliminate it
    inside while another still reads it: it is carried over the whole span, not only where it
    crosses)."""
    tabs = S.tabs
    span: dict[str, tuple[int, int]] = {}
    for src, dst in tabs.edge_costs:
        lo, hi = sorted((tabs.anchor[src], tabs.anchor[dst]))
        if lo < hi:  # crosses the positions lo + 1 .. hi
            v = S.var(src)
            was = span.get(v, (lo + 1, hi))
            span[v] = (min(was[0], lo + 1), max(was[1], hi))
    return [tuple(v for v, (lo, hi) in span.items() if lo <= e <= hi) for e in range(tabs.n_units + 1)]


def _step(S: StageFactors, state: Factor, f: Factor, s: int, before: tuple[str, ...], after: tuple[str, ...],
          stair: Staircase, lb_t: float, lb_m: float) -> Factor | None:
    """The state after stage s holds `f` (its factor over its interface): each pair of a partial
    plan and a stage point costs the slower time and the heavier memory; the variables not
    carried on are eliminated, those carried on that neither side holds yet are left free (a
    later stage fixes them), and the rows of `f` are kept as `row:s` for the read-back. None
    when the joint configurations exceed MAX_INTERFACE (left out of the space)."""
    dom = S.domain
    joint = dict.fromkeys((*before, *f.scope, *after))
    if math.prod(dom[v] for v in joint) > MAX_INTERFACE:
        return None
    tag = f"row:{s}"
    rows = Factor(scope=(*f.scope, tag), keys=np.c_[f.keys, np.arange(len(f))], t=f.t, m=f.m)

    def admit(t: np.ndarray, m: np.ndarray, keys: np.ndarray) -> np.ndarray:
        return ~stair.beats_all(np.maximum(t, lb_t), np.maximum(m, lb_m))

    drop = tuple(v for v in (*state.scope, *rows.scope) if v not in after)
    out = peak_join(state, rows, drop=drop, domain=dom, eps=S.eps, stats=S.stats, admit=admit)
    for v in after:
        if v not in out.scope:  # free until a later stage reads it
            d = dom[v]
            idx = np.repeat(np.arange(len(out)), d)
            out = Factor(scope=(*out.scope, v), keys=np.c_[out.keys[idx], np.tile(np.arange(d), len(out))],
                         t=out.t[idx], m=out.m[idx], parents=(out,), parent_idx=(idx,))
    cols = [out.scope.index(v) for v in after]
    return Factor(scope=after, keys=out.keys[:, cols], t=out.t, m=out.m, parents=(out,),
                  parent_idx=(np.arange(len(out)),))


def _read_back(S: StageFactors, root: Factor, came_from: dict[tuple[int, int], list[int]], p: int, n: int
               ) -> tuple[list[Split], dict[str, np.ndarray]]:
    """Every point's cut, then every op's configuration from its stages' factors (walked once per
    stage and start for all the points through it)."""
    got = assignments(root, np.arange(len(root)))
    k = len(root)
    starts = np.zeros((k, p + 1), dtype=np.int64)
    starts[:, p] = n
    for s in range(p - 1, -1, -1):
        which = got[f"cut:{s}"]
        starts[:, s] = [came_from[(s, int(e))][int(w)] for e, w in zip(starts[:, s + 1], which, strict=True)]
    sizes = np.diff(starts, axis=1)
    splits: list[Split] = [tuple(int(x) for x in row) for row in sizes]
    final: dict[str, np.ndarray] = {}
    for s in range(p):  # a later stage's read-back of a shared variable overwrites, as it agrees
        for a, size in {(int(a), int(z)) for a, z in zip(starts[:, s], sizes[:, s], strict=True)}:
            pos = np.flatnonzero((starts[:, s] == a) & (sizes[:, s] == size))
            for v, col in assignments(S.at(s, a, size), got[f"row:{s}"][pos]).items():
                final.setdefault(v, np.zeros(k, dtype=np.int64))[pos] = col
    return splits, final
