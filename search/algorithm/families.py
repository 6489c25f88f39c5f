"""Block reuse over several block families: the encoder's layers and the decoder's.

The single-stack search (chain.py, ft.py step 4) solves one template layer and combines n copies
by doubling, because every layer reads only the previous layer's output. In an encoder-decoder
each stack is such a family, but its layers also read *side inputs*: ops outside the stack that
every layer reads (every decoder layer's cross-attention reads the encoder's output; every T5
layer reads its stack's relative position bias). A side input is one op with one configuration,
so it is one variable shared by every layer: the template layer is eliminated down to a factor
over (its boundary, its side inputs) - the boundary's configuration tied across the stack as in
chain.py, each side input's free - and n copies combine by doubling, joining on every variable
of that scope. Each copy prices its own edge from a side input (the layout change, the copy it
keeps for backward): the template's edge tables, n times, as the layers read them one by one.

`find_families` proves, per stack, that one template may stand for its layers (chain.py's
`_uniform`: every layer spelled with names replaced by positions, a side input by its name, so
every layer must read the same side inputs alike). A stack that is not uniform, or of fewer than
3 layers, is solved op by op. `FamilyVars` names the variables the other ops read: the output of
a covered layer is its family's boundary (the tie), and so is what reads it after the stack.
`solve_unit` eliminates a template layer, `Powers` builds k copies by doubling (memoised),
`wrap` labels a run of copies with the layers it stands for so a point's plan reads back
(frontier.assignments); FT's flat meshes (`prepare_families`) and the stage search over both
stacks (stacks.py) use them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from search.algorithm.chain import Chain, _uniform, layer_index, layer_outputs, recompute_var
from search.algorithm.factor_graph import MeshFactors, MeshProblem, _edge_factor, _op_factor, eliminate_all
from search.algorithm.frontier import Factor, Stats, eliminate_var, join, leaf, restrict_equal, union
from search.algorithm.minsum import least_sums
from search.models.graph import OpGraph
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts, recomputed_mem
from search.prices.mesh import Mesh

MIN_LAYERS = 3  # layer 0 and the solo last layer are solved with the rest: reuse needs a third


@dataclass(frozen=True)
class Family:
    """One block stack solved through its template (`chain.layers[1]`): layers 1..`chain.reused`
    are copies of it; layer 0 (and the last with `chain.solo`) are solved with the rest."""

    chain: Chain
    sides: tuple[str, ...]  # ops outside the stack every layer from the template on reads
    block: int              # its index in graph.blocks (block 0's layers may be recomputed)

    @property
    def copies(self) -> range:
        """The layers (of this stack) the template's copies cover."""
        return range(1, 1 + self.chain.reused)

    @property
    def covered(self) -> set[str]:
        return {name for i in self.copies for name in self.chain.layers[i]}


def find_families(graph: OpGraph) -> tuple[Family, ...]:
    """Every block stack of the graph whose layers one template can stand for (kept on the
    graph, keyed by its ops and blocks, as chain.find_chain keeps its answer)."""
    cache: tuple[object, object, tuple[Family, ...]] | None = graph.__dict__.get("_families")
    if cache is None or cache[0] is not graph.ops or cache[1] is not graph.blocks:
        cache = (graph.ops, graph.blocks, _find_families(graph))
        object.__setattr__(graph, "_families", cache)
    return cache[2]


def _find_families(graph: OpGraph) -> tuple[Family, ...]:
    found = [f for b in range(len(graph.blocks)) if (f := _family(graph, b)) is not None]
    # a side input must be an op solved with the rest, or a stack's last output (whose variable
    # is that stack's boundary): not an op inside another family's copies
    inner = {name for f in found for name in f.covered} - {f.chain.layers[-1][-1] for f in found}
    return tuple(f for f in found if not set(f.sides) & inner)


def _family(graph: OpGraph, b: int) -> Family | None:
    layers = list(graph.blocks[b].layers)
    n = len(layers)
    if n < MIN_LAYERS:
        return None
    consumers = graph.consumers()
    member = {name: i for i, layer in enumerate(layers) for name in layer}
    sides: set[str] | None = None
    for i, layer in enumerate(layers):
        mine: set[str] = set()
        for name in layer:
            for t in graph.op(name).inputs:
                src = t.source
                if src is None or member.get(src) == i or (i > 0 and src == layers[i - 1][-1]):
                    continue
                if src in member:
                    return None  # a layer reading another layer but the previous one's output
                mine.add(src)
            for c, _ in consumers[name]:
                if member.get(c) == i:
                    continue
                if name != layer[-1]:
                    return None  # only the layer's output is read outside it
                if i < n - 1 and member.get(c) != i + 1:
                    return None
                if i == n - 1 and c in member:
                    return None
        if i > 0:
            if sides is not None and mine != sides:
                return None
            sides = mine
    uniform = _uniform(graph, layers)
    if uniform == n:
        chain = Chain(layers=layers)
    elif uniform == n - 1:
        chain = Chain(layers=layers, solo=True)
    else:
        return None
    order = {op.name: k for k, op in enumerate(graph.ops)}
    return Family(chain=chain, sides=tuple(sorted(sides or (), key=order.__getitem__)), block=b)


