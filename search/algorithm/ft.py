"""FT: frontier tracking (TensorOpt, Cai et al., arXiv 2004.10856), exact.

Read top to bottom:

1. The outer loop runs over the candidate meshes (how the devices factor into dp x tp) and ZeRO
   stages (`search`); on one mesh, a stage that another beats op by op is dropped first.
2. On one mesh every op is a variable whose values are its configurations (mesh.py). Each op
   contributes a unary factor (one point per configuration: its time and memory) and each
   producer -> consumer pair a pairwise factor (resharding time and memory per pair of
   configurations). The frontier of the whole graph is the Pareto set of the sum over all of
   them, minimised over every assignment: a min-sum problem over a factor graph where "min" is
   Pareto reduction (factor_graph.py builds it).
3. Variables are eliminated one at a time, greedily choosing the one whose elimination creates
   the smallest table (min-weight order). For an op with one producer and one consumer this is
   FT's node elimination; two factors over the same pair merge as FT's edge elimination; what
   those cannot reduce (residual and attention branches) is the same elimination carrying the
   live configurations in the factor's scope, which is FT's dynamic programme over a
   topological order with the cut as state. Every join is followed by Pareto reduction
   (factor_graph.eliminate_all; the frontier algebra is frontier.py).
4. Repeated layers (transformer blocks, chain.py) are solved once, where each layer provably
   prices like the template (chain.find_chain; a last layer that does not - what reads its
   output after the stack keeps it for backward otherwise than the next layer would - is priced
   with its own tables and solved with the rest of the graph, `Chain.solo`; a stack that is not
   uniform otherwise is solved op by op): the template layer's
   internal ops are eliminated to a factor over (its input op, its output op). The strategy
   space ties the residual stream's configuration across the stack (every block boundary uses
   the same layout, as every Megatron/FSDP plan does), while every op inside every layer
   chooses freely; so the template factor is restricted to equal boundary configurations
   (factor_graph.prepare_mesh) and n layers are combined by repeated doubling: log2(n)
   Minkowski sums, not n (`finish_mesh`).
5. Exact pruning keeps the stack's frontiers small (FT stays exact: only points that provably
   cannot reach the final frontier go): a boundary configuration that another beats on every
   layer and on the rest of the graph is dropped; a coarse pass (eps = PREPASS_EPS) over every
   mesh first finds real plans close to the frontier, and a partial stack of L layers whose most
   optimistic completion (the remaining layers' ideal point, then their convex hull, plus the
   rest of the graph) is beaten by one of those plans is dropped during the doubling.
6. With pipelines (and with gradient accumulation, a pipeline of one stage), the pipeline stage
   search (pipeline.py) adds a frontier per pipeline shape, bounded by the plans found without one.
7. The per-mesh frontiers are merged and reduced; each final point's configuration of every op
   is read back through the factors' provenance (`Solution.read_back`).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from search.algorithm.chain import Chain, find_chain, layer_index
from search.algorithm.evaluate import mesh_costs
from search.algorithm.factor_graph import JoinMemo, MeshFactors, MeshProblem, eliminate_all, least_of, prepare_mesh
from search.algorithm.families import family_costs, find_families, prepare_families
from search.algorithm.frontier import RTOL, Factor, Stats, join, least_memory, pareto_mask, select, staircase
from search.algorithm.gc_pause import gc_paused
from search.algorithm.hull_bound import HullTest, weighted_least
from search.algorithm.pipeline import Regions, ShapeBound, envelope_slopes, search_pipelines
from search.algorithm.results import FrontierPoint, MeshSolution, SearchResult, Solution
from search.algorithm.stack_tables import is_multi_stack
from search.algorithm.stacks import search_stacks
from search.models.graph import Op, OpGraph
from search.prices.boundaries import INFEASIBLE
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, OpCosts, TrainingJob
from search.prices.mesh import Mesh, mesh_candidates, placeable_meshes, runs_with_zero
from search.prices.profile import DeviceProfile, ProfileLookup

PREPASS_EPS = 0.02
ZERO_STAGES = (0, 1, 2, 3)

Progress = Callable[[float, str], None]  # (fraction done, "<mesh>: N frontier points so far")
Envelope = tuple[np.ndarray, np.ndarray]  # (time, memory) of plans known to exist


@dataclass(frozen=True)
class SearchOptions:
    """What the search covers and how. The defaults search the whole space exactly."""

    meshes: tuple[Mesh, ...] | None = None  # None: every candidate mesh of the cluster
    eps: float = 0.0                         # > 0: approximate mode, one point per (1 + eps) cell
    reuse_blocks: bool = True                # solve the block stack's template layer once
    prune: bool = True                       # exact pruning (dominated stages, boundaries, partial stacks)
    zero_stages: tuple[int, ...] = ZERO_STAGES
    recompute: bool = True                   # every layer of the block stack may be recomputed
    profile: DeviceProfile | ProfileLookup | None = None  # price from measured costs (search/prices/profile.py)
    pipeline: bool = False                   # pipeline plans join the frontier (pipeline.py)
    accumulate: bool = False                 # one-stage plans may run the batch as m micro-batches
    #                                          (gradient accumulation, pipeline.py with p = 1)
    allow_async: bool = False                # ... PipeDream-2BW's among them (1-stale weights)
    interleave: bool = False                 # ... and interleaved 1F1B's (virtual stages, interleave.py)
    tensor_2d: bool = False                  # also meshes with two tensor axes (mesh.py tensor_2d_meshes)


def search(graph: OpGraph, cluster: Cluster, job: TrainingJob, options: SearchOptions = SearchOptions(),
           progress: Progress | None = None) -> SearchResult:
    """The Pareto frontier of (iteration time, peak memory per device) over every mesh and ZeRO
    stage (and pipeline shape), as `options` say. `progress` hears (fraction done, "<mesh>: N
    frontier points so far") after every mesh."""
    with gc_paused():  # nothing the search allocates is cyclic garbage (gc_pause.py)
        return _search(graph, cluster, job, options, progress)


def _search(graph: OpGraph, cluster: Cluster, job: TrainingJob, options: SearchOptions,
            progress: Progress | None) -> SearchResult:
    start = _time.perf_counter()
    cm = CostModel(graph, cluster, job, profile=options.profile)
    problems, envelope = _mesh_problems(graph, cm, options)
    staged = options.pipeline or options.accumulate  # the stage search runs (pipeline.py)
    steps = len(problems) + (1 if staged else 0)
    solutions: list[Solution] = []
    for prob in problems:
        sol = (finish_mesh(prob, options.eps, envelope, options.prune) if isinstance(prob, MeshProblem)
               else prob.solution())
        solutions.append(sol)
        envelope = _grown(envelope, sol.root)  # what this mesh achieves bounds what later meshes need to keep
        if progress:
            progress(len(solutions) / steps, f"{sol.describe()}: {_frontier_size(solutions)} frontier points so far")
    shape_counts: dict[str, int] = {}
    if staged:
        solutions += _pipelines(graph, cm, solutions, options, shape_counts)
        if progress:
            progress(1.0, f"pipelines: {_frontier_size(solutions)} frontier points so far")
    points = _frontier(solutions, options.eps)
    return SearchResult(graph=graph, cluster=cluster, job=job, solutions=solutions, points=points,
                        search_seconds=_time.perf_counter() - start, eps=options.eps,
                        stats={**_stats(graph, solutions, points, options),
                               "pipeline_shapes_tried": shape_counts.get("shapes", 0),
                               "pipeline_shapes_bounded_out": shape_counts.get("bounded_out", 0),
                               "pipeline_shapes_solved": shape_counts.get("solved", 0),
                               "pipeline_shapes_twins": shape_counts.get("twins", 0)})


# ---- 1. meshes and ZeRO stages -----------------------------------------------------------------
Tables = list[tuple[Mesh, int, dict[str, OpCosts]]]  # (mesh, ZeRO stage, op tables) per problem


def _mesh_problems(graph: OpGraph, cm: CostModel, options: SearchOptions
                   ) -> tuple[list[MeshProblem | _Beaten], Envelope]:
    """One factor graph per (mesh, ZeRO stage) worth solving, its template layer and the rest of
    the graph already eliminated (steps 2 to 4), in the order of the tables; and the envelope of
    the coarse pass (step 5). With a block stack, a problem whose op tables alone prove that
    plans already found beat every plan it holds is not built (`_Beaten`)."""
    candidates = (list(options.meshes) if options.meshes is not None
                  else mesh_candidates(cm.cluster, tensor_2d=options.tensor_2d))
    # an encoder-decoder: each stack whose layers a template stands for, side inputs and all
    families = find_families(graph) if options.reuse_blocks and is_multi_stack(graph) else ()
    chain = find_chain(graph, solo=True) if options.reuse_blocks and not families else None
    # layers 2.. configure as the template does (the chain's premise, as their prices do): a mesh
    # that places the template's ops places theirs (DeepSeek-V3: 56 of its 61 layers not walked)
    copies = chain.copies if chain is not None else frozenset()
    meshes = placeable_meshes(graph, candidates, [op for op in graph.ops if op.name not in copies])
    tables = [(mesh, zero, family_costs(graph, cm, mesh, zero, families) if families
               else mesh_costs(graph, cm, mesh, zero, chain)) for mesh in meshes for zero in options.zero_stages
              if runs_with_zero(mesh, zero)]
    if options.prune:
        tables = _drop_dominated_stages(tables, cm)
    if families:
        problems = [prepare_families(graph, cm, mesh, families, options.eps, zero, options.recompute, costs)
                    for mesh, zero, costs in tables]
        return list(problems), _prepass(problems, options)
    # the ZeRO stages of one mesh share the joins of the ops they price alike
    memos = {mesh: JoinMemo() for mesh, _, _ in tables}
    layer_of = layer_index(graph) if options.recompute else {}

    def factors(mesh: Mesh, costs: dict[str, OpCosts]) -> MeshFactors:
        """The factors `prepare_mesh` makes of these tables, made first for a bound taken from them."""
        return MeshFactors(graph, cm, mesh, costs, layer_of, chain, options.eps, None, memo=memos[mesh])

    def prepare(mesh: Mesh, zero: int, costs: dict[str, OpCosts], fg: MeshFactors | None = None) -> MeshProblem:
        return prepare_mesh(graph, cm, mesh, options.reuse_blocks, options.eps, zero, options.recompute, costs,
                            memo=memos[mesh], factors=fg)

    if chain is None or not _coarse_pass(options, len(tables)):
        problems = [prepare(mesh, zero, costs) for mesh, zero, costs in tables]
        return list(problems), _prepass(problems, options)
    return _bounded_problems(graph, cm, chain, tables, factors, prepare)


def _bounded_problems(graph: OpGraph, cm: CostModel, chain: Chain, tables: Tables,
                      factors: Callable[[Mesh, dict[str, OpCosts]], MeshFactors],
                      prepare: Callable[[Mesh, int, dict[str, OpCosts], MeshFactors], MeshProblem]
                      ) -> tuple[list[MeshProblem | _Beaten], Envelope]:
    """Step 5's coarse pass, run while the problems are built: the most promising first (least
    time bound), each finished coarsely as soon as it is built, so that the plans it finds bound
    the problems after it. A problem whose every plan lies where known plans beat it adds no
    frontier point and is not built - its eliminations were most of a large MoE's search, where
    few (mesh, ZeRO stage) pairs come near the frontier. Two bounds, the cheaper first: each op
    at its cheapest configuration (`_ProblemBound.covered`), then the stack's layers at the least
    of the template layer's own frontier (`layer_covered`: its edges, which the first leaves out,
    make a tensor-parallel layer cost several times its ops' minima). Exact: the test the pipeline
    shapes pass (pipeline.ShapeBound, Regions), and the coarse plans only bound the exact pass,
    as `_prepass`'s do."""
    bounds = [_ProblemBound(graph, cm, chain, mesh, zero, costs) for mesh, zero, costs in tables]
    block = [op for op in graph.ops if op.name in set(chain.template)]
    envelope: Envelope = (np.zeros(0), np.zeros(0))
    problems: list[MeshProblem | _Beaten | None] = [None] * len(tables)
    for i in sorted(range(len(tables)), key=lambda i: (bounds[i].least_time, i)):
        mesh, zero, costs = tables[i]
        fg = None
        if len(envelope[0]):
            beaten = bounds[i].covered(envelope)
            if not beaten:
                fg = factors(mesh, costs)
                beaten = bounds[i].layer_covered(fg, block, envelope)
            if beaten:
                problems[i] = _Beaten(mesh, zero, costs, bounds[i].buffers, chain)
                continue
        prob = problems[i] = prepare(mesh, zero, costs, fg if fg is not None else factors(mesh, costs))
        envelope = _grown(envelope, finish_mesh(prob, PREPASS_EPS, envelope).root)
    return [p for p in problems if p is not None], envelope


class _ProblemBound:
    """Where every plan of one (mesh, ZeRO stage) lies, from its op tables alone: each op at its
    cheapest configuration (with or without recomputation) for the time, the memory and each
    weighted sum t + lam m separately, the template layer's ops once per layer the stack
    repeats it, every edge at no cost (edges cost >= 0), plus the mesh's constant buffers."""

    def __init__(self, graph: OpGraph, cm: CostModel, chain: Chain, mesh: Mesh, zero: int,
                 costs: dict[str, OpCosts]) -> None:
        ocs = list(costs.values())
        self.chain = chain
        self.buffers = cm.buffers(mesh, [graph.op(name) for name in costs], zero)
        # every op's configurations, plain and recomputed, end to end (one reduceat per objective)
        self.t = np.concatenate([x for oc in ocs for x in (oc.time, oc.time_rc)])
        self.m = np.concatenate([x for oc in ocs for x in (oc.mem, oc.mem_rc)])
        self.starts = np.cumsum([0] + [2 * len(oc.time) for oc in ocs[:-1]])
        template = set(chain.template)
        self.layers = np.array([chain.reused if name in template else 1 for name in costs], dtype=np.float64)
        self.least_time = float(self.layers @ np.minimum.reduceat(self.t, self.starts))

    def _least(self, lams: np.ndarray) -> np.ndarray:
        """[ops, 2 + len(lams)]: each op's least time, memory and t + lam_j m."""
        return np.minimum.reduceat(np.column_stack([self.t, self.m, self.t[:, None] + lams[None, :] * self.m[:, None]]),
                                   self.starts, axis=0)

    def region(self, lams: np.ndarray) -> ShapeBound:
        """The region holding every plan of the problem: t >= T, m >= M and t + lam_j m >= b_j."""
        total = self.layers @ self._least(lams)
        return ShapeBound(float(total[0]), float(total[1]) + self.buffers, lams, total[2:] + lams * self.buffers)

    def covered(self, envelope: Envelope) -> bool:
        """Whether plans of the envelope beat every plan of the problem (slopes from its steps)."""
        return self.region(envelope_slopes(envelope)).covered(envelope)

    def layer_regions(self, factors: MeshFactors, block: list[Op], lams: np.ndarray) -> Regions:
        """Per boundary configuration, the region holding every plan through it: the ops outside
        the template as in `region`, plus the stack's layers each at the least of the template
        layer's frontier in that configuration (the factors `prepare_mesh` eliminates to it, both
        recomputation choices, min-sum eliminated: factor_graph.least_of)."""
        weights = np.concatenate([[[1.0, 0.0], [0.0, 1.0]], np.stack([np.ones(len(lams)), lams], 1)])
        unit = least_of([factors], block, 1, (self.chain.boundary, self.chain.template[-1]), weights)[0]
        diag = np.arange(unit.shape[0])  # the stack ties each layer's output to the boundary
        rest = (self.layers == 1) @ self._least(lams)
        total = rest[None, :] + self.chain.reused * unit[diag, diag]
        fin = np.all(np.isfinite(total), axis=1)
        return Regions(total[fin, 0], total[fin, 1] + self.buffers, lams, total[fin, 2:] + lams * self.buffers)

    def layer_covered(self, factors: MeshFactors, block: list[Op], envelope: Envelope) -> bool:
        """Whether plans of the envelope beat every region of `layer_regions`."""
        return self.layer_regions(factors, block, envelope_slopes(envelope)).covered(envelope)


@dataclass
class _Beaten:
    """A (mesh, ZeRO stage) whose plans are all beaten by plans already found: no factor graph
    is built for it, and its solution holds no point (`_bounded_problems`)."""

    mesh: Mesh
    zero: int
    op_costs: dict[str, OpCosts]
    buffers: float
    chain: Chain

    def solution(self) -> MeshSolution:
        root = Factor(scope=(), keys=np.zeros((0, 0), dtype=np.int32), t=np.zeros(0), m=np.zeros(0))
        return MeshSolution(mesh=self.mesh, root=root, chain=self.chain, op_costs=self.op_costs, edge_costs={},
                            buffers=self.buffers, stats=Stats(), zero=self.zero)


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

    known: dict[tuple[int, int], bool] = {}

    def beats(i: int, j: int) -> bool:
        # asked twice per pair (once each way round), each a walk over every op's tables
        if (i, j) not in known:
            known[(i, j)] = (tables[i][0] == tables[j][0] and buffers[i] <= buffers[j] * (1 + RTOL)
                             and _no_worse(tables[i][2], tables[j][2]))
        return known[(i, j)]

    return [t for j, t in enumerate(tables)
            if not any(i != j and beats(i, j) and not (i > j and beats(j, i)) for i in range(len(tables)))]


# ---- 5. the coarse pass that bounds the exact one ----------------------------------------------
def _prepass(problems: list[MeshProblem], options: SearchOptions) -> Envelope:
    """Real plans close to the whole frontier, found by a coarse pass over every mesh in a
    fraction of the time; as an envelope they let the main pass drop, on every mesh, the partial
    stacks that cannot win. An exact result stays exact; an approximate one keeps its bound (a
    dropped point is beaten by a real plan, itself near a returned one). Empty when it would not
    pay (no block stack, one mesh) or pruning is off."""
    envelope: Envelope = (np.zeros(0), np.zeros(0))
    if _coarse_pass(options, len(problems)) and any(p.chain for p in problems):
        for prob in problems:
            envelope = _grown(envelope, finish_mesh(prob, PREPASS_EPS, envelope).root)
    return envelope


def _coarse_pass(options: SearchOptions, problems: int) -> bool:
    """Whether the coarse pass runs (given a block stack): pruning on, an exact or finer search
    than the pass, more than one problem."""
    return options.prune and options.eps < PREPASS_EPS and problems > 1


def _grown(envelope: Envelope, root: Factor) -> Envelope:
    return np.concatenate([envelope[0], root.t]), np.concatenate([envelope[1], root.m])


# ---- 6. pipelines ------------------------------------------------------------------------------
def _pipelines(graph: OpGraph, cm: CostModel, solutions: list[Solution], options: SearchOptions,
               counts: dict[str, int]) -> list[Solution]:
    """A frontier per pipeline shape; the plans without a pipeline bound what a pipeline stage
    may cost and still matter. `cm`: the search's cost model, whose Boundaries (the graph's pair
    constraints, a walk of every op's modules) the stage search shares."""
    cluster, job = cm.cluster, cm.job
    known = (np.concatenate([s.root.t for s in solutions]), np.concatenate([s.root.m for s in solutions]))
    if is_multi_stack(graph):  # encoder-decoder: pipelines and accumulation across both stacks
        return list(search_stacks(graph, cluster, job, options.zero_stages, options.recompute, options.allow_async,
                                  options.eps, profile=options.profile, pipelines=options.pipeline,
                                  accumulate=options.accumulate, counts=counts,
                                  envelope=known if options.prune else None, reuse=options.reuse_blocks))
    return list(search_pipelines(graph, cluster, job, options.zero_stages, options.recompute, options.allow_async,
                                 options.eps, profile=options.profile, envelope=known if options.prune else None,
                                 pipelines=options.pipeline, accumulate=options.accumulate, counts=counts,
                                 interleave=options.interleave, bounds=cm.bounds))


# ---- 7. the merged frontier --------------------------------------------------------------------
def _frontier(solutions: list[Solution], eps: float) -> list[FrontierPoint]:
    """The Pareto set over every solution's points, fastest first, each with its plan read back."""
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
        configs, splits = sol.read_back(local[sel])
        for j, g in enumerate(sel):
            points.append(FrontierPoint(time_s=float(t[g]), memory_bytes=float(m[g]), mesh_index=i,
                                        configs=configs, row=j, stages=splits[j]))
    points.sort(key=lambda p: p.time_s)
    return points


def _frontier_size(solutions: list[Solution]) -> int:
    """Points on the frontier of the solutions so far."""
    t = np.concatenate([s.root.t for s in solutions])
    m = np.concatenate([s.root.m for s in solutions])
    ok = (t < INFEASIBLE) & (m < INFEASIBLE)
    return len(pareto_mask(np.zeros(int(ok.sum()), dtype=np.int64), t[ok], m[ok]))


def _stats(graph: OpGraph, solutions: list[Solution], points: list[FrontierPoint], options: SearchOptions
           ) -> dict[str, Any]:
    first_chain = solutions[0].chain if solutions else None
    families = solutions[0].families if solutions and isinstance(solutions[0], MeshSolution) else ()
    return {
        "ops": len(graph.ops),
        "meshes": sorted({s.mesh.describe() for s in solutions}),
        "zero_stages": list(options.zero_stages),
        "recompute": options.recompute and bool(graph.blocks),
        "configurations": {s.mesh.describe(): int(sum(len(oc.configs) for oc in s.op_costs.values())) for s in solutions},
        "max_configs_per_op": max((len(oc.configs) for s in solutions for oc in s.op_costs.values()), default=0),
        "frontier_per_mesh": {s.describe(): int(len(s.root)) for s in solutions},
        "frontier": len(points),
        "largest_factor": max((s.stats.max_factor_points for s in solutions), default=0),
        "pairs_combined": int(sum(s.stats.pairs for s in solutions)),
        "block_reuse": first_chain is not None or bool(families),
        "layers_solved_once": (first_chain.reused if first_chain is not None else 0) + sum(c.reused for c in families),
        "pipeline": options.pipeline,
        "accumulate": options.accumulate,
        "pipeline_shapes": sum(1 for s in solutions if s.pipeline is not None),
        "allow_async_pipeline": options.allow_async,
        "interleave": options.interleave,
        "tensor_2d": options.tensor_2d,
    }


# ---- 4 and 5 on one mesh: the stack by doubling, pruned ----------------------------------------
def finish_mesh(prob: MeshProblem, eps: float = 0.0, envelope: Envelope | None = None,
                prune: bool = True) -> MeshSolution:
    """The frontier on one mesh. `envelope` holds (time, memory) of plans known to exist (other
    meshes' frontiers): they let the stack drop partial plans that cannot win."""
    envelope = envelope if envelope is not None else (np.zeros(0), np.zeros(0))
    stats, domain, factors = prob.stats, prob.domain, list(prob.factors)
    if prob.chain:
        assert prob.unit is not None and prob.outside is not None
        n = prob.chain.reused
        unit, outside = _drop_dominated_boundaries(prob.unit, prob.outside) if prune else (prob.unit, prob.outside)
        bound = _StackBound(unit, outside, n, envelope if prune else None, prob.buffers)
        stack = _chain(bound.prune(unit, 1), n, domain, eps, stats, {}, bound)
        outside = bound.prune(outside, 0, with_outside=True)
        factors = [join(outside, stack, drop=(prob.chain.boundary,), domain=domain, eps=eps, stats=stats)]
    root = eliminate_all(factors, domain, keep=(), eps=eps, stats=stats)
    root = Factor(scope=(), keys=root.keys, t=root.t, m=root.m + prob.buffers, parents=(root,),
                  parent_idx=(np.arange(len(root)),))
    return MeshSolution(mesh=prob.mesh, root=root, chain=prob.chain, op_costs=prob.op_costs,
                        edge_costs=prob.edge_costs, buffers=prob.buffers, stats=stats, zero=prob.zero,
                        families=prob.families)


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


def _covered(a_t: np.ndarray, a_m: np.ndarray, b_t: np.ndarray, b_m: np.ndarray) -> bool:
    """Is every point of frontier A weakly dominated (within RTOL) by some point of B?"""
    return bool(np.all(least_memory(staircase(b_t, b_m), a_t * (1.0 + RTOL)) <= a_m * (1.0 + RTOL)))


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

    def __init__(self, unit: Factor, outside: Factor, n: int, envelope: Envelope | None,
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
        self.env_t, self.env_m = staircase(t[keep], m[keep])
        self._hull_setup(unit, outside, keys)

    # ---- a tighter bound: the remaining layers' convex hull instead of their ideal point -------
    def _hull_setup(self, unit: Factor, outside: Factor, keys: int) -> None:
        """For slopes lam, every completion q of a partial stack satisfies
        q.t + lam * q.m >= R * min_d(d.t + lam * d.m) + min_o(o.t + lam * o.m) (R layers left)."""
        self.hull = HullTest(self.env_t, self.env_m)
        self.w_unit = weighted_least(unit.keys[:, 0], unit.t, unit.m, keys, self.hull.lams)
        self.w_out = weighted_least(outside.keys[:, 0], outside.t, outside.m, keys, self.hull.lams)

    def hull_admit(self, t: np.ndarray, m: np.ndarray, c: np.ndarray, layers: int, with_outside: bool = False) -> np.ndarray:
        """False where every completion allowed by one of the hull constraints is dominated by
        the envelope (hull_bound.py)."""
        r = self.n - layers
        shrink = 1.0 - 2 * RTOL  # a region pulled toward the origin is harder to cover: margin
        t0 = (t + r * self.unit_t[c] + (0.0 if with_outside else self.out_t[c])) * shrink
        m0 = (m + r * self.unit_m[c] + (0.0 if with_outside else self.out_m[c]) + self.buffers) * shrink
        lams = self.hull.lams
        b = ((t[:, None] + lams[None, :] * (m + self.buffers)[:, None] + r * self.w_unit[c]
              + (0.0 if with_outside else self.w_out[c])) * shrink)
        return ~self.hull.beaten(t0, m0, b)

    def admit(self, t: np.ndarray, m: np.ndarray, c: np.ndarray, layers: int, with_outside: bool = False) -> np.ndarray:
        """Which points (of boundary configurations c, covering `layers` layers) may still win."""
        lt = t + (self.n - layers) * self.unit_t[c] + (0.0 if with_outside else self.out_t[c])
        lm = m + (self.n - layers) * self.unit_m[c] + (0.0 if with_outside else self.out_m[c]) + self.buffers
        # the least envelope memory among plans faster by more than RTOL
        env_m = least_memory((self.env_t, self.env_m), lt * (1.0 - RTOL))
        return ~(env_m < lm * (1.0 - RTOL))

    def prune(self, f: Factor, layers: int, with_outside: bool = False) -> Factor:
        if not self.enabled:
            return f
        c = f.keys[:, 0]
        return select(f, np.flatnonzero(self.admit(f.t, f.m, c, layers, with_outside)
                                        & self.hull_admit(f.t, f.m, c, layers, with_outside)))


