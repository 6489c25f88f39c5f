"""FT: frontier tracking (TensorOpt, Cai et al., arXiv 2004.10856), exact.

Read top to bottom:

1. The outer loop runs over the candidate meshes (how the devices factor into dp x tp).
2. On one mesh every op is a variable whose values are its configurations (mesh.py). Each op
   contributes a unary factor (one point per configuration: its time and memory) and each
   producer -> consumer pair a pairwise factor (resharding time and memory per pair of
   configurations). The frontier of the whole graph is the Pareto set of the sum over all of
   them, minimised over every assignment: a min-sum problem over a factor graph where "min" is
   Pareto reduction.
3. Variables are eliminated one at a time, greedily choosing the one whose elimination creates
   the smallest table (min-weight order). For an op with one producer and one consumer this is
   FT's node elimination; two factors over the same pair merge as FT's edge elimination; what
   those cannot reduce (residual and attention branches) is the same elimination carrying the
   live configurations in the factor's scope, which is FT's dynamic programme over a
   topological order with the cut as state. Every join is followed by Pareto reduction.
4. Repeated layers (transformer blocks) are solved once: the template layer's internal ops are
   eliminated to a factor over (its input op, its output op). The strategy space ties the
   residual stream's configuration across the stack (every block boundary uses the same
   layout, as every Megatron/FSDP plan does), while every op inside every layer chooses freely;
   so the template factor is restricted to equal boundary configurations and n layers are
   combined by repeated doubling: log2(n) Minkowski sums, not n.
5. Exact pruning keeps the stack's frontiers small (FT stays exact: only points that provably
   cannot reach the final frontier go): a boundary configuration that another beats on every
   layer and on the rest of the graph is dropped; a coarse pass (eps = PREPASS_EPS) over every
   mesh first finds real plans close to the frontier, and a partial stack of L layers whose most
   optimistic completion (the remaining layers' ideal point, then their convex hull, plus the
   rest of the graph) is beaten by one of those plans is dropped during the doubling.
6. The per-mesh frontiers are merged and reduced; each final point's configuration of every op
   is read back through the factors' provenance.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from search.algorithm.frontier import (
    RTOL,
    Factor,
    Stats,
    assignments,
    eliminate_var,
    join,
    leaf,
    pareto_mask,
    restrict_equal,
    select,
    union,
)
from search.models.graph import Op, OpGraph
from search.prices.boundaries import INFEASIBLE, Pair
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts, TrainingJob, add_edges, recomputed_mem
from search.prices.mesh import Mesh, mesh_candidates, op_configs, placeable_meshes

PREPASS_EPS = 0.02


@dataclass
class Chain:
    """Block reuse on one graph: layers[0] is solved with the rest of the graph, layers[1] is the
    template, layers[1:] are covered by the chain factor."""

    layers: list[tuple[str, ...]]

    @property
    def template(self) -> tuple[str, ...]:
        return self.layers[1]

    @property
    def boundary(self) -> str:
        """The first layer's output op: its variable stands for every layer boundary."""
        return self.layers[0][-1]

    def layer_maps(self) -> list[dict[str, str]]:
        maps = []
        for i in range(1, len(self.layers)):
            m = dict(zip(self.template, self.layers[i]))
            m[self.boundary] = self.layers[i - 1][-1]
            m[recompute_var(1)] = recompute_var(i)
            maps.append(m)
        return maps


def recompute_var(layer: int) -> str:
    """The variable choosing whether layer `layer` of the block stack is recomputed (0 or 1)."""
    return f"recompute@{layer}"


def layer_index(graph: OpGraph) -> dict[str, int]:
    """op name -> its layer in the block stack (the unit of activation recomputation)."""
    return {name: i for b in graph.blocks[:1] for i, layer in enumerate(b.layers) for name in layer}


def layer_outputs(graph: OpGraph) -> set[str]:
    """The last op of every layer: its output is kept even when its layer is recomputed."""
    return {layer[-1] for b in graph.blocks[:1] for layer in b.layers}


def find_chain(graph: OpGraph) -> Chain | None:
    """The graph's block stack, if its wiring lets one template stand for every layer: layer i
    reads only its own ops, the previous layer's output op and graph inputs; only its output op
    is read from outside it (by the next layer, or after the stack by the ops that follow)."""
    if not graph.blocks:
        return None
    layers = list(graph.blocks[0].layers)
    n = len(layers)
    if n < 3:
        return None
    consumers = graph.consumers()
    member = {name: i for i, layer in enumerate(layers) for name in layer}
    sig = lambda name: (lambda o: (o.kind, o.output.shape, o.flops, len(o.inputs), len(o.splittable)))(graph.op(name))
    for i, layer in enumerate(layers):
        if [sig(x) for x in layer] != [sig(x) for x in layers[1]]:
            return None
        for name in layer:
            for t in graph.op(name).inputs:
                if t.source is None or member.get(t.source) == i:
                    continue
                if i > 0 and t.source != layers[i - 1][-1]:
                    return None
            for c, _ in consumers[name]:
                if member.get(c) == i:
                    continue
                if name != layer[-1]:
                    return None
                if i < n - 1 and member.get(c) != i + 1:
                    return None
                if i == n - 1 and c in member:
                    return None
    return Chain(layers=layers)


