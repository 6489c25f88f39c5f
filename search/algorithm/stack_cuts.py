"""Each cut of a shape on its own (stacks.py: exact search, few cuts): per joint interface
configuration the pointwise maximum of the stages' staircases, the union over configurations
and cuts Pareto-reduced; the most promising cuts and configurations first, so the plans they
give bound the rest out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from search.algorithm.frontier import (
    Factor,
    assignments,
    pareto_mask,
)
from search.algorithm.pipeline import partitions
from search.algorithm.results import Split
from search.algorithm.stack_bounds import Staircase
from search.algorithm.stack_solution import StacksSolution
from search.algorithm.stack_stages import MAX_INTERFACE, StageFactors
from search.algorithm.stack_tables import STACKS_BAND


def by_cuts(S: StageFactors, cuts: list[Split], stair: Staircase, t_bound: list[np.ndarray], m_bound: list[np.ndarray]
             ) -> StacksSolution | None:
    """Each cut on its own: per stage the factor over its interface; per joint interface
    configuration the pointwise maximum of the stages' staircases (`_max_frontier`); the union
    over configurations and cuts, Pareto-reduced. A cut, or a configuration, whose bound a plan
    already found (or known) beats is never combined: the cuts and configurations most
    promising first, the end stages (few variants across cuts) solved first."""
    tabs, eps = S.tabs, S.eps
    p = tabs.shape.stages
    stage_factors: dict[int, list[Factor]] = {}
    done: list[tuple[int, int, np.ndarray, np.ndarray, list[np.ndarray], np.ndarray]] = []
    # the cuts most promising first: their points bound the rest, and a cut whose bound a found
    # point beats is never solved. The points are gathered back in (cut, configuration) order,
    # so the frontier and its ties do not depend on the order of work.
    t_cut, m_cut, t_stage, m_stage = _cut_bounds(cuts, t_bound, m_bound)
    order = np.lexsort((np.arange(len(cuts)), m_cut, t_cut))
    order = order[~stair.beats_all(t_cut[order], m_cut[order])]  # the known plans, at once
    if p > 1 and len(order):
        # the end stages' few variants solved for every remaining cut at once, their own
        # fastest and leanest points in place of the ops' cheapest
        for s in (p - 1, 0):
            starts = np.array([sum(cuts[ci][:s]) for ci in order])
            sizes = np.array([cuts[ci][s] for ci in order])
            for a, k in set(zip(starts.tolist(), sizes.tolist(), strict=True)):
                f = S.at(s, a, k)
                at = order[(starts == a) & (sizes == k)]
                t_stage[at, s] = float(f.t.min()) if len(f) else np.inf
                m_stage[at, s] = float(f.m.min()) if len(f) else np.inf
            # the last stage's own points may already bound a cut out: its first stage is then
            # never solved (a solved stage's least points are at least its bound, so the cuts
            # dropped here are dropped below as well, and the same cuts remain)
            t_cut, m_cut = t_stage.max(axis=1), m_stage.max(axis=1)
            order = order[np.isfinite(t_cut[order])]
            order = order[~stair.beats_all(t_cut[order], m_cut[order])]
        order = order[np.lexsort((order, m_cut[order], t_cut[order]))]
    for ci in order:
        if stair.beats(float(t_cut[ci]), float(m_cut[ci])):
            continue
        # the end stages first (the head's and the embedding's; few variants across cuts): each
        # solved stage's own fastest and leanest points tighten the cut's bound
        tb, mb = t_stage[ci].copy(), m_stage[ci].copy()
        beaten = False
        for s in (p - 1, 0, *range(1, p - 1)) if p > 1 else (0,):
            f = S.at(s, *_stage_span(cuts[ci], s))
            if len(f) == 0:
                beaten = True
                break
            tb[s], mb[s] = float(f.t.min()), float(f.m.min())
            if stair.beats(float(tb.max()), float(mb.max())):
                beaten = True
                break
        if beaten:
            continue
        fs = stage_factors[int(ci)] = [S.at(s, *_stage_span(cuts[ci], s)) for s in range(p)]
        c = _combinations(S, int(ci), fs)  # the cut's joint interface configurations and their bounds
        if c is None:
            continue
        order = np.lexsort((c.combo, c.m_lb, c.t_lb))
        for start in range(0, len(order), Staircase.BATCH):
            chunk = order[start:start + Staircase.BATCH]
            for i in chunk[~stair.beats_all(c.t_lb[chunk], c.m_lb[chunk])]:
                if stair.beats(float(c.t_lb[i]), float(c.m_lb[i])):  # a point found within this chunk
                    continue
                rows = [S.table(f).rows[int(g)] for f, g in zip(fs, c.gids[i], strict=True)]
                t, m, chosen = _max_frontier([(f.t[r], f.m[r]) for f, r in zip(fs, rows, strict=True)])
                done.append((c.cut, int(c.combo[i]), t, m, rows, chosen))
                stair.add(t, m)
    if not done:
        return None
    done.sort(key=lambda d: (d[0], d[1]))
    t_all = np.concatenate([d[2] for d in done])
    m_all = np.concatenate([d[3] for d in done])
    owner = np.concatenate([np.full(len(d[2]), i) for i, d in enumerate(done)])
    local = np.concatenate([np.arange(len(d[2])) for d in done])
    keep = pareto_mask(np.zeros(len(t_all), dtype=np.int64), t_all, m_all, eps)
    n = len(keep)
    splits = [tuple(cuts[done[owner[k]][0]]) for k in keep]
    # read back per (cut, stage), all its kept points in one walk: one walk per point cost
    # minutes on T5 (each walk visits the stage factor's whole provenance)
    by_cut: dict[int, list[int]] = {}
    for j, k in enumerate(keep):
        by_cut.setdefault(done[owner[k]][0], []).append(j)
    final: dict[str, np.ndarray] = {}
    for ci, js in by_cut.items():
        pos = np.array(js)
        for s, f in enumerate(stage_factors[ci]):
            picked = np.array([_stage_row(done[owner[keep[j]]], int(local[keep[j]]), s) for j in js])
            for v, a in assignments(f, picked).items():
                final.setdefault(v, np.zeros(n, dtype=np.int64))[pos] = a
    # every stage holds the mesh's constant buffers (evaluate_stacks adds them per stage)
    root = Factor(scope=(), keys=np.zeros((n, 0), dtype=np.int32), t=t_all[keep], m=m_all[keep] + tabs.buffers)
    return StacksSolution(tables=tabs, root=root, partitions=splits, assigns=final, stats=S.stats)


def _stage_row(combined: tuple[int, int, np.ndarray, np.ndarray, list[np.ndarray], np.ndarray],
               point: int, s: int) -> int:
    """Stage s's factor row behind one point of a combined configuration."""
    rows, chosen = combined[4], combined[5]
    return int(rows[s][chosen[point, s]])


