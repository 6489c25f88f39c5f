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
5. The per-mesh frontiers are merged and reduced; each final point's configuration of every op
   is read back through the factors' provenance.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, field

import numpy as np

from search.cluster import Cluster
from search.costmodel import CostModel, EdgeCosts, OpCosts, TrainingJob
from search.frontier import Factor, Stats, assignments, eliminate_var, join, leaf, pareto_mask, restrict_equal
from search.graph import OpGraph
from search.mesh import Mesh, mesh_candidates, op_configs


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
            maps.append(m)
        return maps


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


@dataclass
class FrontierPoint:
    time_s: float
    memory_bytes: float
    mesh_index: int
    assignment: dict[str, int]   # op name -> configuration index


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


def _op_factor(name: str, oc: OpCosts) -> Factor:
    c = len(oc.configs)
    return leaf((name,), np.arange(c)[:, None], oc.time, oc.mem, note=f"op {name}")


def _edge_factor(ec: EdgeCosts, src_name: str, dst_name: str) -> Factor:
    cu, cv = ec.time.shape
    ku, kv = np.meshgrid(np.arange(cu), np.arange(cv), indexing="ij")
    return leaf((src_name, dst_name), np.stack([ku.ravel(), kv.ravel()], axis=1), ec.time.ravel(), ec.mem.ravel(),
                note=f"edge {src_name}->{dst_name}")


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


def solve_mesh(graph: OpGraph, cm: CostModel, mesh: Mesh, eps: float = 0.0, reuse_blocks: bool = True) -> MeshSolution:
    stats = Stats()
    chain = find_chain(graph) if reuse_blocks else None
    covered = {n for layer in chain.layers[2:] for n in layer} if chain else set()
    rename: dict[str, str] = {}
    if chain:
        rename[chain.layers[-1][-1]] = chain.boundary
    costed = [op for op in graph.ops if op.name not in covered]
    op_costs = {op.name: cm.op_costs(op, mesh) for op in costed}
    if chain and len(op_costs[chain.boundary].configs) != len(op_costs[chain.template[-1]].configs):
        return solve_mesh(graph, cm, mesh, eps, reuse_blocks=False)
    domain = {name: len(oc.configs) for name, oc in op_costs.items()}
    edge_costs: dict[tuple[str, str], EdgeCosts] = {}

    def edge(src: str, dst: str) -> EdgeCosts:
        """Costs of dst reading src's output, priced with the real producer (for the ops after
        the stack: the last layer's output op, whose configurations mirror the boundary's)."""
        if (src, dst) not in edge_costs:
            prod, cons = graph.op(src), graph.op(dst)
            edge_costs[(src, dst)] = cm.edge_costs(prod, cons, mesh, op_configs(prod, mesh), op_costs[dst].configs)
        return edge_costs[(src, dst)]

    template = set(chain.template) if chain else set()
    rest_factors: list[Factor] = []
    block_factors: list[Factor] = []
    for op in costed:
        target = block_factors if op.name in template else rest_factors
        target.append(_op_factor(op.name, op_costs[op.name]))
        for src in dict.fromkeys(t.source for t in op.inputs if t.source is not None):
            # ops after the stack read the last layer's output; the boundary variable stands for it
            var = rename.get(src, src)
            target.append(_edge_factor(edge(src, op.name), var, op.name))
    if chain:
        out_t = chain.template[-1]
        block = eliminate_all(block_factors, domain, keep=(chain.boundary, out_t), eps=eps, stats=stats)
        diag = restrict_equal(block, chain.boundary, out_t, chain.boundary)
        diag.layer_leaf = True
        diag.layers = 1
        stack = _chain(diag, len(chain.layers) - 1, domain, eps, stats, {})
        # reduce everything else to a factor over the boundary first: the stack's factor is the
        # largest table, and it should meet one frontier per boundary configuration, not one
        # per configuration of every op it happens to share a table with
        outside = eliminate_all(rest_factors, domain, keep=(chain.boundary,), eps=eps, stats=stats)
        rest_factors = [join(outside, stack, drop=(chain.boundary,), domain=domain, eps=eps, stats=stats)]
    root = eliminate_all(rest_factors, domain, keep=(), eps=eps, stats=stats)
    buffers = cm.buffers(mesh)
    root = Factor(scope=(), keys=root.keys, t=root.t, m=root.m + buffers, parents=(root,),
                  parent_idx=(np.arange(len(root)),))
    stats.sizes.append(len(root))
    return MeshSolution(mesh=mesh, root=root, chain=chain, op_costs=op_costs, edge_costs=edge_costs,
                        buffers=buffers, stats=stats)