@dataclass
class MeshSolution:
    mesh: Mesh
    root: Factor
    chain: Chain | None
    op_costs: dict[str, OpCosts]
    edge_costs: dict[tuple[str, str], EdgeCosts]
    buffers: float
    stats: Stats
    zero: int = 0

    def describe(self) -> str:
        return f"{self.mesh.describe()} zero{self.zero}"


@dataclass
class FrontierPoint:
    time_s: float
    memory_bytes: float
    mesh_index: int
    configs: dict[str, np.ndarray]  # op name -> configuration indices, shared by the mesh's points
    row: int                        # this point's position in those arrays
    stages: tuple[int, ...] | None = None  # a pipeline plan: layers per stage

    @property
    def assignment(self) -> dict[str, int]:
        """op name -> index of its configuration in mesh.op_configs order."""
        return {name: int(v[self.row]) for name, v in self.configs.items()}


@dataclass
class SearchResult:
    graph: OpGraph
    cluster: Cluster
    job: TrainingJob
    solutions: list[MeshSolution]
    points: list[FrontierPoint]
    search_seconds: float
    eps: float
    stats: dict = field(default_factory=dict)


def _op_factor(name: str, oc: OpCosts, rc: str | None = None) -> Factor:
    """One point per configuration; inside a block also per recomputation choice of the block."""
    c = np.arange(len(oc.configs))
    if rc is None:
        return leaf((name,), c[:, None], oc.time, oc.mem, note=f"op {name}")
    keys = np.concatenate([np.stack([c, np.zeros_like(c)], 1), np.stack([c, np.ones_like(c)], 1)])
    return leaf((name, rc), keys, np.concatenate([oc.time, oc.time_rc]), np.concatenate([oc.mem, oc.mem_rc]),
                note=f"op {name}")


def _edge_factor(ec: EdgeCosts, src_name: str, dst_name: str, rc: str | None = None) -> Factor:
    """Resharding time and the kept redistributed copy; a recomputed block keeps no copy."""
    cu, cv = ec.time.shape
    ku, kv = np.meshgrid(np.arange(cu), np.arange(cv), indexing="ij")
    keys = np.stack([ku.ravel(), kv.ravel()], axis=1)
    if rc is None or not ec.mem.any():
        return leaf((src_name, dst_name), keys, ec.time.ravel(), ec.mem.ravel(), note=f"edge {src_name}->{dst_name}")
    n = len(keys)
    keys = np.concatenate([np.c_[keys, np.zeros(n, int)], np.c_[keys, np.ones(n, int)]])
    return leaf((src_name, dst_name, rc), keys, np.tile(ec.time.ravel(), 2),
                np.concatenate([ec.mem.ravel(), recomputed_mem(ec.mem.ravel())]), note=f"edge {src_name}->{dst_name}")


def eliminate_all(factors: list[Factor], domain: dict[str, int], keep: tuple[str, ...] = (), eps: float = 0.0,
                  stats: Stats | None = None) -> Factor:
    """Variable elimination in min-weight order (the variable whose elimination makes the
    smallest table goes first; ties: fewest points, then name); returns one factor over `keep`."""
    live: dict[int, Factor] = dict(enumerate(factors))
    next_id = len(live)
    by_var: dict[str, set[int]] = {}
    for fid, f in live.items():
        for v in f.scope:
            by_var.setdefault(v, set()).add(fid)
    remaining = set(by_var) - set(keep)
    id_of = {id(f): fid for fid, f in live.items()}

    def weight(v: str) -> tuple[float, str]:
        """Expected number of point pairs the elimination combines: the joint assignment space
        times the average frontier size per assignment of every factor involved."""
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
            acc = eliminate_var(mine[0], v, domain, eps)
        else:
            acc = mine[0]
            for k, f in enumerate(mine[1:]):
                acc = join(acc, f, drop=(v,) if k == len(mine) - 2 else (), domain=domain, eps=eps, stats=stats)
        live[next_id] = acc
        id_of[id(acc)] = next_id
        for u in acc.scope:
            by_var[u].add(next_id)
        next_id += 1
        remaining.discard(v)
    rest = sorted(live.values(), key=len)
    acc = rest[0]
    for f in rest[1:]:
        acc = join(acc, f, domain=domain, eps=eps, stats=stats)
    return acc