class FamilyVars:
    """Which variable each op's configuration is: a covered layer's output is its family's
    boundary (the layouts are tied across the stack), every other op is its own."""

    def __init__(self, families: tuple[Family, ...]) -> None:
        self.families = families
        self.var: dict[str, str] = {}
        for f in families:
            for i in f.copies:
                self.var[f.chain.layers[i][-1]] = f.chain.boundary
        self.ties = {f.chain.layers[-1][-1]: f.chain.boundary for f in families if f.chain.solo}

    def __call__(self, op: str) -> str:
        return self.var.get(op, op)

    def covered(self) -> set[str]:
        return {name for f in self.families for name in f.covered}


def _recomputed(ec: EdgeCosts) -> EdgeCosts:
    return EdgeCosts(src=ec.src, dst=ec.dst, time=ec.recomputed_time, mem=recomputed_mem(ec.mem), comm=ec.comm)


def _recomputed_op(oc: OpCosts) -> OpCosts:
    return OpCosts(configs=oc.configs, time=oc.time_rc, mem=oc.mem_rc, parts=oc.parts_rc, comm=oc.comm,
                   time_rc=oc.time_rc, mem_rc=oc.mem_rc, parts_rc=oc.parts_rc, estimated=oc.estimated, step=oc.step)


def _template_factors(family: Family, op_costs: dict[str, OpCosts], edges: dict[tuple[str, str], EdgeCosts],
                      var: FamilyVars, r: int) -> list[Factor]:
    """The template's op factors and the edges into them, recomputed (r = 1) or not: the same
    list, in the same order, for `solve_unit`'s frontier and `unit_least`'s minima."""
    template = family.chain.template
    inside = set(template)
    factors = [_op_factor(name, _recomputed_op(op_costs[name]) if r else op_costs[name]) for name in template]
    # the template reads layer 0's output (the boundary itself) and side inputs
    factors += [_edge_factor(_recomputed(ec) if r else ec, src if src in inside else var(src), dst)
                for (src, dst), ec in edges.items() if dst in inside]
    return factors


def solve_unit(family: Family, op_costs: dict[str, OpCosts], edges: dict[tuple[str, str], EdgeCosts],
               var: FamilyVars, domain: dict[str, int], recompute: bool, eps: float, stats: Stats) -> Factor:
    """The template layer under the given (already weighed) tables, eliminated to a factor over
    (boundary, side inputs): its input and output share the boundary's configuration. With
    `recompute`, solved once per choice of the layer's recomputation and the two united (a
    variable touching every op of the layer would double every table)."""
    chain = family.chain
    template = chain.template
    out = template[-1]
    boundary = chain.boundary
    keep = (boundary, out, *dict.fromkeys(var(s) for s in family.sides))

    def run(r: int) -> Factor:
        f = eliminate_all(_template_factors(family, op_costs, edges, var, r), domain, keep=keep, eps=eps, stats=stats)
        return restrict_equal(f, boundary, out, boundary)

    if not recompute:
        unit = run(0)
    else:
        rc = recompute_var(1)
        unit = eliminate_var(union([run(0), run(1)], rc), rc, {**domain, rc: 2}, eps)
    unit.layer_leaf = True
    unit.layers = 1
    return unit


def unit_least(family: Family, tables: list[tuple[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts]]],
               var: FamilyVars, domain: dict[str, int], recompute: bool) -> tuple[np.ndarray, np.ndarray]:
    """The least time and the least memory of one copy of the template (each on its own) under
    each of the given (weighed) tables - (ops, edges into the template) per stage weighting, as
    many values - : `solve_unit`'s least point in each objective, by min-sum elimination
    (minsum.py) instead of a frontier - a bound needs no more (stacks.py). Every weighting's
    factors have the same scopes and keys, so one elimination serves them all."""
    boundary, out = family.chain.boundary, family.chain.template[-1]
    rs = (0, 1) if recompute else (0,)
    variants = [_template_factors(family, ops, edges, var, r) for ops, edges in tables for r in rs]
    least = least_sums(variants, domain, (boundary, out), np.eye(2))
    tied = least[np.arange(domain[boundary]), np.arange(domain[boundary])]  # output in the boundary's layout
    per = tied.reshape(domain[boundary], len(tables), len(rs), 2).min(axis=(0, 2))  # [tables, objective]
    return per[:, 0], per[:, 1]