@functools.lru_cache(maxsize=64)
def band_cuts(n_units: int, p: int) -> list[Split]:
    """The cuts of the band, made once per (units, stages): every shape with p stages shares
    them (hundreds of thousands for 16 stages over 24 units)."""
    return partitions(n_units, p, 1, STACKS_BAND)


def _stage_span(cut: Split, s: int) -> tuple[int, int]:
    """Stage s's first unit and unit count under a cut."""
    return sum(cut[:s]), cut[s]


def _cut_bounds(cuts: list[Split], t_bound: list[np.ndarray], m_bound: list[np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per cut, a (time, memory) none of its plans beats (the slowest and the heaviest stage's
    bounds, `stage_bounds`) and those per-stage bounds ([cut, stage])."""
    arr = np.asarray(cuts, dtype=np.int64).reshape(len(cuts), len(t_bound))
    ends = np.cumsum(arr, axis=1)
    starts = ends - arr
    t_s = np.stack([t_bound[s][starts[:, s], ends[:, s]] for s in range(arr.shape[1])], axis=1)
    m_s = np.stack([m_bound[s][starts[:, s], ends[:, s]] for s in range(arr.shape[1])], axis=1)
    return t_s.max(axis=1), m_s.max(axis=1), t_s, m_s


@dataclass
class _Combinations:
    """The joint interface configurations of one cut under which every stage has a plan, in
    enumeration order: their indices, each stage's group (`gids`, one row per configuration)
    and their bounds."""

    cut: int
    combo: np.ndarray
    gids: np.ndarray
    t_lb: np.ndarray
    m_lb: np.ndarray


def _combinations(S: StageFactors, ci: int, fs: list[Factor]) -> _Combinations | None:
    """One cut's joint interface configurations, enumerated at once. The bound of one is the
    slowest stage's fastest point and the heaviest stage's leanest one: no point of it beats
    that. None when none exists or the cut's interface is too large (MAX_INTERFACE)."""
    iface = list(dict.fromkeys(v for f in fs for v in f.scope))
    sizes = [len(S.tabs.op_costs[v].configs) for v in iface]
    total = math.prod(sizes)
    if total > MAX_INTERFACE:
        return None
    digits = np.unravel_index(np.arange(total), sizes) if iface else ()
    gids, t_lb, m_lb = [], np.zeros(total), np.zeros(total)
    valid = np.ones(total, dtype=bool)
    for f in fs:
        table = S.table(f)
        pos = [iface.index(v) for v in f.scope]
        flat = (np.ravel_multi_index(tuple(digits[i] for i in pos), table.shape)
                if pos else np.zeros(total, dtype=np.int64))
        g = table.gid.reshape(-1)[flat]
        valid &= g >= 0
        g = np.maximum(g, 0)
        gids.append(g)
        t_lb = np.maximum(t_lb, table.t_min[g])
        m_lb = np.maximum(m_lb, table.m_min[g])
    keep = np.flatnonzero(valid)
    if not len(keep):
        return None
    return _Combinations(cut=ci, combo=keep, gids=np.stack(gids, axis=1)[keep], t_lb=t_lb[keep], m_lb=m_lb[keep])


def _max_frontier(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Pareto set of (max_s t, max_s m) over one point per stage: for each candidate time,
    every stage's leanest point within it. Returns t, m and the chosen point of each stage."""
    order = [np.argsort(t, kind="stable") for t, _ in parts]
    sorted_t = [t[o] for (t, _), o in zip(parts, order, strict=True)]
    run_min = []
    for (_, m), o in zip(parts, order, strict=True):
        mm = m[o]
        # the leanest point among the first i + 1 (the first of equals): a new prefix minimum
        # wherever a point is strictly leaner than all before it
        before = np.concatenate([[np.inf], np.minimum.accumulate(mm)[:-1]])
        run_min.append(np.maximum.accumulate(np.where(mm < before, np.arange(len(mm)), 0)))
    floor = max(st[0] for st in sorted_t)
    taus = np.unique(np.concatenate([st[st >= floor] for st in sorted_t]))
    chosen = []
    T = np.zeros(len(taus))
    M = np.zeros(len(taus))
    for st, o, rm, (t, m) in zip(sorted_t, order, run_min, parts, strict=True):
        k = np.searchsorted(st, taus, side="right") - 1
        pick = o[rm[k]]
        chosen.append(pick)
        T = np.maximum(T, t[pick])
        M = np.maximum(M, m[pick])
    keep = pareto_mask(np.zeros(len(T), dtype=np.int64), T, M)
    return T[keep], M[keep], np.stack(chosen, axis=1)[keep]