@dataclass
class MeshProblem:
    """One mesh's factor graph, with everything that does not depend on pruning solved: the
    template layer eliminated to its per-boundary frontier (`unit`) and the rest of the graph to
    a factor over the boundary (`outside`); without a block stack, just the factors."""

    mesh: Mesh
    chain: Chain | None
    op_costs: dict[str, OpCosts]
    edge_costs: dict[tuple[str, str], EdgeCosts]
    domain: dict[str, int]
    buffers: float
    stats: Stats
    factors: list[Factor]
    unit: Factor | None = None
    outside: Factor | None = None
    zero: int = 0
    head: Factor | None = None   # with split_outside: the ops before the stack and layer 0
    tail: Factor | None = None   # ... and the ops after the stack (pipelines put them on other stages)


def mesh_costs(graph: OpGraph, cm: CostModel, mesh: Mesh, zero: int, chain: Chain | None) -> dict[str, OpCosts]:
    """Op cost tables for every op FT will see (with a stack: all but layers 2..n-1)."""
    covered = {n for layer in chain.layers[2:] for n in layer} if chain else set()
    outputs = layer_outputs(graph)
    return {op.name: cm.op_costs(op, mesh, zero, checkpoint=op.name in outputs)
            for op in graph.ops if op.name not in covered}


def prepare_mesh(graph: OpGraph, cm: CostModel, mesh: Mesh, reuse_blocks: bool = True, eps: float = 0.0,
                 zero: int = 0, recompute: bool = True, op_costs: dict[str, OpCosts] | None = None,
                 split_outside: bool | tuple[bool, bool] = False) -> MeshProblem:
    """Cost tables and factors of one mesh under ZeRO stage `zero`; with `recompute`, every
    layer of the block stack may also be recomputed. With a stack, the template layer and the
    rest of the graph are each solved twice, their layer recomputed or not, and the two
    frontiers united (a hub variable touching every op of a layer would double every table)."""
    stats = Stats()
    layer_of = layer_index(graph) if recompute else {}
    chain = find_chain(graph) if reuse_blocks else None
    op_costs = op_costs if op_costs is not None else mesh_costs(graph, cm, mesh, zero, chain)
    if chain and len(op_costs[chain.boundary].configs) != len(op_costs[chain.template[-1]].configs):
        return prepare_mesh(graph, cm, mesh, reuse_blocks=False, eps=eps, zero=zero, recompute=recompute)
    rename: dict[str, str] = {chain.layers[-1][-1]: chain.boundary} if chain else {}
    costed = [graph.op(name) for name in op_costs]
    domain = {name: len(oc.configs) for name, oc in op_costs.items()}
    domain.update({recompute_var(i): 2 for i in set(layer_of.values())})
    edge_costs: dict[tuple[str, str], EdgeCosts] = {}

    pairs: dict[str, list[Pair]] = {}
    for pair in cm.bounds.pairs:
        pairs.setdefault(pair.b, []).append(pair)

    def edge(src: str, dst: str) -> EdgeCosts:
        """Costs of dst reading src's output, priced with the real producer (for the ops after
        the stack: the last layer's output op, whose configurations mirror the boundary's), plus
        any pair constraint between the two (search/prices/boundaries.py)."""
        if (src, dst) not in edge_costs:
            prod, cons = graph.op(src), graph.op(dst)
            prod_cfgs = op_configs(prod, mesh, graph.batch_label)
            ec = None
            if any(t.source == src for t in cons.inputs):
                ec = cm.edge_costs(prod, cons, mesh, prod_cfgs, op_costs[dst].configs)
            for pair in pairs.get(dst, []):
                if pair.a == src:
                    ec = add_edges(ec, cm.pair_costs(pair, mesh, prod_cfgs, op_costs[dst].configs))
            assert ec is not None
            edge_costs[(src, dst)] = ec
        return edge_costs[(src, dst)]

    def factors(ops: list[Op], fixed: dict[int, int]) -> list[Factor]:
        """Factors of `ops`; a layer in `fixed` takes that recomputation choice, any other
        layer keeps its choice as a variable."""
        out: list[Factor] = []
        names = {op.name for op in ops}
        for op in ops:
            layer = layer_of.get(op.name)
            rc = recompute_var(layer) if layer is not None and layer not in fixed else None
            oc = _with_recompute(op_costs[op.name], fixed.get(layer, 0)) if layer in fixed else op_costs[op.name]
            out.append(_op_factor(op.name, oc, rc))
            # its producers, and the ops it must agree with among those solved together
            partners = [pr.a for pr in pairs.get(op.name, []) if pr.a in names]
            for src in dict.fromkeys([*(t.source for t in op.inputs if t.source is not None), *partners]):
                # ops after the stack read the last layer's output; the boundary variable stands for it
                ec = edge(src, op.name)
                if layer in fixed and fixed[layer]:
                    ec = EdgeCosts(src=ec.src, dst=ec.dst, time=ec.time, mem=recomputed_mem(ec.mem), comm=ec.comm)
                out.append(_edge_factor(ec, rename.get(src, src), op.name, rc))
        return out

    buffers = cm.buffers(mesh, costed, zero)
    if not chain:
        return MeshProblem(mesh=mesh, chain=None, op_costs=op_costs, edge_costs=edge_costs, domain=domain,
                           buffers=buffers, stats=stats, factors=factors(costed, {}), zero=zero)
    template = set(chain.template)
    block_ops = [op for op in costed if op.name in template]
    rest_ops = [op for op in costed if op.name not in template]
    out_t = chain.template[-1]
    choices = (0, 1) if recompute_var(1) in domain else (0,)

    def solved(ops: list[Op], layer: int | None, keep: tuple[str, ...], finish) -> Factor:
        """`ops` eliminated down to `keep`, with the recomputation of `layer` (if any) chosen."""
        if layer is None or not any(layer_of.get(op.name) == layer for op in ops):
            return finish(eliminate_all(factors(ops, {}), domain, keep=keep, eps=eps, stats=stats))
        cases = [finish(eliminate_all(factors(ops, {layer: r}), domain, keep=keep, eps=eps, stats=stats))
                 for r in choices]
        if len(cases) == 1:
            return cases[0]
        var = recompute_var(layer)
        return eliminate_var(union(cases, var), var, domain, eps)

    unit = solved(block_ops, 1, (chain.boundary, out_t),
                  lambda f: restrict_equal(f, chain.boundary, out_t, chain.boundary))
    unit.layer_leaf = True
    unit.layers = 1
    prob = MeshProblem(mesh=mesh, chain=chain, op_costs=op_costs, edge_costs=edge_costs, domain=domain,
                       buffers=buffers, stats=stats, factors=[], zero=zero, unit=unit)
    if split_outside:
        want_head, want_tail = split_outside if isinstance(split_outside, tuple) else (True, True)
        tail_names = after_stack(graph, chain)
        if want_head:
            prob.head = solved([op for op in rest_ops if op.name not in tail_names], 0, (chain.boundary,),
                               lambda f: f)
        if want_tail:
            prob.tail = solved([op for op in rest_ops if op.name in tail_names], None, (chain.boundary,),
                               lambda f: f)
        return prob
    # reduce everything else to a factor over the boundary first: the stack's factor is the
    # largest table, and it should meet one frontier per boundary configuration, not one per
    # configuration of every op it happens to share a table with
    prob.outside = solved(rest_ops, 0, (chain.boundary,), lambda f: f)
    return prob