def _chain(unit: Factor, n: int, domain: dict[str, int], eps: float, stats: Stats, memo: dict[int, Factor]) -> Factor:
    """n identical layers by repeated doubling; lengths are memoised so only O(log n) joins run."""
    if n == 1:
        return unit
    if n in memo:
        return memo[n]
    left = _chain(unit, n // 2, domain, eps, stats, memo)
    right = _chain(unit, n - n // 2, domain, eps, stats, memo)
    f = join(left, right, domain=domain, eps=eps, stats=stats)
    f.layers = n
    memo[n] = f
    return f


def search(graph: OpGraph, cluster: Cluster, job: TrainingJob, meshes: list[Mesh] | None = None,
           eps: float = 0.0, reuse_blocks: bool = True) -> SearchResult:
    """The Pareto frontier of (iteration time, peak memory per device) over every mesh."""
    start = _time.perf_counter()
    cm = CostModel(graph, cluster, job)
    meshes = meshes if meshes is not None else mesh_candidates(cluster)
    solutions = [solve_mesh(graph, cm, mesh, eps, reuse_blocks) for mesh in meshes]
    t = np.concatenate([s.root.t for s in solutions]) if solutions else np.zeros(0)
    m = np.concatenate([s.root.m for s in solutions]) if solutions else np.zeros(0)
    which = np.concatenate([np.full(len(s.root), i) for i, s in enumerate(solutions)]) if solutions else np.zeros(0, int)
    local = np.concatenate([np.arange(len(s.root)) for s in solutions]) if solutions else np.zeros(0, int)
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, m, eps)
    points: list[FrontierPoint] = []
    for i, sol in enumerate(solutions):
        sel = keep[which[keep] == i]
        if len(sel) == 0:
            continue
        assign = assignments(sol.root, local[sel], sol.chain.layer_maps() if sol.chain else None)
        for j, g in enumerate(sel):
            points.append(FrontierPoint(time_s=float(t[g]), memory_bytes=float(m[g]), mesh_index=i,
                                        assignment={name: int(v[j]) for name, v in assign.items()}))
    points.sort(key=lambda p: p.time_s)
    elapsed = _time.perf_counter() - start
    stats = {
        "ops": len(graph.ops),
        "meshes": [s.mesh.describe() for s in solutions],
        "configurations": {s.mesh.describe(): int(sum(len(oc.configs) for oc in s.op_costs.values())) for s in solutions},
        "max_configs_per_op": max((len(oc.configs) for s in solutions for oc in s.op_costs.values()), default=0),
        "frontier_per_mesh": {s.mesh.describe(): int(len(s.root)) for s in solutions},
        "frontier": len(points),
        "largest_factor": max((s.stats.max_factor_points for s in solutions), default=0),
        "pairs_combined": int(sum(s.stats.pairs for s in solutions)),
        "block_reuse": bool(solutions and solutions[0].chain is not None),
        "layers_solved_once": len(solutions[0].chain.layers) - 1 if solutions and solutions[0].chain else 0,
    }
    return SearchResult(graph=graph, cluster=cluster, job=job, solutions=solutions, points=points,
                        search_seconds=elapsed, eps=eps, stats=stats)
