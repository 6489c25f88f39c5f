"""Each pipeline stage's factor over its interface (stacks.py: exact search): stage s holding
units [a, e) - its ops, the edges into them and the tensors it receives - eliminated down to the
ops whose outputs cross a cut into or out of it, made once per (stage, first unit, units held).
A block family's copies on a stage are its template's power (families.py); a stage holding one
run of copies and nothing else is eliminated once per run length and labelled per start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from search.algorithm.chain import layer_index, recompute_var
from search.algorithm.evaluate import (
    Weights,
    stage_weights,
    weigh_edge,
    weigh_op,
)
from search.algorithm.factor_graph import JoinMemo, _edge_factor, _op_factor, eliminate_all
from search.algorithm.families import (
    Family,
    FamilyVars,
    Powers,
    find_families,
    solve_unit,
    tie_factors,
    unit_least,
    wrap,
)
from search.algorithm.frontier import (
    Factor,
    Stats,
    _radix,
    leaf,
)
from search.algorithm.stack_tables import StackTables
from search.prices.costmodel import EdgeCosts, OpCosts

# joint configurations of one cut's interface, or of one DP step's variables, beyond which the
# cut or step is left out of the space (the work grows with their product)
MAX_INTERFACE = 4_096


class StageFactors:
    """Each stage's factor over its interface, per (stage, first unit, units held), made once."""

    def __init__(self, tabs: StackTables, eps: float, recompute: bool, reuse: bool = True) -> None:
        self.tabs, self.eps = tabs, eps
        shape = tabs.shape
        self.weights = stage_weights(shape.stages, shape.micro_batches, shape.schedule)
        self.layer_of = layer_index(tabs.graph) if recompute else {}
        self.memo: dict[tuple[int, int, int], Factor] = {}
        self.recompute = recompute
        self.var = FamilyVars(stage_families(tabs) if reuse else ())
        self.domain = {name: len(oc.configs) for name, oc in tabs.op_costs.items()}
        self.domain.update({recompute_var(i): 2 for i in set(self.layer_of.values())})
        self.powers: dict[tuple[int, Weights], Powers] = {}
        self.template_edges: dict[int, list[tuple[tuple[str, str], EdgeCosts]]] = {}
        # keyed by id, the factor held alongside so the id stays its own
        self.group_memo: dict[int, tuple[Factor, GroupTable]] = {}
        # the stages' joins, shared where their factors agree (the ops around a run, solved for
        # every run length beside them: JoinMemo's exact sharing), and each run's labelled power
        self.join_memo = JoinMemo()
        self.runs: dict[tuple[int, Weights, int, int], Factor] = {}
        # a run-only stage's factor per (stage, family, copies, received, kept), and its Stats
        self.run_memo: dict[tuple[int, int, int, tuple[str, ...], tuple[str, ...]], tuple[Factor, Stats]] = {}
        self.stats = Stats()
        self._index(tabs)

    def _index(self, tabs: StackTables) -> None:
        """Per unit, what a stage holding it solves - its ops outside any family copy, the edges
        into them, the tensors its ops read, the edges touching it - each in the order the
        graph (or the edge table) lists them, so a stage gathers its units' lists: thousands of
        stages per shape, where scanning the whole graph for each cost more than solving it."""
        anchor = tabs.anchor
        covered = {name for fam in self.var.families for name in fam.covered}
        n = tabs.n_units
        self.loose: list[list[tuple[int, str]]] = [[] for _ in range(n)]
        self.reads: list[list[tuple[int, int, str]]] = [[] for _ in range(n)]
        for i, op in enumerate(tabs.graph.ops):
            u = anchor[op.name]
            if op.name not in covered:
                self.loose[u].append((i, op.name))
            self.reads[u] += [(i, j, t.source) for j, t in enumerate(op.inputs) if t.source is not None]
        self.into: list[list[tuple[int, str, str]]] = [[] for _ in range(n)]
        self.touch: list[list[tuple[int, str, str]]] = [[] for _ in range(n)]
        for i, (src, dst) in enumerate(tabs.edge_costs):
            if dst not in covered:
                self.into[anchor[dst]].append((i, src, dst))
            self.touch[anchor[dst]].append((i, src, dst))
            if anchor[src] != anchor[dst]:
                self.touch[anchor[src]].append((i, src, dst))
        self.weighed: dict[tuple[str, Weights], OpCosts] = {}

    def _weigh(self, name: str, w: Weights) -> OpCosts:
        key = (name, w)
        if key not in self.weighed:
            self.weighed[key] = weigh_op(self.tabs.op_costs[name], w)
        return self.weighed[key]

    def table(self, f: Factor) -> GroupTable:
        """A stage factor's rows per interface configuration, made once per factor (the same
        stage recurs in many cuts)."""
        key = id(f)
        if key not in self.group_memo:
            dims = tuple(len(self.tabs.op_costs[v].configs) for v in f.scope)
            flat = f.keys.astype(np.int64) @ _radix(list(dims)) if dims else np.zeros(len(f), dtype=np.int64)
            order = np.argsort(flat, kind="stable")  # each group's rows in ascending order
            sf = flat[order]
            starts = np.flatnonzero(np.concatenate([[True], sf[1:] != sf[:-1]])) if len(sf) else np.zeros(0, int)
            gid = np.full(math.prod(dims), -1, dtype=np.int64)
            gid[sf[starts]] = np.arange(len(starts))
            rows = np.split(order, starts[1:])
            t_min = np.minimum.reduceat(f.t[order], starts) if len(starts) else np.zeros(1)
            m_min = np.minimum.reduceat(f.m[order], starts) if len(starts) else np.zeros(1)
            table = GroupTable(gid=gid.reshape(dims), rows=rows, t_min=t_min, m_min=m_min)
            self.group_memo[key] = (f, table)
        return self.group_memo[key][1]

    def at(self, s: int, a: int, k: int) -> Factor:
        """Stage s holding units [a, a + k), solved once."""
        key = (s, a, k)
        if key not in self.memo:
            self.memo[key] = self._solve(s, a, a + k)
        return self.memo[key]

    def rc(self, name: str) -> str | None:
        """The recomputation variable of the layer holding `name` (None outside the layers)."""
        return recompute_var(self.layer_of[name]) if name in self.layer_of else None

    def unit_factors(self, u: int, w: Weights) -> list[Factor]:
        """Unit u's share of a stage's factors under weights w: its ops outside any family copy
        and the edges into them (what `_solve` gathers per unit; stack_bounds.loose_least). The
        same scopes and keys under every weighting."""
        tabs, var = self.tabs, self.var
        factors = [_op_factor(name, self._weigh(name, w), self.rc(name)) for _, name in sorted(self.loose[u])]
        factors += [_edge_factor(weigh_edge(tabs.edge_costs[(src, dst)], w), var(src), dst, self.rc(dst))
                    for _, src, dst in sorted(self.into[u])]
        return factors

    def _solve(self, s: int, a: int, e: int) -> Factor:
        """Stage s (units [a, e)): its ops, the edges into them and the tensors it receives,
        eliminated down to its interface: the received producers and its own ops read on other
        stages. A family's copies on the stage are one factor: its template solved under this
        stage's weights, doubled."""
        tabs, w, var, anchor = self.tabs, self.weights[s], self.var, self.tabs.anchor
        span = range(a, e)
        runs = self._runs(a, e)
        mine = [name for _, name in sorted(x for u in span for x in self.loose[u])]
        domain = self.domain

        def rc(name: str) -> str | None:
            return recompute_var(self.layer_of[name]) if name in self.layer_of else None

        leaf_of = self.join_memo.leaf
        factors = [leaf_of(_op_factor(name, self._weigh(name, w), rc(name))) for name in mine]
        factors += [leaf_of(_edge_factor(weigh_edge(tabs.edge_costs[(src, dst)], w), var(src), dst, rc(dst)))
                    for _, src, dst in sorted(x for u in span for x in self.into[u])]
        received = [src for _, _, src in sorted(x for u in span for x in self.reads[u]) if not a <= anchor[src] < e]
        recv = tuple(dict.fromkeys(var(x) for x in received))
        # the interface: every op on one side of an edge (a read, or a pair constraint such as a
        # tied parameter's layouts) whose other side is on another stage
        crossing = sorted({x for u in span for x in self.touch[u] if (a <= anchor[x[1]] < e) != (a <= anchor[x[2]] < e)})
        keep = tuple(dict.fromkeys(var(src) for _, src, _ in crossing))
        if not mine and len(runs) == 1:
            return self._solve_run(s, runs[0], recv, keep)
        factors += [self._received(src, w) for src in recv]
        factors += [leaf_of(f) for f in tie_factors(var, domain, set(mine))]
        factors += [self._run(fam, w, first, k) for fam, first, k in runs]
        return eliminate_all(factors, domain, keep=keep, eps=self.eps, stats=self.stats, memo=self.join_memo)

    def _run(self, fam: Family, w: Weights, first: int, k: int) -> Factor:
        """The family's copies first..first + k - 1 under weights w, one object per run (the
        stages holding it share their joins with it through the memo)."""
        key = (fam.block, w, first, k)
        if key not in self.runs:
            self.runs[key] = wrap(self._powers(fam, w)(k), fam, first)
        return self.runs[key]

    def _received(self, src: str, w: Weights) -> Factor:
        """The transfer of `src`'s output into a stage under weights w, per configuration."""
        c = np.arange(self.domain[src])
        # a tied boundary stands for every copy's output: all of one shape, one transfer table
        return self.join_memo.leaf(leaf((src,), c[:, None], w.slots * self.tabs.p2p[src], np.zeros(len(c)),
                                        note=f"recv {src}"))

    def _solve_run(self, s: int, run: tuple[Family, int, int], recv: tuple[str, ...], keep: tuple[str, ...]) -> Factor:
        """A stage holding a run of one family's copies and nothing else: the same factor list
        (the template's k-th power, the tied variables it receives, the interface it keeps)
        wherever the run starts - BART's middle stages, thousands per shape - so it is
        eliminated once per (stage, family, k, received, kept) and each start labels those
        points with its own layers (`wrap`: the read-back maps apply below the label, and
        nothing below it but the power's copies reads through them). What the elimination
        adds to Stats is replayed on every start, so the counts stay a plain run's."""
        fam, first, k = run
        key = (s, fam.block, k, recv, keep)
        hit = self.run_memo.get(key)
        if hit is None:
            w = self.weights[s]
            own = Stats()
            factors = [self._received(src, w) for src in recv] + [self._powers(fam, w)(k)]
            hit = self.run_memo[key] = (eliminate_all(factors, self.domain, keep=keep, eps=self.eps, stats=own,
                                                      memo=self.join_memo), own)
        f, own = hit
        self.stats.joins += own.joins
        self.stats.pairs += own.pairs
        self.stats.max_factor_points = max(self.stats.max_factor_points, own.max_factor_points)
        return wrap(f, fam, first, layers=k)

    def _runs(self, a: int, e: int) -> list[tuple[Family, int, int]]:
        """Per family, the run of its copies a stage over units [a, e) holds: (family, first
        layer, count)."""
        out = []
        anchor = self.tabs.anchor
        for fam in self.var.families:
            on = [i for i in fam.copies if a <= anchor[fam.chain.layers[i][-1]] < e]
            if on:
                out.append((fam, on[0], len(on)))
        return out

    def _template(self, fam: Family, w: Weights) -> tuple[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts]]:
        """The family's template ops and the edges into them, weighed by w."""
        ops = {name: self._weigh(name, w) for name in fam.chain.template}
        edges = {k: weigh_edge(ec, w) for k, ec in self._template_edges(fam)}
        return ops, edges

    def _template_edges(self, fam: Family) -> list[tuple[tuple[str, str], EdgeCosts]]:
        """The edges into the family's template, in the edge table's order: found once, not by
        a scan of every edge per stage weighting (bounds and powers ask for each)."""
        if fam.block not in self.template_edges:
            inside = set(fam.chain.template)
            self.template_edges[fam.block] = [(k, ec) for k, ec in self.tabs.edge_costs.items() if k[1] in inside]
        return self.template_edges[fam.block]

    def least(self, fam: Family, ws: list[Weights]) -> tuple[np.ndarray, np.ndarray]:
        """The least time and memory of one of the family's copies under each of the weights."""
        return unit_least(fam, [self._template(fam, w) for w in ws], self.var, self.domain,
                          self.recompute and fam.block == 0)

    def _powers(self, fam: Family, w: Weights) -> Powers:
        """k copies of the family's template under one stage's weights, memoised per weights."""
        key = (fam.block, w)
        if key not in self.powers:
            ops, edges = self._template(fam, w)
            unit = solve_unit(fam, ops, edges, self.var, self.domain, self.recompute and fam.block == 0, self.eps,
                              self.stats)
            self.powers[key] = Powers(unit, self.domain, self.eps, self.stats)
        return self.powers[key]


def stage_families(tabs: StackTables) -> tuple[Family, ...]:
    """The block families whose copies a stage may solve through their template: those whose
    copies meet the rest of the graph only through the boundary, the side inputs and the last
    layer's output (a pair constraint reaching into a copy is solved op by op)."""
    out = []
    for fam in find_families(tabs.graph):
        covered = fam.covered
        allowed_in = {fam.chain.boundary, *fam.sides, *(fam.chain.layers[i][-1] for i in fam.copies)}
        last = fam.chain.layers[fam.chain.reused][-1]
        ok = all((src in covered or src in allowed_in) if dst in covered else (src == last or src not in covered)
                 for src, dst in tabs.edge_costs)
        if ok:
            out.append(fam)
    return tuple(out)


@dataclass
class GroupTable:
    """A stage factor's rows per interface configuration: a dense index over the configurations
    (-1 where the stage has no plan), each group's rows and its fastest and leanest values."""

    gid: np.ndarray
    rows: list[np.ndarray]
    t_min: np.ndarray
    m_min: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.gid.shape)