def _frontier_size(solutions: list) -> int:
    """Points on the frontier of the solutions so far."""
    t = np.concatenate([s.root.t for s in solutions])
    m = np.concatenate([s.root.m for s in solutions])
    ok = (t < INFEASIBLE) & (m < INFEASIBLE)
    return len(pareto_mask(np.zeros(int(ok.sum()), dtype=np.int64), t[ok], m[ok]))


def after_stack(graph: OpGraph, chain: Chain) -> set[str]:
    """The ops after the block stack: those reading, directly or not, the last layer's output."""
    consumers = graph.consumers()
    out: set[str] = set()
    todo = [c for c, _ in consumers[chain.layers[-1][-1]]]
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo.extend(c for c, _ in consumers[name])
    return out


def _with_recompute(oc: OpCosts, r: int) -> OpCosts:
    """The op's tables with its block's recomputation fixed to r (as the plain arrays)."""
    if not r:
        return oc
    return OpCosts(configs=oc.configs, time=oc.time_rc, mem=oc.mem_rc, parts=oc.parts_rc, comm=oc.comm,
                   time_rc=oc.time_rc, mem_rc=oc.mem_rc, parts_rc=oc.parts_rc, estimated=oc.estimated,
                   step=oc.step)


def finish_mesh(prob: MeshProblem, eps: float = 0.0, envelope: tuple[np.ndarray, np.ndarray] | None = None,
                prune: bool = True) -> MeshSolution:
    """The frontier on one mesh. `envelope` holds (time, memory) of plans known to exist (other
    meshes' frontiers): they let the stack drop partial plans that cannot win."""
    envelope = envelope if envelope is not None else (np.zeros(0), np.zeros(0))
    stats, domain, factors = prob.stats, prob.domain, list(prob.factors)
    if prob.chain:
        assert prob.unit is not None and prob.outside is not None
        n = len(prob.chain.layers) - 1
        unit, outside = _drop_dominated_boundaries(prob.unit, prob.outside) if prune else (prob.unit, prob.outside)
        bound = _StackBound(unit, outside, n, envelope if prune else None, prob.buffers)
        stack = _chain(bound.prune(unit, 1), n, domain, eps, stats, {}, bound)
        outside = bound.prune(outside, 0, with_outside=True)
        factors = [join(outside, stack, drop=(prob.chain.boundary,), domain=domain, eps=eps, stats=stats)]
    root = eliminate_all(factors, domain, keep=(), eps=eps, stats=stats)
    root = Factor(scope=(), keys=root.keys, t=root.t, m=root.m + prob.buffers, parents=(root,),
                  parent_idx=(np.arange(len(root)),))
    return MeshSolution(mesh=prob.mesh, root=root, chain=prob.chain, op_costs=prob.op_costs,
                        edge_costs=prob.edge_costs, buffers=prob.buffers, stats=stats, zero=prob.zero)