class Powers:
    """k copies of one template factor by repeated doubling, memoised (O(log k) joins each)."""

    def __init__(self, unit: Factor, domain: dict[str, int], eps: float, stats: Stats) -> None:
        self.domain, self.eps, self.stats = domain, eps, stats
        self.memo: dict[int, Factor] = {1: unit}

    def __call__(self, k: int) -> Factor:
        if k not in self.memo:
            f = join(self(k // 2), self(k - k // 2), domain=self.domain, eps=self.eps, stats=self.stats)
            f.layers = k
            self.memo[k] = f
        return self.memo[k]


def wrap(power: Factor, family: Family, first: int, layers: int | None = None) -> Factor:
    """`power`, k copies, standing for the family's layers first..first + k - 1 (first >= 1): the
    same points, read back through those layers' names. `layers`: k, where `power` is a factor
    made from the k copies' power (and only from it and unlabelled factors) rather than the
    power itself."""
    k = power.layers if layers is None else layers
    maps = family.chain.layer_maps()[first - 1:first - 1 + k]
    return Factor(scope=power.scope, keys=power.keys, t=power.t, m=power.m, parents=(power,),
                  parent_idx=(np.arange(len(power)),), maps=maps)


def tie_factors(var: FamilyVars, domain: dict[str, int], present: set[str]) -> list[Factor]:
    """A solo last layer's output takes its boundary's configuration (an equality factor), for
    those of `present`."""
    out = []
    for name, boundary in var.ties.items():
        if name in present:
            same = np.arange(domain[name])
            out.append(leaf((boundary, name), np.stack([same, same], 1), np.zeros(len(same)), np.zeros(len(same)),
                            note=f"tie {name}={boundary}"))
    return out


# ---- FT's flat meshes (ft.py): every op of one mesh, each family's copies by doubling ------------
def family_costs(graph: OpGraph, cm: CostModel, mesh: Mesh, zero: int, families: tuple[Family, ...]
                 ) -> dict[str, OpCosts]:
    """Op cost tables for every op FT sees: all but the copies after each template (priced as it)."""
    skip = {name for f in families for i in f.copies if i > 1 for name in f.chain.layers[i]}
    outputs = layer_outputs(graph)
    return {op.name: cm.op_costs(op, mesh, zero, checkpoint=op.name in outputs)
            for op in graph.ops if op.name not in skip}


def prepare_families(graph: OpGraph, cm: CostModel, mesh: Mesh, families: tuple[Family, ...], eps: float,
                     zero: int, recompute: bool, op_costs: dict[str, OpCosts]) -> MeshProblem:
    """One mesh's factors: the ops outside the families' copies, and per family its copies as
    one factor over (boundary, side inputs) - the template solved once, doubled."""
    layer_of = layer_index(graph) if recompute else {}
    fg = MeshFactors(graph, cm, mesh, op_costs, layer_of, None, eps, None)
    var = FamilyVars(families)
    covered = var.covered()
    templates = {name for f in families for name in f.chain.template}
    rest = [graph.op(name) for name in op_costs if name not in covered]
    pairs = {p.b: [q.a for q in fg.pairs.get(p.b, []) if q.a not in covered] for p in cm.bounds.pairs}

    def rc(name: str) -> str | None:
        return recompute_var(layer_of[name]) if name in layer_of else None

    factors: list[Factor] = []
    for op in rest:
        factors.append(_op_factor(op.name, op_costs[op.name], rc(op.name)))
        for src in dict.fromkeys([*(t.source for t in op.inputs if t.source is not None), *pairs.get(op.name, [])]):
            factors.append(_edge_factor(fg.edge(src, op.name), var(src), op.name, rc(op.name)))
    factors += tie_factors(var, fg.domain, {op.name for op in rest})
    stats = fg.stats
    for f in families:
        inside = set(f.chain.template)
        edges = {}
        for name in f.chain.template:
            op = graph.op(name)
            partners = [q.a for q in fg.pairs.get(name, []) if q.a in inside]
            for src in dict.fromkeys([*(t.source for t in op.inputs if t.source is not None), *partners]):
                edges[(src, name)] = fg.edge(src, name)
        unit = solve_unit(f, op_costs, edges, var, fg.domain, recompute and f.block == 0, eps, stats)
        factors.append(wrap(Powers(unit, fg.domain, eps, stats)(f.chain.reused), f, 1))
    assert not templates - set(op_costs)
    return MeshProblem(mesh=mesh, chain=None, op_costs=op_costs, edge_costs=fg.edge_costs, domain=fg.domain,
                       buffers=cm.buffers(mesh, None, zero), stats=stats, factors=factors,
                       zero=zero,
                       families=tuple(f.chain for f in families))
