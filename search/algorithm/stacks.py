"""Pipelines and gradient accumulation over several block stacks: encoder-decoder models.

An encoder-decoder graph (search/models/seq2seq.py) has two block families; the decoder's layers
all read the encoder's output (cross-attention), and T5's layers all read their stack's position
bias. The single-stack pipeline search (pipeline.py) cuts one chain of identical layers whose
only link across a cut is the residual stream; here a cut may fall anywhere in the sequence
*units* = the encoder's layers, then the decoder's, and a stage may hold encoder layers, decoder
layers or both.

Where the other ops go. An op outside the layers sits with the unit it follows when it reads
some layer (the encoder's final norm with the last encoder layer, the LM head and loss with the
last decoder layer), else with the first unit that reads it (the decoder's embedding with the
first decoder layer, a position bias with the first layer of its stack).

What crosses a cut. Every tensor produced on one stage and read on another - the residual
stream at the cut, and the encoder output, which every stage holding decoder layers needs - is
sent point-to-point once per micro-batch to each stage that reads it (forward activation and its
gradient back, on the pp link), in the producer's layout; the receiving stage pays it within its
slots. Reading it is an edge like any other, priced on the reader's stage; so is a pair
constraint between ops on two stages (a tied parameter's layouts: T5's and BART's shared
embedding, read by the encoder, the decoder and the head). A tied parameter's copy on a second
stage is not counted, as in pipeline.py.

Exact search. Fix the shape (p, m, sub-mesh, ZeRO stage, schedule). Each stage's cost is a sum
over its ops, edges and received tensors under its weights (evaluate.stage_weights), so FT's
elimination solves stage s holding units [a, e) down to a factor over its *interface*: the ops
whose outputs cross a cut into or out of it. Stages share no variable but the interface, and a
pipeline's time and memory are those of its slowest and its heaviest stage. The stages are
combined one of two ways, both exact - equal to the enumeration of every assignment and cut
(`exhaustive_stacks`):
- each cut on its own (`_by_cuts`, a shape of at most MAX_CUTS cuts): per joint interface
  configuration, the pointwise maximum of the stages' staircases (`_max_frontier`); the union
  over configurations and cuts, Pareto-reduced. The cuts and configurations most promising by
  their bounds go first, and one whose bound a plan already found beats is never combined.
- a DP over the stages (`_by_stages`, more cuts: 477k for 16 stages over 24 units): the state
  after s stages is the units they cover and the frontier of (max time, max memory) per
  configuration of the variables carried across that position (`_carried`: each interface
  variable from the first to the last position one of its edges crosses); a step pairs a state
  with stage s's factor, each pair costing the larger time and the larger memory
  (`frontier.peak_join`), eliminates what is carried no further, and the states reaching one
  position are united. Linear in the stages.

Gradient accumulation is the one-stage case: every unit on one stage, m micro-batches as m slots,
one micro-batch's activations held, no interface.

Block reuse. A stack whose layers one template stands for (families.py: T5's and BART's
encoder and decoder) is solved as FT's flat meshes solve it: its copies' outputs share the
boundary's configuration (the tie), the template is eliminated once per stage weights to a
factor over (boundary, side inputs), and a stage's run of k copies is k copies by doubling. The
tie is part of the space, as on flat meshes (the reference ties too: `exhaustive_stacks(tie=)`);
`reuse=False` solves every stage op by op, untied.

Pruning, exact. A stage over units [a, e) is bounded before it is solved (`_stage_bounds`): its
loose ops at their cheapest, each family copy at its template's least time and least memory (a
min-sum elimination, `families.unit_least`). A cut's bound is its slowest and heaviest stage's;
in the DP a partial plan ends in plans at least as slow and as heavy as it and as the stages
still to come (`_rest_bounds`, the best cut of the rest): where a known plan (the envelope:
plans of other shapes) beats that in both, it is dropped, and a stage none of whose partial
plans survive is never solved.

Left out on purpose: a cut whose interface, or a DP step whose variables (carried in, the
stage's interface, carried on), have more than MAX_INTERFACE joint configurations (counted out of the space, so the search stays
exact over what it offers); interleaved 1F1B (virtual stages of a two-stack sequence have no executor
either).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from search.algorithm.chain import Chain, layer_index, recompute_var
from search.algorithm.evaluate import (
    Assignment,
    PipeShape,
    Weights,
    evaluate,
    micro_batch_graph,
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
    assignments,
    eliminate_var,
    leaf,
    pareto_mask,
    peak_join,
    union,
)
from search.algorithm.pipeline import STAGE_BAND, partitions, pipeline_shapes, stage_band
from search.algorithm.results import Split
from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts, TrainingJob
from search.prices.mesh import Mesh, op_configs, output_placement, shard_factor, unplaceable_op
from search.prices.profile import DeviceProfile, ProfileLookup

# a stage holds within this many units of n / p: decoder layers weigh about 1.5 encoder layers,
# and the embeddings and the head sit on the end stages, so balanced cuts stray further than
# in one stack of identical layers
STACKS_BAND = STAGE_BAND + 1
# joint configurations of one cut's interface, or of one DP step's variables, beyond which the
# cut or step is left out of the space (the work grows with their product)
MAX_INTERFACE = 4_096
# cuts of a shape up to which each is solved on its own (the stages' DP beyond)
MAX_CUTS = 2_000


def is_multi_stack(graph: OpGraph) -> bool:
    """More than one block family: the graph pipelines through this module, not pipeline.py."""
    return len(graph.blocks) > 1


def units(graph: OpGraph) -> list[tuple[str, ...]]:
    """The layers of every block stack, in graph order (the encoder's, then the decoder's)."""
    return [layer for b in graph.blocks for layer in b.layers]


def anchors(graph: OpGraph) -> dict[str, int]:
    """Per op, the unit whose stage holds it (module docstring: where the other ops go)."""
    unit_of = {name: i for i, layer in enumerate(units(graph)) for name in layer}
    last = len(units(graph)) - 1
    out: dict[str, int] = dict(unit_of)
    for op in graph.topological():  # ops reading some layer: with the last unit they read
        if op.name in out:
            continue
        got = [out[t.source] for t in op.inputs if t.source is not None and t.source in out]
        if got:
            out[op.name] = max(got)
    consumers = graph.consumers()
    for op in reversed(graph.topological()):  # the rest: with the first unit that reads them
        if op.name not in out:
            readers = [out[c] for c, _ in consumers[op.name] if c in out]
            out[op.name] = min(readers) if readers else 0
    for op in graph.topological():  # nothing sits before what it reads
        for t in op.inputs:
            if t.source is not None and out[t.source] > out[op.name]:
                assert op.name not in unit_of, f"layer op {op.name} reads {t.source} from a later unit"
                out[op.name] = out[t.source]
    return {k: min(v, last) for k, v in out.items()}


@dataclass
class StackTables:
    """One shape's unweighted tables for one micro-batch on the stage sub-mesh, and the sizes of
    the tensors that may cross a cut."""

    shape: PipeShape
    graph: OpGraph                               # the micro-batch graph
    cm: CostModel
    op_costs: dict[str, OpCosts]
    edge_costs: dict[tuple[str, str], EdgeCosts]
    buffers: float
    anchor: dict[str, int]
    n_units: int
    p2p: dict[str, np.ndarray] = field(default_factory=dict)        # seconds per micro-batch, both ways
    p2p_bytes: dict[str, np.ndarray] = field(default_factory=dict)  # bytes per micro-batch, one way

    @property
    def mesh(self) -> Mesh:
        return self.shape.mesh

    def stage_of(self, split: Split) -> dict[str, int]:
        bounds = np.cumsum(split)
        return {name: int(np.searchsorted(bounds, u, side="right")) for name, u in self.anchor.items()}

    def received(self, stage_of: dict[str, int], s: int) -> list[str]:
        """The ops whose outputs stage s reads from other stages, each once."""
        out: dict[str, None] = {}
        for op in self.graph.ops:
            if stage_of[op.name] == s:
                for t in op.inputs:
                    if t.source is not None and stage_of[t.source] != s:
                        out[t.source] = None
        return list(out)


def stack_tables(graph: OpGraph, cm: CostModel, shape: PipeShape) -> StackTables | None:
    """The tables of one shape on its micro-batch graph `graph` (None where an op cannot run on
    the stage's sub-mesh)."""
    sub = Mesh(pp=1, axes=shape.mesh.axes)
    if unplaceable_op(list(graph.ops), sub, graph.batch_label) is not None:
        return None
    outputs = {layer[-1] for layer in units(graph)}
    ops = {op.name: cm.op_costs(op, sub, shape.zero, checkpoint=op.name in outputs) for op in graph.ops}
    edges: dict[tuple[str, str], EdgeCosts] = {}
    for op in graph.ops:
        for src in dict.fromkeys(t.source for t in op.inputs if t.source is not None):
            edges[(src, op.name)] = cm.edge_costs(graph.op(src), op, sub, ops[src].configs, ops[op.name].configs)
    cm.add_pair_edges(edges, sub, lambda name: ops[name].configs, cm.bounds.pairs)
    tabs = StackTables(shape=shape, graph=graph, cm=cm, op_costs=ops, edge_costs=edges,
                       buffers=cm.buffers(sub, list(graph.ops), shape.zero), anchor=anchors(graph),
                       n_units=len(units(graph)))
    if shape.stages > 1:
        alpha, beta = cm.p2p_coefficients(shape.stages, shape.mesh.num_devices // shape.stages)
        for op in graph.ops:
            nbytes = np.array([op.output.numel * cm.esize(op.output) / shard_factor(output_placement(c, op), sub)
                               for c in op_configs(op, sub, graph.batch_label)])
            tabs.p2p[op.name], tabs.p2p_bytes[op.name] = 2.0 * (alpha + beta * nbytes), nbytes
    return tabs


# ---- the exact price of given assignments (the reference and the plans' re-costing) -------------
def evaluate_stacks(tabs: StackTables, assignment: Assignment, split: Split) -> dict[str, np.ndarray]:
    """Time, memory and their parts for many assignments of one cut, stage by stage."""
    shape = tabs.shape
    p = shape.stages
    weights = stage_weights(p, shape.micro_batches, shape.schedule)
    stage_of = tabs.stage_of(split)
    layer_of = layer_index(tabs.graph)
    n = np.size(next(iter(assignment.values())))
    per_t, per_m, per_parts, per_comm = [], [], [], []
    pp_bytes = np.zeros(n)
    for s in range(p):
        w = weights[s]
        ops = {k: weigh_op(oc, w) for k, oc in tabs.op_costs.items() if stage_of[k] == s}
        edges = {k: weigh_edge(ec, w) for k, ec in tabs.edge_costs.items() if stage_of[k[1]] == s}
        res = evaluate(ops, edges, tabs.buffers, assignment, layer_of)
        t = res["time"]
        for src in tabs.received(stage_of, s):
            c = np.asarray(assignment[src]).reshape(-1)
            t = t + w.slots * tabs.p2p[src][c]
            pp_bytes += 2.0 * shape.micro_batches * tabs.p2p_bytes[src][c]
        per_t.append(t)
        per_m.append(res["memory"])
        per_parts.append(res["parts"])
        per_comm.append(res["comm"])
    T, M = np.stack(per_t), np.stack(per_m)
    worst = np.argmax(M, axis=0)
    return {"time": T.max(axis=0), "memory": M.max(axis=0), "stage_time": T.T, "stage_memory": M.T,
            "parts": np.stack(per_parts)[worst, np.arange(n)], "buffers": np.full(n, tabs.buffers),
            "comm": np.stack(per_comm).max(axis=0), "pp_bytes": pp_bytes}


# ---- the search ----------------------------------------------------------------------------------
class _Stages:
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
        # keyed by id, the factor held alongside so the id stays its own
        self.group_memo: dict[int, tuple[Factor, _GroupTable]] = {}
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

    def table(self, f: Factor) -> _GroupTable:
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
            table = _GroupTable(gid=gid.reshape(dims), rows=rows, t_min=t_min, m_min=m_min)
            self.group_memo[key] = (f, table)
        return self.group_memo[key][1]

    def at(self, s: int, a: int, k: int) -> Factor:
        """Stage s holding units [a, a + k), solved once."""
        key = (s, a, k)
        if key not in self.memo:
            self.memo[key] = self._solve(s, a, a + k)
        return self.memo[key]

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
        inside = set(fam.chain.template)
        ops = {name: self._weigh(name, w) for name in fam.chain.template}
        edges = {k: weigh_edge(ec, w) for k, ec in self.tabs.edge_costs.items() if k[1] in inside}
        return ops, edges

    def least(self, fam: Family, w: Weights) -> tuple[float, float]:
        """The least time and memory of one of the family's copies under weights w."""
        ops, edges = self._template(fam, w)
        return unit_least(fam, ops, edges, self.var, self.domain, self.recompute and fam.block == 0)

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
class StacksSolution:
    """One shape's frontier over several block stacks: every point's assignment and cut."""

    tables: StackTables
    root: Factor
    partitions: list[Split]
    assigns: dict[str, np.ndarray]
    stats: Stats = field(default_factory=Stats)

    @property
    def chain(self) -> Chain | None:
        return None  # no single-stack chain: families are read back through each stage's factor

    @property
    def edge_costs(self) -> dict[tuple[str, str], EdgeCosts]:
        return self.tables.edge_costs

    @property
    def buffers(self) -> float:
        return self.tables.buffers

    @property
    def mesh(self) -> Mesh:
        return self.tables.shape.mesh

    @property
    def zero(self) -> int:
        return self.tables.shape.zero

    @property
    def pipeline(self) -> PipeShape:
        return self.tables.shape

    @property
    def shape(self) -> PipeShape:
        return self.tables.shape

    @property
    def op_costs(self) -> dict[str, OpCosts]:
        return self.tables.op_costs

    def describe(self) -> str:
        return self.tables.shape.describe()

    def read_back(self, rows: np.ndarray) -> tuple[dict[str, np.ndarray], list[Split | None]]:
        return {name: v[rows] for name, v in self.assigns.items()}, [self.partitions[int(r)] for r in rows]

    def configured_graph(self, graph: OpGraph) -> OpGraph:
        return self.tables.graph

    def recost(self, graph: OpGraph, assignment: dict[str, np.ndarray], splits: list[Split | None]
               ) -> dict[str, np.ndarray]:
        # one evaluation per distinct cut over all its points: per point, T5's plans took ~90 s
        by_split: dict[Split, list[int]] = {}
        for j, split in enumerate(splits):
            assert split is not None, "a pipeline point always has its split"
            by_split.setdefault(tuple(split), []).append(j)
        out: dict[str, np.ndarray] = {}
        for split, js in by_split.items():
            idx = np.array(js)
            res = evaluate_stacks(self.tables, {k: np.asarray(v)[idx] for k, v in assignment.items()}, split)
            for k, v in res.items():
                if k not in out:
                    out[k] = np.zeros((len(splits),) + v.shape[1:], dtype=v.dtype)
                out[k][idx] = v
        return out


def solve_stacks(tabs: StackTables, eps: float = 0.0, recompute: bool = True,
                 envelope: tuple[np.ndarray, np.ndarray] | None = None, reuse: bool = True) -> StacksSolution | None:
    """The exact frontier of one shape over every cut of the band. With an `envelope` of plans
    known to exist (time, memory with buffers), what one of them beats in both is dropped:
    exact. Few cuts (T5's 12 units): each cut on its own, the most promising first, whose plans
    prune the rest (`_by_cuts`); many (BART's 24 units over 8 or 16 stages: up to 477k): the DP
    over the stages (`_by_stages`), linear in them."""
    p, n = tabs.shape.stages, tabs.n_units
    S = _Stages(tabs, eps, recompute, reuse)
    band = list(stage_band(n, p, 1, STACKS_BAND))
    t_stage, m_stage = _stage_bounds(S)
    rest = _rest_bounds(t_stage, m_stage, p, n, band)
    stair = _Staircase(envelope, tabs.buffers)
    if rest.cuts[0, 0] <= MAX_CUTS:
        return _by_cuts(S, _partitions(n, p), stair, t_stage, m_stage)
    return _by_stages(S, band, stair, t_stage, m_stage, rest)


def _by_stages(S: _Stages, band: list[int], stair: _Staircase, t_stage: list[np.ndarray], m_stage: list[np.ndarray],
               rest: _Rest) -> StacksSolution | None:
    """The DP over the stages (module docstring: exact search)."""
    tabs = S.tabs
    p, n = tabs.shape.stages, tabs.n_units
    solved = _dp(S, band, stair, t_stage, m_stage, rest)
    if solved is None:
        return None
    root, came_from = solved
    splits, final = _read_back(S, root, came_from, p, n)
    out = Factor(scope=(), keys=np.zeros((len(root), 0), dtype=np.int32), t=root.t, m=root.m + tabs.buffers)
    return StacksSolution(tables=tabs, root=out, partitions=splits, assigns=final, stats=S.stats)


def _dp(S: _Stages, band: list[int], stair: _Staircase, t_stage: list[np.ndarray], m_stage: list[np.ndarray],
        rest: _Rest) -> tuple[Factor, dict[tuple[int, int], list[int]]] | None:
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


def _by_cuts(S: _Stages, cuts: list[Split], stair: _Staircase, t_bound: list[np.ndarray], m_bound: list[np.ndarray]
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
        for start in range(0, len(order), _Staircase.BATCH):
            chunk = order[start:start + _Staircase.BATCH]
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
def _partitions(n_units: int, p: int) -> list[Split]:
    """The cuts of the band, made once per (units, stages): every shape with p stages shares
    them (hundreds of thousands for 16 stages over 24 units)."""
    return partitions(n_units, p, 1, STACKS_BAND)


def _stage_span(cut: Split, s: int) -> tuple[int, int]:
    """Stage s's first unit and unit count under a cut."""
    return sum(cut[:s]), cut[s]


def _cut_bounds(cuts: list[Split], t_bound: list[np.ndarray], m_bound: list[np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per cut, a (time, memory) none of its plans beats (the slowest and the heaviest stage's
    bounds, `_stage_bounds`) and those per-stage bounds ([cut, stage])."""
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


def _combinations(S: _Stages, ci: int, fs: list[Factor]) -> _Combinations | None:
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


@dataclass
class _GroupTable:
    """A stage factor's rows per interface configuration: a dense index over the configurations
    (-1 where the stage has no plan), each group's rows and its fastest and leanest values."""

    gid: np.ndarray
    rows: list[np.ndarray]
    t_min: np.ndarray
    m_min: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.gid.shape)


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


def _carried(S: _Stages) -> list[tuple[str, ...]]:
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


def _step(S: _Stages, state: Factor, f: Factor, s: int, before: tuple[str, ...], after: tuple[str, ...],
          stair: _Staircase, lb_t: float, lb_m: float) -> Factor | None:
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


def _read_back(S: _Stages, root: Factor, came_from: dict[tuple[int, int], list[int]], p: int, n: int
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


def _stage_bounds(S: _Stages) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per stage s, a time and a memory no plan of stage s holding units [a, e) beats
    ([a, e] tables): each family copy it holds at its template's cheapest (solved under the
    stage's weights with the edges inside it, which on a tensor-parallel mesh are most of a
    layer's cost), every other op at its cheapest (edges and transfers cost >= 0). Per-unit
    sums, so each is a prefix-sum difference."""
    tabs = S.tabs
    covered = {name for fam in S.var.families for name in fam.covered}
    loose = [name for name in tabs.op_costs if name not in covered]
    unit = np.array([tabs.anchor[name] for name in loose], dtype=np.int64)
    per_w: dict[Weights, tuple[np.ndarray, np.ndarray]] = {}
    ts, ms = [], []
    for w in S.weights:
        if w not in per_w:
            weighed = [S._weigh(name, w) for name in loose]
            ut, um = np.zeros(tabs.n_units), np.zeros(tabs.n_units)
            np.add.at(ut, unit, [float(min(o.time.min(), o.time_rc.min())) for o in weighed])
            np.add.at(um, unit, [float(min(o.mem.min(), o.mem_rc.min())) for o in weighed])
            for fam in S.var.families:
                t1, m1 = S.least(fam, w)
                at = [tabs.anchor[fam.chain.layers[i][-1]] for i in fam.copies]
                np.add.at(ut, at, t1)
                np.add.at(um, at, m1)
            ct, cm = np.concatenate([[0.0], np.cumsum(ut)]), np.concatenate([[0.0], np.cumsum(um)])
            per_w[w] = (ct[None, :] - ct[:, None], cm[None, :] - cm[:, None])
        ts.append(per_w[w][0])
        ms.append(per_w[w][1])
    return ts, ms


@dataclass
class _Rest:
    """[s, e]: a time (`t`) and a memory (`m`) no plan of stages s .. p - 1 over units [e, n)
    beats - the least over their cuts of the slowest stage's bound, and of the heaviest's, each
    on its own; inf where those stages cannot cover those units within the band - and how many
    cuts they have (`cuts`)."""

    t: np.ndarray
    m: np.ndarray
    cuts: np.ndarray


def _rest_bounds(t_stage: list[np.ndarray], m_stage: list[np.ndarray], p: int, n: int, band: list[int]) -> _Rest:
    t = np.full((p + 1, n + 1), np.inf)
    m = np.full((p + 1, n + 1), np.inf)
    cuts = np.zeros((p + 1, n + 1))
    t[p, n] = m[p, n] = 0.0
    cuts[p, n] = 1
    for s in range(p - 1, -1, -1):
        for e in range(n):
            for k in band:
                if e + k <= n and np.isfinite(t[s + 1, e + k]):
                    t[s, e] = min(t[s, e], max(t_stage[s][e, e + k], t[s + 1, e + k]))
                    m[s, e] = min(m[s, e], max(m_stage[s][e, e + k], m[s + 1, e + k]))
                    cuts[s, e] += cuts[s + 1, e + k]
    return _Rest(t, m, cuts)


class _Staircase:
    """The points found so far (and an envelope of known plans), asked whether one beats a
    bound in both time and memory by more than rounding. New points wait in a small batch and
    join the sorted staircase when it fills."""

    BATCH = 256

    def __init__(self, envelope: tuple[np.ndarray, np.ndarray] | None, buffers: float) -> None:
        self.buffers = buffers
        self.t = np.zeros(0)
        self.m = np.zeros(0)  # running minimum of memory over t ascending
        self.pending_t: list[np.ndarray] = []
        self.pending_m: list[np.ndarray] = []
        self.n_pending = 0
        if envelope is not None and len(envelope[0]):
            self._rebuild(np.asarray(envelope[0], float), np.asarray(envelope[1], float))

    def _rebuild(self, t: np.ndarray, m: np.ndarray) -> None:
        t = np.concatenate([self.t, t])
        m = np.concatenate([self.m, m])
        o = np.argsort(t, kind="stable")
        self.t, self.m = t[o], np.minimum.accumulate(m[o])

    def add(self, t: np.ndarray, m: np.ndarray) -> None:
        self.pending_t.append(t)
        self.pending_m.append(m + self.buffers)
        self.n_pending += len(t)
        if self.n_pending >= self.BATCH:
            self._rebuild(np.concatenate(self.pending_t), np.concatenate(self.pending_m))
            self.pending_t, self.pending_m, self.n_pending = [], [], 0

    def beats_all(self, t_lb: np.ndarray, m_lb: np.ndarray) -> np.ndarray:
        """`beats` for many bounds against the staircase (not the pending batch)."""
        t_cut = t_lb * (1.0 - 1e-9)
        m_cut = (m_lb + self.buffers) * (1.0 - 1e-9)
        k = np.searchsorted(self.t, t_cut, side="left")
        if not len(self.t):
            return np.zeros(len(t_lb), dtype=bool)
        return (k > 0) & (self.m[np.maximum(k - 1, 0)] < m_cut)

    def beats(self, t_lb: float, m_lb: float) -> bool:
        t_cut = t_lb * (1.0 - 1e-9)
        m_cut = (m_lb + self.buffers) * (1.0 - 1e-9)
        k = int(np.searchsorted(self.t, t_cut, side="left"))
        if k and self.m[k - 1] < m_cut:
            return True
        return any(bool(np.any((pt < t_cut) & (pm < m_cut)))
                   for pt, pm in zip(self.pending_t, self.pending_m, strict=True))


def stack_shapes(cluster: Cluster, job: TrainingJob, graph: OpGraph, zero_stages: tuple[int, ...],
                 allow_async: bool = False, pipelines: bool = True, accumulate: bool = False) -> list[PipeShape]:
    """The shapes of pipeline.py's space (no virtual stages) over the sequence of units."""
    n = len(units(graph))
    return [s for s in pipeline_shapes(cluster, job, n, zero_stages, allow_async, pipelines=pipelines,
                                       accumulate=accumulate, spread=STACKS_BAND)
            if s.virtual_stages == 1]


def search_stacks(graph: OpGraph, cluster: Cluster, job: TrainingJob, zero_stages: tuple[int, ...],
                  recompute: bool = True, allow_async: bool = False, eps: float = 0.0,
                  profile: DeviceProfile | ProfileLookup | None = None, pipelines: bool = True,
                  accumulate: bool = False, shapes: list[PipeShape] | None = None,
                  counts: dict[str, int] | None = None,
                  envelope: tuple[np.ndarray, np.ndarray] | None = None, reuse: bool = True) -> list[StacksSolution]:
    """Every shape's frontier over the graph's block stacks (pipelines with p >= 2 and gradient
    accumulation with p = 1, as pipeline.search_pipelines offers them for one stack). With an
    `envelope` of plans known to exist, a shape whose bound (`shape_bound`) they beat is skipped."""
    if not is_multi_stack(graph):
        return []
    shapes = shapes if shapes is not None else stack_shapes(cluster, job, graph, zero_stages, allow_async,
                                                            pipelines, accumulate)
    models: dict[int, tuple[OpGraph, CostModel]] = {}
    bounded: list[tuple[tuple[float, float], int, StackTables]] = []
    for k, shape in enumerate(shapes):
        m = shape.micro_batches
        if m not in models:
            g = micro_batch_graph(graph, m)
            # the shape-free pricing (collective coefficients, boundaries) shared with the first
            # count's model: the same tables as a fresh one (tests/search/algorithm/test_fast_paths.py)
            like = next(iter(models.values()))[1] if models else None
            models[m] = (g, CostModel(g, cluster, job.model_copy(update={"global_batch": job.global_batch // m}),
                                      profile=profile, like=like))
        g, cm = models[m]
        tabs = stack_tables(g, cm, shape)
        if tabs is not None:
            bounded.append((shape_bound(tabs), k, tabs))
    # accumulation first, then each kind by its time bound: the plans found bound the rest
    bounded.sort(key=lambda x: (x[2].shape.stages > 1, x[0][0], x[1]))
    out: list[StacksSolution] = []
    solved = skipped = 0
    for (t_lb, m_lb), _, tabs in bounded:
        if envelope is not None and len(envelope[0]) and bool(np.any(
                (envelope[0] < t_lb * (1.0 - 1e-9)) & (envelope[1] < m_lb * (1.0 - 1e-9)))):
            skipped += 1  # a known plan beats every plan of this shape in both: exact
            continue
        solved += 1
        sol = solve_stacks(tabs, eps, recompute, envelope=envelope, reuse=reuse)
        if sol is not None and len(sol.root):
            out.append(sol)
            if envelope is not None:
                envelope = (np.concatenate([envelope[0], sol.root.t]), np.concatenate([envelope[1], sol.root.m]))
    if counts is not None:
        counts.update(shapes=len(bounded), bounded_out=skipped, solved=solved)
    return out


def shape_bound(tabs: StackTables) -> tuple[float, float]:
    """A (time, memory) no plan of the shape beats: the stages' sums are at least every op at its
    cheapest in each (transfers and edges cost >= 0), and the busiest stage holds at least 1/p of
    the sums (every stage runs the same slots; the fewest micro-batches in flight on any)."""
    shape = tabs.shape
    p = shape.stages
    ws = stage_weights(p, shape.micro_batches, shape.schedule)
    w = Weights(slots=min(x.slots for x in ws), copies=min(x.copies for x in ws),
                inflight=min(x.inflight for x in ws))
    t = m = 0.0
    for oc in tabs.op_costs.values():
        wo = weigh_op(oc, w)
        t += float(min(wo.time.min(), wo.time_rc.min()))
        m += float(min(wo.mem.min(), wo.mem_rc.min()))
    return t / p, m / p + tabs.buffers


def exhaustive_stacks(tabs: StackTables, recompute: bool = True, limit: int = 2_000_000,
                      tie: tuple[Family, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The reference: every cut and every assignment of every op (and recomputation choice),
    priced by `evaluate_stacks`, Pareto-reduced. With `tie`, only the assignments in which each
    family's copies (and a solo last layer) output in its boundary's configuration, as the
    search with block reuse offers. Exponential: tiny graphs only."""
    p = tabs.shape.stages
    # a tied output is not enumerated: it takes its boundary's configuration
    tied = {layer[-1]: fam.chain.boundary for fam in tie for layer in fam.chain.layers[1:]}
    names = [op.name for op in tabs.graph.ops if op.name not in tied]
    rc = sorted({recompute_var(i) for i in layer_index(tabs.graph).values()}) if recompute else []
    dims = [len(tabs.op_costs[v].configs) for v in names] + [2] * len(rc)
    total = math.prod(dims)
    if total > limit:
        raise ValueError(f"{total} assignments: too many for the reference")
    flat = np.unravel_index(np.arange(total), dims)
    assign = {v: flat[i] for i, v in enumerate(names + rc)}
    assign.update({out: assign[boundary] for out, boundary in tied.items()})
    ts, ms = [], []
    for split in partitions(tabs.n_units, p, 1, STACKS_BAND):
        res = evaluate_stacks(tabs, assign, split)
        ts.append(res["time"])
        ms.append(res["memory"])
    t, m = np.concatenate(ts), np.concatenate(ms)
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, m)
    order = np.argsort(t[keep], kind="stable")
    return t[keep][order], m[keep][order]