def _chain(unit: Factor, n: int, domain: dict[str, int], eps: float, stats: Stats, memo: dict[int, Factor],
           bound: _StackBound) -> Factor:
    """n identical layers by repeated doubling; lengths are memoised so only O(log n) joins run."""
    if n == 1:
        return unit
    if n in memo:
        return memo[n]
    left = _chain(unit, n // 2, domain, eps, stats, memo, bound)
    right = _chain(unit, n - n // 2, domain, eps, stats, memo, bound)
    f = join(left, right, domain=domain, eps=eps, stats=stats,
             admit=(lambda t, m, keys: bound.admit(t, m, keys[:, 0], n)) if bound.enabled else None)
    f.layers = n
    f = bound.prune(f, n)
    memo[n] = f
    return f


def _sparse_max(values: np.ndarray) -> np.ndarray:
    """Sparse table for O(1) range maxima: row k holds the max of each window of 2**k."""
    rows = [values.astype(np.float64)]
    k = 1
    while (1 << k) <= len(values):
        prev = rows[-1]
        half = 1 << (k - 1)
        rows.append(np.maximum(prev[:-half], prev[half:]) if len(prev) > half else prev[:0])
        k += 1
    width = len(values)
    table = np.full((len(rows), max(width, 1)), -np.inf)
    for i, row in enumerate(rows):
        table[i, : len(row)] = row
    return table


def _range_max(table: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo..hi]) per query (inclusive); -inf where hi < lo."""
    length = hi - lo + 1
    valid = length >= 1
    k = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    k = np.minimum(k, table.shape[0] - 1)
    a = table[k, np.clip(lo, 0, table.shape[1] - 1)]
    b = table[k, np.clip(hi - (1 << k) + 1, 0, table.shape[1] - 1)]
    return np.where(valid, np.maximum(a, b), -np.inf)


def _staircase(t: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points sorted by time with the running minimum of memory: `_least_memory` looks it up."""
    order = np.argsort(t)
    return t[order], np.minimum.accumulate(m[order])


def _least_memory(stair: tuple[np.ndarray, np.ndarray], within: np.ndarray) -> np.ndarray:
    """Per query, the least memory of the staircase's points whose time is <= `within` (inf if none)."""
    st, sm = stair
    i = np.searchsorted(st, within, side="right") - 1
    return np.where(i >= 0, sm[np.clip(i, 0, None)] if len(sm) else np.inf, np.inf)


def _covered(a_t: np.ndarray, a_m: np.ndarray, b_t: np.ndarray, b_m: np.ndarray) -> bool:
    """Is every point of frontier A weakly dominated (within RTOL) by some point of B?"""
    return bool(np.all(_least_memory(_staircase(b_t, b_m), a_t * (1.0 + RTOL)) <= a_m * (1.0 + RTOL)))


def _drop_dominated_boundaries(unit: Factor, outside: Factor) -> tuple[Factor, Factor]:
    """A boundary configuration c1 loses to c2 when every layer point and every point of the
    rest of the graph under c1 is matched or beaten under c2: any plan through c1 is then
    beaten by the same choices through c2. Dropping c1 is exact (of two equals, the first stays)."""
    keys = sorted(set(unit.keys[:, 0].tolist()) & set(outside.keys[:, 0].tolist()))
    u = {c: (unit.t[unit.keys[:, 0] == c], unit.m[unit.keys[:, 0] == c]) for c in keys}
    o = {c: (outside.t[outside.keys[:, 0] == c], outside.m[outside.keys[:, 0] == c]) for c in keys}

    def beats(c2: int, c1: int) -> bool:
        return _covered(*u[c1], *u[c2]) and _covered(*o[c1], *o[c2])

    alive = [c1 for c1 in keys
             if not any(c2 != c1 and beats(c2, c1) and not (c2 > c1 and beats(c1, c2)) for c2 in keys)]
    return (select(unit, np.flatnonzero(np.isin(unit.keys[:, 0], alive))),
            select(outside, np.flatnonzero(np.isin(outside.keys[:, 0], alive))))


class _StackBound:
    """Exact pruning of partial stacks: a point covering L of the n layers will still be joined
    with n - L more layers and with the rest of the graph, each at least as costly as their
    ideal point (the least time and the least memory, taken separately, for that boundary
    configuration). If even that optimistic completion is beaten in both objectives by a plan
    known to exist - a uniform stack, or a point of a mesh solved earlier - the point cannot be
    on the frontier and is dropped. The same test drops whole boundary configurations."""

    def __init__(self, unit: Factor, outside: Factor, n: int, envelope: tuple[np.ndarray, np.ndarray] | None,
                 buffers: float) -> None:
        """`envelope`: final (time, memory) of plans found on other meshes, None to prune
        nothing; `buffers`: this mesh's constant memory, added to this mesh's bounds."""
        self.n = n
        self.buffers = buffers
        self.enabled = envelope is not None
        if envelope is None:
            return  # prune() returns its factor untouched and the join gets no admit test
        keys = int(max(unit.keys[:, 0].max(initial=0), outside.keys[:, 0].max(initial=0))) + 1
        inf = np.full(keys, np.inf)
        self.unit_t, self.unit_m = inf.copy(), inf.copy()
        np.minimum.at(self.unit_t, unit.keys[:, 0], unit.t)
        np.minimum.at(self.unit_m, unit.keys[:, 0], unit.m)
        self.out_t, self.out_m = inf.copy(), inf.copy()
        np.minimum.at(self.out_t, outside.keys[:, 0], outside.t)
        np.minimum.at(self.out_m, outside.keys[:, 0], outside.m)
        # plans that exist: the rest of the graph plus n copies of one layer configuration
        ts, ms = [envelope[0]], [envelope[1]]
        for c in range(keys):
            d = unit.keys[:, 0] == c
            o = outside.keys[:, 0] == c
            if d.any() and o.any():
                ts.append((outside.t[o][:, None] + n * unit.t[d][None, :]).ravel())
                ms.append((outside.m[o][:, None] + n * unit.m[d][None, :]).ravel() + buffers)
        t, m = np.concatenate(ts), np.concatenate(ms)
        keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, m)
        self.env_t, self.env_m = _staircase(t[keep], m[keep])
        self._hull_setup(unit, outside, keys)

    # ---- a tighter bound: the remaining layers' convex hull instead of their ideal point -------
    def _hull_setup(self, unit: Factor, outside: Factor, keys: int) -> None:
        """For slopes lam, every completion q of a partial stack satisfies
        q.t + lam * q.m >= R * min_d(d.t + lam * d.m) + min_o(o.t + lam * o.m) (R layers left).
        Slopes come from the envelope's own steps, where the test has the most bite."""
        et, em = self.env_t, self.env_m
        steps = (et[1:] - et[:-1]) / np.maximum(em[:-1] - em[1:], 1e-300)
        steps = steps[np.isfinite(steps) & (steps > 0)]
        self.lams = np.unique(np.quantile(steps, np.linspace(0.05, 0.95, 7))) if len(steps) else np.zeros(0)
        self.w_unit = np.full((keys, len(self.lams)), np.inf)
        self.w_out = np.full((keys, len(self.lams)), np.inf)
        for j, lam in enumerate(self.lams):
            np.minimum.at(self.w_unit[:, j], unit.keys[:, 0], unit.t + lam * unit.m)
            np.minimum.at(self.w_out[:, j], outside.keys[:, 0], outside.t + lam * outside.m)
        # per slope, the staircase test needs max over envelope steps of lam * e_i.m + e_{i+1}.t
        self.tables = [_sparse_max(lam * em[:-1] + et[1:]) for lam in self.lams]

    def hull_admit(self, t: np.ndarray, m: np.ndarray, c: np.ndarray, layers: int, with_outside: bool = False) -> np.ndarray:
        """False where every completion allowed by one of the hull constraints is dominated by
        the envelope: the region {x.t + lam x.m >= B, x.t >= T0, x.m >= M0} is covered by the
        envelope's staircase iff its boundary segment is, checked step by step (range max)."""
        r = self.n - layers
        shrink = 1.0 - 2 * RTOL  # a region pulled toward the origin is harder to cover: margin
        t0 = (t + r * self.unit_t[c] + (0.0 if with_outside else self.out_t[c])) * shrink
        m0 = (m + r * self.unit_m[c] + (0.0 if with_outside else self.out_m[c]) + self.buffers) * shrink
        dominated = np.zeros(len(t), dtype=bool)
        et, em = self.env_t, self.env_m
        for j, lam in enumerate(self.lams):
            b = (t + lam * (m + self.buffers) + r * self.w_unit[c, j]
                 + (0.0 if with_outside else self.w_out[c, j])) * shrink
            t1 = b - lam * m0
            i0 = np.searchsorted(et, t0, side="right") - 1
            i1 = np.searchsorted(et, t1, side="right") - 1
            ok = (i0 >= 0) & (em[np.clip(i1, 0, None)] <= m0)
            inner = i1 > i0
            steps_max = _range_max(self.tables[j], np.clip(i0, 0, None), np.clip(i1 - 1, 0, None))
            dominated |= ok & (~inner | (steps_max <= b))
        return ~dominated

    def admit(self, t: np.ndarray, m: np.ndarray, c: np.ndarray, layers: int, with_outside: bool = False) -> np.ndarray:
        """Which points (of boundary configurations c, covering `layers` layers) may still win."""
        lt = t + (self.n - layers) * self.unit_t[c] + (0.0 if with_outside else self.out_t[c])
        lm = m + (self.n - layers) * self.unit_m[c] + (0.0 if with_outside else self.out_m[c]) + self.buffers
        # the least envelope memory among plans faster by more than RTOL
        env_m = _least_memory((self.env_t, self.env_m), lt * (1.0 - RTOL))
        return ~(env_m < lm * (1.0 - RTOL))

    def prune(self, f: Factor, layers: int, with_outside: bool = False) -> Factor:
        if not self.enabled:
            return f
        c = f.keys[:, 0]
        return select(f, np.flatnonzero(self.admit(f.t, f.m, c, layers, with_outside)
                                        & self.hull_admit(f.t, f.m, c, layers, with_outside)))


