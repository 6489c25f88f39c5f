"""Least sums over a factor graph: for every assignment of some kept variables, the least value
over all other variables of a weighted sum of the factors' times and memories.

Why: a bound on a pipeline shape (pipeline.py, `ends_bounds`) needs, per boundary layout, only
the least time, the least memory and the least t + lam * m of each end stage's layers, not their
frontiers. Each is a sum over ops and edges, so a min-sum elimination finds it exactly with one
number per assignment of a table's scope instead of a frontier per assignment: the same
elimination over the same factors, with dense numpy tables and no Pareto reductions. Several
objectives run at once, as a last axis of every table.
"""

from __future__ import annotations

import heapq

import numpy as np

from search.algorithm.frontier import Factor

# a dense table: its scope and an array of shape [domain of each scope variable..., objectives]
_Table = tuple[tuple[str, ...], np.ndarray]


def _dense(fs: list[Factor], domain: dict[str, int], weights: np.ndarray) -> _Table:
    """One leaf's points in every variant (the same scope, other values) as a dense table of
    every objective, variant-major on the last axis (inf where the leaf has no point). A leaf
    holds at most one point per assignment."""
    scope = fs[0].scope
    shape = tuple(domain[v] for v in scope)
    arr = np.full((*shape, len(fs) * len(weights)), np.inf)
    vals = np.concatenate([np.stack([f.t, f.m], axis=1) @ weights.T for f in fs], axis=1)
    if scope:
        arr[tuple(fs[0].keys.T)] = vals
    elif len(vals):
        arr[...] = vals.min(axis=0)
    return scope, arr


def _aligned(table: _Table, scope: tuple[str, ...], domain: dict[str, int]) -> np.ndarray:
    """The table's array with one axis per variable of `scope` (size 1 where it has none)."""
    own, arr = table
    order = sorted(range(len(own)), key=lambda i: scope.index(own[i]))
    arr = arr.transpose([*order, len(own)])
    return arr.reshape([domain[v] if v in own else 1 for v in scope] + [arr.shape[-1]])


def _combined(tables: list[_Table], domain: dict[str, int], scope: tuple[str, ...] | None = None) -> _Table:
    """The sum of several tables over the union of their scopes (or `scope`)."""
    if scope is None:
        scope = tuple(dict.fromkeys(v for own, _ in tables for v in own))
    acc: np.ndarray | None = None
    for t in tables:
        a = _aligned(t, scope, domain)
        acc = a if acc is None else acc + a
    assert acc is not None
    return scope, np.broadcast_to(acc, [domain[v] for v in scope] + [acc.shape[-1]])


def eliminated(tables: list[_Table], domain: dict[str, int], keep: tuple[str, ...]
               ) -> tuple[list[_Table], list[str]]:
    """The tables left once every variable outside `keep` is minimised out, and the order the
    variables went in: next the one whose tables' union of scopes is smallest (ties: by name),
    its tables (in their order in the list, a new table going last) summed and minimised over
    it. A variable's tables are indexed and the sizes kept in a heap, updated for the variables
    of the new table only (the only ones whose tables changed): a scan of every table per step
    made this quadratic in the variables: most of a periodic stack's search, whose ends hold
    every op of several module layers."""
    live: dict[int, _Table] = dict(enumerate(tables))
    by_var: dict[str, set[int]] = {}
    for i, (own, _) in live.items():
        for v in own:
            by_var.setdefault(v, set()).add(i)
    remaining = set(by_var) - set(keep)

    def size(v: str) -> int:
        n = 1
        for u in {u for i in by_var[v] for u in live[i][0]}:
            n *= domain[u]
        return n

    current = {v: size(v) for v in remaining}
    heap = [(n, v) for v, n in current.items()]
    heapq.heapify(heap)
    order: list[str] = []
    next_id = len(tables)
    while remaining:
        n, v = heapq.heappop(heap)
        if v not in remaining or current[v] != n:
            continue  # a stale size: the variable went, or its tables changed since
        ids = sorted(by_var.pop(v))
        mine = [live.pop(i) for i in ids]
        for i, (own, _) in zip(ids, mine, strict=True):
            for u in own:
                if u != v:
                    by_var[u].discard(i)
        scope, arr = _combined(mine, domain)
        axis = scope.index(v)
        rest = scope[:axis] + scope[axis + 1:]
        live[next_id] = (rest, arr.min(axis=axis))
        for u in rest:
            by_var[u].add(next_id)
        next_id += 1
        remaining.discard(v)
        order.append(v)
        for u in rest:
            if u in remaining:
                current[u] = size(u)
                heapq.heappush(heap, (current[u], u))
    return list(live.values()), order


def least_sums(variants: list[list[Factor]], domain: dict[str, int], keep: tuple[str, ...],
               weights: np.ndarray) -> np.ndarray:
    """Per assignment of `keep` (an array of shape [domain of each kept variable..., variants,
    K]), the least over every other variable of sum over the factors of w0 * t + w1 * m, for
    each row (w0, w1) of `weights` [K, 2] separately and each variant: lists of leaves that
    differ in their values only (factor i of every variant has the same scope and keys), so
    that one elimination serves them all. Variables go in the order that makes the smallest
    table first; every step is exact (a minimum of sums over independent parts)."""
    weights = np.asarray(weights, dtype=float)
    assert all([f.scope for f in v] == [f.scope for f in variants[0]] for v in variants)
    tables = [_dense(list(fs), domain, weights) for fs in zip(*variants, strict=True)]
    tables, _ = eliminated(tables, domain, keep)
    zero = (keep, np.zeros([domain[v] for v in keep] + [len(variants) * len(weights)]))
    out = _combined([zero, *tables], domain, keep)[1]
    return np.ascontiguousarray(out).reshape(*out.shape[:-1], len(variants), len(weights))


__all__ = ["least_sums"]