ZERO_STAGES = (0, 1, 2, 3)


def _no_worse(a: dict[str, OpCosts], b: dict[str, OpCosts]) -> bool:
    """Every op in every configuration (with and without recomputation) costs no more time and
    no more memory under tables a than under b."""
    if a.keys() != b.keys():
        return False
    for name, oa in a.items():
        ob = b[name]
        for x, y in ((oa.time, ob.time), (oa.time_rc, ob.time_rc), (oa.mem, ob.mem), (oa.mem_rc, ob.mem_rc)):
            if x.shape != y.shape or np.any(x > y * (1 + RTOL) + 1e-300):
                return False
    return True


def _drop_dominated_stages(tables: list[tuple[Mesh, int, dict[str, OpCosts]]],
                           cm: CostModel) -> list[tuple[Mesh, int, dict[str, OpCosts]]]:
    """Exact: on one mesh, a ZeRO stage that another beats op by op (the edges do not depend on
    the stage) and in its constant buffers adds no frontier point (of two equals the first stays)."""
    ops = [cm.graph.op(n) for n in tables[0][2]] if tables else []
    buffers = [cm.buffers(mesh, ops, zero) for mesh, zero, _ in tables]

    def beats(i: int, j: int) -> bool:
        return (tables[i][0] == tables[j][0] and buffers[i] <= buffers[j] * (1 + RTOL)
                and _no_worse(tables[i][2], tables[j][2]))

    return [t for j, t in enumerate(tables)
            if not any(i != j and beats(i, j) and not (i > j and beats(j, i)) for i in range(len(tables)))]


def search(graph: OpGraph, cluster: Cluster, job: TrainingJob, meshes: list[Mesh] | None = None,
           eps: float = 0.0, reuse_blocks: bool = True, prune: bool = True,
           zero_stages: tuple[int, ...] = ZERO_STAGES, recompute: bool = True, profile=None,
           pipeline: bool = False, allow_async: bool = False,
           progress: Callable[[float, str], None] | None = None) -> SearchResult:
    """The Pareto frontier of (iteration time, peak memory per device) over every mesh and ZeRO
    stage, with per-layer activation recomputation when `recompute`; priced from a measured
    DeviceProfile when `profile` is given (search/prices/profile.py). With `pipeline`, pipeline plans
    join the frontier (search/algorithm/pipeline.py; PipeDream-2BW only with `allow_async`). `progress`
    hears (fraction done, "<mesh>: N frontier points so far") after every mesh."""
    start = _time.perf_counter()
    cm = CostModel(graph, cluster, job, profile=profile)
    meshes = placeable_meshes(graph, meshes if meshes is not None else mesh_candidates(cluster))
    chain = find_chain(graph) if reuse_blocks else None
    tables = [(mesh, zero, mesh_costs(graph, cm, mesh, zero, chain)) for mesh in meshes for zero in zero_stages]
    if prune:
        tables = _drop_dominated_stages(tables, cm)
    problems = [prepare_mesh(graph, cm, mesh, reuse_blocks, eps, zero, recompute, costs)
                for mesh, zero, costs in tables]
    envelope = (np.zeros(0), np.zeros(0))
    if prune and eps < PREPASS_EPS and any(p.chain for p in problems) and len(problems) > 1:
        # A coarse pass over every mesh finds real plans close to the whole frontier in a
        # fraction of the time; as an envelope they let the main pass drop, on every mesh, the
        # partial stacks that cannot win. An exact result stays exact; an approximate one keeps
        # its bound (a dropped point is beaten by a real plan, itself near a returned one).
        for prob in problems:
            rough = finish_mesh(prob, PREPASS_EPS, envelope)
            envelope = (np.concatenate([envelope[0], rough.root.t]), np.concatenate([envelope[1], rough.root.m]))
    solutions: list[MeshSolution] = []
    steps = len(problems) + (1 if pipeline else 0)
    for prob in problems:
        sol = finish_mesh(prob, eps, envelope, prune)
        solutions.append(sol)
        # what this mesh achieves bounds what later meshes need to keep
        envelope = (np.concatenate([envelope[0], sol.root.t]), np.concatenate([envelope[1], sol.root.m]))
        if progress:
            progress(len(solutions) / steps, f"{sol.describe()}: {_frontier_size(solutions)} frontier points so far")
    if pipeline:
        from search.algorithm.pipeline import search_pipelines

        # the plans without a pipeline bound what a pipeline stage may cost and still matter
        known = (np.concatenate([s.root.t for s in solutions]), np.concatenate([s.root.m for s in solutions]))
        solutions += search_pipelines(graph, cluster, job, zero_stages, recompute, allow_async, eps,
                                      profile=profile, envelope=known if prune else None)  # type: ignore[arg-type]
        if progress:
            progress(1.0, f"pipelines: {_frontier_size(solutions)} frontier points so far")
    t = np.concatenate([s.root.t for s in solutions]) if solutions else np.zeros(0)
    m = np.concatenate([s.root.m for s in solutions]) if solutions else np.zeros(0)
    which = np.concatenate([np.full(len(s.root), i) for i, s in enumerate(solutions)]) if solutions else np.zeros(0, int)
    local = np.concatenate([np.arange(len(s.root)) for s in solutions]) if solutions else np.zeros(0, int)
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, m, eps)
    keep = keep[(t[keep] < INFEASIBLE) & (m[keep] < INFEASIBLE)]  # a pair constraint broken everywhere
    points: list[FrontierPoint] = []
    for i, sol in enumerate(solutions):
        sel = keep[which[keep] == i]
        if len(sel) == 0:
            continue
        parts = getattr(sol, "partitions", None)
        if parts is not None:  # a pipeline shape read its configurations back already
            assign = {name: v[local[sel]] for name, v in sol.assigns.items()}
        else:
            assign = assignments(sol.root, local[sel], sol.chain.layer_maps() if sol.chain else None)
        for j, g in enumerate(sel):
            points.append(FrontierPoint(time_s=float(t[g]), memory_bytes=float(m[g]), mesh_index=i,
                                        configs=assign, row=j,
                                        stages=parts[local[g]] if parts is not None else None))
    points.sort(key=lambda p: p.time_s)
    elapsed = _time.perf_counter() - start
    stats = {
        "ops": len(graph.ops),
        "meshes": sorted({s.mesh.describe() for s in solutions}),
        "zero_stages": list(zero_stages),
        "recompute": recompute and bool(graph.blocks),
        "configurations": {s.mesh.describe(): int(sum(len(oc.configs) for oc in s.op_costs.values())) for s in solutions},
        "max_configs_per_op": max((len(oc.configs) for s in solutions for oc in s.op_costs.values()), default=0),
        "frontier_per_mesh": {s.describe(): int(len(s.root)) for s in solutions},
        "frontier": len(points),
        "largest_factor": max((s.stats.max_factor_points for s in solutions), default=0),
        "pairs_combined": int(sum(s.stats.pairs for s in solutions)),
        "block_reuse": bool(solutions and solutions[0].chain is not None),
        "layers_solved_once": len(solutions[0].chain.layers) - 1 if solutions and solutions[0].chain else 0,
        "pipeline": pipeline,
        "pipeline_shapes": sum(1 for s in solutions if hasattr(s, "partitions")),
        "allow_async_pipeline": allow_async,
    }
    return SearchResult(graph=graph, cluster=cluster, job=job, solutions=solutions, points=points,
                        search_seconds=elapsed, eps=eps, stats=stats)
