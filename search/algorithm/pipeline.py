"""Pipeline parallelism in the search (docs/design.md, Pipelines).

A pipeline plan puts the devices in a pp x dp x tp mesh: the block stack is cut into p stages of
consecutive layers (the ops before the stack go with stage 0, those after it with the last
stage), every stage runs on its own dp x tp sub-mesh with per-op configurations as in FT, and
the global batch runs as m micro-batches under a schedule (search/prices/schedule.py). A shape's
cost tables and the pricing of one pipeline plan live in evaluate.py; this module searches.

Why it stays a frontier search. Fix the pipeline shape (p, m, schedule), the sub-mesh and the
ZeRO stage. Stage s then costs, per iteration,

    T_s = slots * (its ops' per-micro-batch time + its boundary transfers) + its per-iteration step
    M_s = copies * params + grads + optimizer + in_flight(s) * activations of one micro-batch

(slots = m + p - 1, or m for 2BW; copies = 2 for 2BW's double-buffered weights), and both are
still sums over the stage's ops and edges with per-op weights, so FT prices one layer exactly
under each stage's weights. The iteration takes max_s T_s (the slowest stage's slots set the
pace of every slot, and a stage's step follows its last backward) and needs max_s M_s per
device. Stage boundaries come from a DP over layers whose values are frontiers of (max stage
time, max stage memory): F_s(j) = Pareto( union over k of max(F_{s-1}(j - k), S_s(k)) ), where
S_s(k) is stage s holding k layers (the k-fold Minkowski sum of the layer frontier under
stage s's weights) and max(.,.) of two staircases is their pointwise maximum - exact, and
linear in their sizes. The DP holds each F as a staircase of a memory budget (the least time
within it) on the grid of every stage point's memory, so one numpy sweep covers every j. The
middle stages' weights differ only in the micro-batches in flight, so their layer is
eliminated once keeping (time, static memory, activations) Pareto in all three, and each middle
stage's layer frontier is one reduction of it (`_Stages.build`, `middle`).

Gradient accumulation is the same machinery with p = 1: m micro-batches on one stage (m slots,
no bubble), one micro-batch's activations held, gradients summed and synchronised once.

The space searched, and what is left out on purpose:
- p divides the device count, 2 <= p <= the number of layers; the sub-mesh any of
  mesh_candidates over devices / p (every dp x tp, tp inside a node); m any divisor of the
  per-rank batch (global batch / dp) with m >= p: micro-batches down to one sample (m < p is
  mostly bubble, and torch's 1F1B refuses it); p = 1 (accumulation) with m >= 2 and every ZeRO
  stage;
- every stage holds within STAGE_BAND layers of n / p, widened by the layers the ops before
  or after the stack are worth (`band_spread`: identical layers make far-off splits slower at no
  memory gain except to offset the embedding and the head; GPT-2 medium's head is worth 4
  layers, and its best 4-stage splits hold 3 on the last stage);
- ZeRO 0 and 1 only with p >= 2: ZeRO-2/3 shard gradients/parameters that micro-batches
  re-gather every step (DeepSpeed refuses ZeRO-2/3 with pipelines for this reason);
- GPipe is costed (planners, exhaustive reference) but never reaches the frontier: it has
  1F1B's bubble and at least its in-flight activations, so the search proves it dominated and
  skips it; 2BW only with allow_async (1-stale weights);
- the boundary activation's layout is the block stack's tied layout, sent point-to-point in
  that layout (forward activation and backward gradient per micro-batch, on the pp link); it
  is counted in the sending stage's memory; a tied embedding's second copy on the last stage
  is not counted.

Speed, exactly. Every shape is first bounded from its op tables alone (`shape_bound`: edges and
transfers cost >= 0, every op at its cheapest); the shapes are solved in the order of their time
bound, and one whose bounds the plans found so far (without pipelines, earlier shapes) beat is
skipped whole. A shape that passes is then bounded from its end stages (`ends_bounds`): the
least time, memory and weighted sums of the first and last stage's parts, found by min-sum
eliminations of their factors (minsum.py) before any frontier is built, one region per split
of the band's layers between the two ends. Inside a shape, partial stages beaten by a known plan are dropped (`_Envelope`),
and a boundary layout whose DP with the middle stages at their lower bounds (`_Stages.lower`)
finds nothing unbeaten is dropped before the middle stages are weighed - tried first with the
end stages too at lower bounds (their parts' least costs summed, from `ends_bounds`' minima),
so that a shape whose middle stages lose already is dropped before its end stages are solved.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from search.algorithm.chain import Chain, after_stack, find_chain, layer_index
from search.algorithm.context import context_accumulation_shapes
from search.algorithm.evaluate import (
    PipeShape,
    PipeTables,
    Weights,
    mesh_costs,
    micro_batch_graph,
    pipe_tables,
    stage_weights,
    unsupported,
    weigh_op,
    with_edges,
)
from search.algorithm.factor_graph import (
    MeshFactors,
    MeshProblem,
    least_of,
    mesh_factors,
    prepare_mesh,
    stage_parts,
    weighed_like,
)
from search.algorithm.frontier import RTOL, Factor, Stats, assignments, join, least_memory, pareto_mask, select, staircase
from search.algorithm.hull_bound import HullTest, weighted_least
from search.algorithm.interleave import MAX_VIRTUAL_STAGES, sends, to_model_order
from search.algorithm.results import PipeSolution, Split
from search.models.graph import Op, OpGraph
from search.prices.boundaries import Boundaries
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, OpCosts, TrainingJob
from search.prices.mesh import Mesh, MeshAxis, data_ways, mesh_candidates, unplaceable_op
from search.prices.profile import DeviceProfile, ProfileLookup
from search.prices.schedule import ScheduleName

STAGE_BAND = 2
# The baseline planners' grid (search/plans/baselines.py): practitioners' usual stage counts and
# micro-batch counts. The search itself is not limited to it (`pipeline_shapes`).
MAX_STAGES = 16
MICRO_BATCH_FACTORS = (1, 2, 4, 8)  # m = factor * p
PIPELINE_ZERO = (0, 1)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---- shapes ------------------------------------------------------------------------------------
def pipeline_shapes(cluster: Cluster, job: TrainingJob, n_layers: int, zero_stages: tuple[int, ...],
                    allow_async: bool = False, schedules: tuple[ScheduleName, ...] | None = None,
                    pipelines: bool = True, accumulate: bool = False, interleave: bool = False,
                    spread: int = STAGE_BAND) -> list[PipeShape]:
    """Every (p, sub-mesh, ZeRO stage, m, schedule) the search tries: with `pipelines`, every p
    from 2 to the layer count that divides the devices, every dp x tp sub-mesh of the rest, and
    every micro-batch count m >= p whose micro-batch (the per-rank batch / m, down to 1 sample)
    is whole; with `interleave`, also 1F1B interleaved over v virtual stages (`virtual_stages`);
    with `accumulate`, p = 1 with every m >= 2 that divides the per-rank batch (gradient
    accumulation: one stage, no bubble, one micro-batch's activations held). Each stage holds
    within `spread` layers of n / p."""
    schedules = schedules or (("1f1b", "2bw") if allow_async else ("1f1b",))
    shapes = []
    n = cluster.num_devices
    first = 1 if accumulate else 2
    last = min(n, n_layers) if pipelines else 1
    for p in range(first, last + 1):
        if n % p:
            continue
        inner = n // p
        # the stage's sub-mesh lives inside whatever the per-node layout gives it
        sub = cluster.model_copy(update={"num_devices": inner, "devices_per_node": math.gcd(inner, cluster.devices_per_node)})
        for mesh in mesh_candidates(sub):
            mesh = Mesh(pp=p, axes=mesh.axes)
            dp = data_ways(mesh)
            if job.global_batch % dp:
                continue  # each micro-batch splits over the data-parallel ranks
            # m >= p: 1F1B with fewer micro-batches than stages is mostly bubble, and the executor
            # (torch's Schedule1F1B) refuses it; m = 1 on one stage is the search without pipelines
            counts = [m for m in _divisors(job.global_batch // dp) if m >= max(p, 2)]
            for zero in zero_stages:
                if p > 1 and zero not in PIPELINE_ZERO:
                    continue
                for m in counts:
                    for sched in (schedules if p > 1 else ("1f1b",)):  # one stage has no schedule to choose
                        shapes.append(PipeShape(mesh, zero, m, sched, spread=spread))
                        if interleave and sched == "1f1b" and p > 1:  # where the layers cut into chunks
                            shapes += [PipeShape(mesh, zero, m, sched, v, spread)
                                       for v in virtual_stages(n_layers, p, m, spread)]
    return shapes


def virtual_stages(n_layers: int, p: int, m: int, spread: int = STAGE_BAND) -> list[int]:
    """The v > 1 of interleaved 1F1B for p stages and m micro-batches (interleave.py): m a
    multiple of p (Megatron-LM's rounds of one micro-batch per stage), and a split of the layers
    inside the band whose stages each hold a multiple of v."""
    if m % p:
        return []
    out = []
    for v in range(2, MAX_VIRTUAL_STAGES + 1):
        band = stage_band(n_layers, p, v, spread)
        if n_layers % v == 0 and len(band) and p * band.start <= n_layers <= p * (band.stop - 1):
            out.append(v)
    return out


def stage_band(n_layers: int, p: int, v: int = 1, spread: int = STAGE_BAND) -> range:
    """The layer counts a stage may hold: within `spread` of n / p, multiples of v when
    interleaved (its v chunks equal); `start` and `stop - 1` are the fewest and the most."""
    lo = max(1, n_layers // p - spread)
    hi = min(n_layers - (p - 1), -(-n_layers // p) + spread)
    lo, hi = -(-lo // v) * v, hi // v * v
    return range(lo, hi + 1, v)


def band_spread(graph: OpGraph, chain: Chain) -> int:
    """How far a stage may stray from n / p: STAGE_BAND layers, plus as many as the heavier end of
    the stack is worth - the ops before it (on the first stage) or after it (on the last), by
    FLOPs or by parameters, each against one layer - so that the stage search can balance them."""
    tail = after_stack(graph, chain)
    in_stack = {n for layer in chain.layers for n in layer}
    layer = [graph.op(n) for n in chain.template]

    def worth(ops: list[Op]) -> float:
        flops = sum(op.flops for op in ops) / max(sum(op.flops for op in layer), 1.0)
        params = sum(p.numel for op in ops for p in op.params) / max(sum(p.numel for op in layer for p in op.params), 1)
        return max(flops, params)

    head = [op for op in graph.ops if op.name not in in_stack and op.name not in tail]
    return STAGE_BAND + math.ceil(max(worth(head), worth([graph.op(n) for n in tail])))


def partitions(n_layers: int, p: int, v: int = 1, spread: int = STAGE_BAND) -> list[tuple[int, ...]]:
    """Every split of n layers into p stages inside the band (for the exhaustive reference)."""
    band = list(stage_band(n_layers, p, v, spread))
    out: list[tuple[int, ...]] = []

    def rec(prefix: tuple[int, ...], left: int) -> None:
        if len(prefix) == p - 1:
            if left in band:
                out.append(prefix + (left,))
            return
        for k in band:
            if k < left:
                rec(prefix + (k,), left - k)

    rec((), n_layers)
    return out


# ---- the stage DP ------------------------------------------------------------------------------
def _staircase_of(f: Factor, b: int, add_t: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points of f for boundary configuration b, sorted by time (memory then decreases)."""
    sel = np.flatnonzero(f.keys[:, 0] == b)
    order = sel[np.argsort(f.t[sel], kind="stable")]
    return f.t[order] + add_t, f.m[order], order


class _Envelope:
    """Plans known to exist (time, memory). Every cost is non-negative and a pipeline takes the
    max over its stages, so a partial stage point (t, m) ends in plans with time >= t and
    memory >= m + buffers: if a known plan is no worse in both, the partial point can go (exact)."""

    def __init__(self, t: np.ndarray, m: np.ndarray, buffers: float,
                 floor: tuple[float, float] | Callable[[], tuple[float, float]] = (0.0, 0.0),
                 stair: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """`floor`: no plan of the shape is faster or leaner than this, or how to find it when
        first asked (most shapes are dropped by their end stages' bounds before any admit
        test); `stair`: the known plans' staircase (`_stair`), where the caller has it."""
        self.stair = _steps(stair if stair is not None else _stair((t, m)))
        self.buffers = buffers
        self._floor = floor
        self.enabled = len(t) > 0
        self._hull: HullTest | None = None
        self._floored: tuple[tuple[np.ndarray, np.ndarray], float] | None = None

    def floor(self) -> tuple[float, float]:
        if callable(self._floor):
            self._floor = self._floor()
        return self._floor

    def admit(self, t: np.ndarray, m: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return np.ones(len(t), dtype=bool)
        if self._floored is None:
            # the staircase looked up at max(t, floor time) without the max: its steps before the
            # floor time folded into one from -inf (the same step for every query)
            floor_t, floor_m = self.floor()
            st, sm = self.stair
            i = int(np.searchsorted(st, floor_t, side="right"))
            self._floored = ((np.r_[-np.inf, st[i:]], sm[i - 1:]) if i else (st, sm)), floor_m
        stair, floor_m = self._floored
        return least_memory(stair, t) > np.maximum(m + self.buffers, floor_m) * (1.0 + RTOL)

    def prune(self, f: Factor) -> Factor:
        if not self.enabled:
            return f
        return select(f, np.flatnonzero(self.admit(f.t, f.m)))

    def join(self, a: Factor, b: Factor, domain: dict[str, int], eps: float, stats: Stats,
             rest: _Rest | None = None) -> Factor:
        """a + b, less what the envelope refuses; with `rest`, a partial sum's points are judged
        with the least that completes them added (`admit_completed`)."""
        if not self.enabled:
            return join(a, b, domain=domain, eps=eps, stats=stats)
        if rest is None:
            # `admit` refuses (t, m) only if it refuses every costlier point: it bounds whole rows too
            return join(a, b, domain=domain, eps=eps, stats=stats, admit=lambda t, m, keys: self.admit(t, m),
                        bound=self.admit)
        least_t, least_m = float(rest.t.min()), float(rest.m.min())  # what any configuration adds at least
        return join(a, b, domain=domain, eps=eps, stats=stats,
                    admit=lambda t, m, keys: self.admit_completed(t, m, keys[:, 0], rest),
                    bound=lambda t, m: self.admit((t + least_t) * _SHRINK, (m + least_m) * _SHRINK))

    def admit_completed(self, t: np.ndarray, m: np.ndarray, b: np.ndarray, rest: _Rest) -> np.ndarray:
        """`admit` for partial sums of a one-stage plan in boundary configurations b, each of
        which completes to plans that cost at least it plus rest (per configuration: the least
        time and the least memory of the parts still to add, `_Completion.rest`). Costs add up
        on one stage, so those plans lie above the sum: if the envelope beats the sum, it beats
        them all (exact; the sum pulled toward the origin by 2 RTOL, a margin for rounding)."""
        return self.admit((t + rest.t[b]) * _SHRINK, (m + rest.m[b]) * _SHRINK)

    def hull(self) -> HullTest:
        """The convex-hull test against the known plans (hull_bound.py), made when first asked."""
        if self._hull is None:
            self._hull = HullTest(*self.stair)
        return self._hull

    def prune_completed(self, f: Factor, rest: _Rest) -> Factor:
        """f's points that `admit_completed` admits and whose completions - which also lie above
        the parts' convex hulls (`rest.w`) - the known plans do not all beat (hull_bound.py):
        after a join, where its pairs passed the cheaper corner test alone (exact)."""
        if not self.enabled:
            return f
        c = f.keys[:, 0]
        keep = np.flatnonzero(self.admit_completed(f.t, f.m, c, rest))
        hull = self.hull()
        lams = hull.lams
        if len(lams) and len(keep):
            t, m, c = f.t[keep], f.m[keep] + self.buffers, c[keep]
            floor_t, floor_m = self.floor()
            t0 = np.maximum(t + rest.t[c], floor_t) * _SHRINK
            m0 = np.maximum(m + rest.m[c], floor_m) * _SHRINK
            b = (t[:, None] + lams[None, :] * m[:, None] + rest.w[c]) * _SHRINK
            keep = keep[~hull.beaten(t0, m0, b)]
        return select(f, keep)


def _steps(stair: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A staircase (`staircase`) reduced to the points where its least memory drops: the same
    `least_memory` for every query (the last point at or before a time holds the least memory
    of the last drop at or before it), looked up among far fewer points (the known plans
    gather every mesh's and shape's frontier: mostly points another beats)."""
    st, sm = stair
    drops = np.flatnonzero(np.r_[True, sm[1:] < sm[:-1]]) if len(sm) else np.zeros(0, dtype=np.int64)
    return st[drops], sm[drops]


class _Rest(NamedTuple):
    """Per boundary configuration (rows), what is still to add to a partial plan at least: its
    least time, its least memory and, per slope of the known plans' hull test (columns of w),
    its least t + lam m."""

    t: np.ndarray
    m: np.ndarray
    w: np.ndarray

_SHRINK = 1.0 - 2 * RTOL


class _Completion:
    """A one-stage shape's plans (gradient accumulation) are sums: the ops before the stack with
    layer 0 (the head), n - 1 more layers and the ops after the stack (the tail), under one
    weighting. So a partial sum in boundary configuration b ends in plans costing at least it
    plus, per part still to add, that part's least time, least memory and least t + lam m for
    each of the hull test's slopes `lams` in b (a layer's once per layer): far tighter than the
    stage alone, which is all a pipeline's stage tells."""

    def __init__(self, head: Factor, unit: Factor, tail: Factor, layers: int, lams: np.ndarray) -> None:
        configs = 1 + int(max(f.keys[:, 0].max(initial=0) for f in (head, unit, tail)))
        self.head, self.unit, self.tail = (self._least(f, configs, lams) for f in (head, unit, tail))
        self.layers = layers  # after layer 0 (the head's)

    @staticmethod
    def _least(f: Factor, configs: int, lams: np.ndarray) -> _Rest:
        """Per boundary configuration, f's least time, least memory and least weighted sums (inf
        where it has none)."""
        t, m = np.full(configs, np.inf), np.full(configs, np.inf)
        np.minimum.at(t, f.keys[:, 0], f.t)
        np.minimum.at(m, f.keys[:, 0], f.m)
        return _Rest(t, m, weighted_least(f.keys[:, 0], f.t, f.m, configs, lams))

    def rest(self, layers: int, head: bool = False, tail: bool = False) -> _Rest:
        """What completes a partial sum of `layers` of the n - 1 layers (and the head, the tail
        where it holds them): the least of each part still missing."""
        left = self.layers - layers
        parts = [_Rest(left * self.unit.t, left * self.unit.m, left * self.unit.w)] if left else []
        parts += [] if head else [self.head]
        parts += [] if tail else [self.tail]
        if not parts:
            return _Rest(np.zeros_like(self.unit.t), np.zeros_like(self.unit.m), np.zeros_like(self.unit.w))
        return _Rest(*(np.sum([p[i] for p in parts], axis=0) for i in range(3)))


class _Powers:
    """U^k, the k-layer Minkowski powers of one layer factor, built on demand and memoised. With
    a `completion` (a one-stage shape), every power is pruned by what completes it."""

    def __init__(self, unit: Factor, domain: dict[str, int], eps: float, stats: Stats, env: _Envelope,
                 completion: _Completion | None = None) -> None:
        self.domain, self.eps, self.stats, self.env = domain, eps, stats, env
        self.completion = completion
        self.memo: dict[int, Factor] = {1: env.prune(unit) if completion is None
                                        else env.prune_completed(unit, completion.rest(1))}

    def __call__(self, k: int) -> Factor:
        if k not in self.memo:
            half = self(k // 2)
            rest = self.completion.rest(k) if self.completion is not None else None
            f = self.env.join(half, self(k - k // 2), self.domain, self.eps, self.stats, rest)
            f.layers = k  # before the pruning: the read-back splits the join's layers by it
            if rest is not None:  # the pairs passed the corner test: now the hull's
                f = self.env.prune_completed(f, rest)
            self.memo[k] = f
        return self.memo[k]


def _floor(tables: PipeTables) -> tuple[float, float]:
    """A lower bound on the iteration time and peak memory of every plan of a shape: the slowest
    stage takes at least the average of all stages, every op costs at least its cheapest
    configuration (the leanest stage weights for memory) and every edge at least nothing."""
    shape = tables.shape
    weights = stage_weights(shape.stages, shape.micro_batches, shape.schedule, shape.virtual_stages)
    lean = min(weights, key=lambda w: (w.inflight, w.copies))
    # layers 2.. share the template's table objects: weigh each distinct table once
    uses: dict[int, tuple[OpCosts, int]] = {}
    for oc in tables.op_costs.values():
        uses[id(oc)] = (oc, uses[id(oc)][1] + 1 if id(oc) in uses else 1)
    t = m = 0.0
    for oc, k in uses.values():
        w = weigh_op(oc, lean)
        t += k * float(min(w.time.min(), w.time_rc.min()))
        m += k * float(min(w.mem.min(), w.mem_rc.min()))
    # edges cost >= 0 and are left out: the stage search's tables come without them (`pipe_tables`)
    return t / shape.stages, m / shape.stages + tables.buffers


class _Stages:
    """S(s, k): stage s holding k consecutive layers, as a factor over the boundary
    configuration - the layer frontier under stage s's weights to the k-th Minkowski power, with
    the ops before the stack (and layer 0) on stage 0 and those after it on the last stage.
    Built on demand and memoised; every join drops what the envelope proves cannot win. The
    end stages' problems (`ends`, `head`, `tail`) may come after the middle stages' powers
    (`set_ends`): `build` first tries the middle stages against the end stages' least costs."""

    def __init__(self, weights: list[Weights], solve: Callable[[Weights], MeshProblem | None],
                 ends: dict[Weights, MeshProblem], head: Factor | None, tail: Factor | None, domain: dict[str, int],
                 eps: float,
                 stats: Stats, env: _Envelope, middle: Callable[[Weights], Factor] | None = None, virtual: int = 1,
                 spread: int = STAGE_BAND, completion: _Completion | None = None) -> None:
        self.weights, self.solve, self.ends, self.head, self.tail = weights, solve, ends, head, tail
        self.completion = completion  # one stage: partial sums pruned by what completes them
        self.middle = middle
        self.domain, self.eps, self.stats, self.env = domain, eps, stats, env
        self.powers: dict[Weights, _Powers] = {}
        self.cache: dict[tuple[int, int], Factor] = {}
        self.spread = spread  # a stage holds within this many layers of n / p
        self.virtual = virtual  # virtual stages (interleaved 1F1B), and the boundaries each stage sends across
        self.sends = [sends(s, len(weights), virtual) for s in range(len(weights))]
        # the boundary configurations not yet proven dead (`build`'s test with the end stages at
        # their least costs); None: every one
        self.live: list[int] | None = None
        # `_split_layers`' admitted points of a stage factor (by identity: kept alive by the memos
        # above) per boundary configuration and transfer, shared by its passes over a layout
        self.admitted: dict[tuple[int, int, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def set_ends(self, ends: dict[Weights, MeshProblem], head: Factor, tail: Factor) -> None:
        """The end stages' problems and their parts before and after the stack, solved."""
        self.ends, self.head, self.tail = ends, head, tail

    @classmethod
    def build(cls, graph: OpGraph, cm: CostModel, tables: PipeTables, eps: float, recompute: bool,
              env: _Envelope, envelope: tuple[np.ndarray, np.ndarray] | None = None,
              plans: _Known | None = None) -> _Stages | None:
        """One factor graph per distinct stage weighting (FT's per-mesh problem, its ops weighed
        here and its edges by prepare_mesh): the last stage's and the first stage's, the others
        when the stage DP first asks for them; None if the stack cannot be solved as one layer
        or, with an `envelope` of known plans, if they beat every plan of the shape judged from
        its end stages (`_ends_beaten`). That judgement needs only the least time, memory and
        weighted sums of the end stages' parts (min-sum eliminations, `MeshFactors.least`), so a
        losing shape is dropped before any frontier of it is built. Then, with more than three
        stages, the lower DP of every boundary layout with the end stages at those least costs
        (`_split_layers`' corners): the layouts it leaves are the returned stages' `live`, and
        none left drops the shape before its end stages are solved. `plans`: `_known(envelope)`,
        where the caller has it."""
        shape, chain = tables.shape, tables.chain
        weights = stage_weights(shape.stages, shape.micro_batches, shape.schedule, shape.virtual_stages)
        sub = Mesh(pp=1, axes=shape.mesh.axes)
        first, last = weights[0], weights[-1]
        known = (chain, tables.tail)
        fgs: dict[Weights, MeshFactors] = {}
        # what only the micro-batches in flight tell apart (every stage of a 1F1B pipeline): their
        # factors are the ones with no micro-batch in flight, activations kept apart, weighed
        bare = Weights(first.slots, first.copies, 0.0)
        bare_fgs: list[MeshFactors] = []

        def bare_factors() -> MeshFactors:
            """The factors with no micro-batch in flight, activations apart, made once (eps as the
            stage solves'; the middle stages' layer, solved exactly, shares them when eps is 0)."""
            if not bare_fgs:
                weighted = {name: weigh_op(oc, bare) for name, oc in tables.own_costs.items()}
                act = {name: (oc.parts[:, 3], oc.parts_rc[:, 3]) for name, oc in tables.own_costs.items()}
                bare_fgs.append(MeshFactors(graph, cm, sub, weighted, layer_index(graph) if recompute else {}, chain,
                                            eps, bare, activations=act))
            return bare_fgs[0]

        def factors(w: Weights) -> MeshFactors:
            """Stage weighting w's factors, made once for its bound and its solve."""
            if w not in fgs:
                weighted = {name: weigh_op(oc, w) for name, oc in tables.own_costs.items()}
                if len(weights) > 1 and (w.slots, w.copies) == (bare.slots, bare.copies) and w.inflight >= 1.0:
                    fgs[w] = weighed_like(bare_factors(), weighted, w)
                else:
                    fgs[w] = mesh_factors(graph, cm, sub, eps, recompute, weighted, w, chain)
            return fgs[w]

        uses_middle = all((w.slots, w.copies) == (bare.slots, bare.copies) for w in weights)
        # with middle stages to solve (exactly), the end stages' layer is that one elimination
        # weighed too: a reduction each instead of an elimination each, the same frontier
        ends_from_middle = uses_middle and len(weights) > 2 and eps == 0.0

        def solve(w: Weights, head: bool = False) -> MeshProblem | None:
            prob = prepare_mesh(graph, cm, sub, True, eps, shape.zero, recompute,
                                split_outside=(head or w == first, w == last), edge_weights=w, known=known,
                                factors=factors(w), unit=not ends_from_middle)
            if ends_from_middle:
                prob.unit = middle(w)
            return prob if prob.unit is not None else None

        # The middle stages differ only in the micro-batches in flight: every stage's memory is
        # static + inflight * activations, its time the same. One elimination of the layer keeping
        # (time, static, activations) Pareto in all three holds, for every inflight >= 0, the
        # layer's frontier under that weighing (a point beaten in all three components is beaten
        # under every weighing): each middle stage then costs one reduction instead of a solve.
        layer3: list[Factor] = []

        def middle(w: Weights) -> Factor:
            assert (w.slots, w.copies) == (bare.slots, bare.copies) and w.inflight >= 0
            if not layer3:
                if eps == 0.0:
                    prob = prepare_mesh(graph, cm, sub, True, 0.0, shape.zero, recompute,
                                        split_outside=(False, False), edge_weights=bare, known=known,
                                        factors=bare_factors())
                else:
                    fg = bare_factors()
                    prob = prepare_mesh(graph, cm, sub, True, 0.0, shape.zero, recompute, fg.op_costs,
                                        split_outside=(False, False), edge_weights=bare, known=known,
                                        activations=fg.activations)
                assert prob.unit is not None and prob.unit.m2 is not None  # the ends solved it as one layer
                layer3.append(prob.unit)
            u = layer3[0]
            assert u.m2 is not None
            m = u.m + w.inflight * u.m2
            keep = pareto_mask(u.keys[:, 0].astype(np.int64), u.t, m, eps)
            return Factor(scope=u.scope, keys=u.keys[keep], t=u.t[keep], m=m[keep], parents=(u,), parent_idx=(keep,),
                          layers=1)

        # from the cheapest test to the dearest: every op at its cheapest with no edge (no factor
        # built: most shapes that get here lose on it already), then the layer's least alone
        # (the ends' other ops at their cheapest configurations: the stack's layers outweigh
        # them), then the end stages' full minima; each later test is no weaker
        if envelope is None or not len(envelope[0]):
            plans = None
        elif plans is None:
            plans = _known(envelope)
        layer_units: list[tuple[np.ndarray, np.ndarray]] = []
        end_leasts: list[EndLeast] = []  # the third test's minima, for the test after it

        def units(lams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """The layer's minima at the known plans' slopes, found once for the last two tests."""
            if not layer_units:
                layer_units.append(_layer_units(graph, tables, factors(first), factors(last), lams))
            return layer_units[0]

        def end_least(lams: np.ndarray) -> EndLeast:
            end_leasts.append(_end_least(graph, tables, factors(first), factors(last), lams, units(lams)))
            return end_leasts[-1]

        if envelope is not None and plans is not None and (
                _ends_beaten(tables, weights, lambda lams: _op_least(graph, tables, first, last, lams), envelope, plans)
                or _ends_beaten(tables, weights, lambda lams: _layer_least(graph, tables, (factors(first), first),
                                                                        (factors(last), last), lams, units(lams)),
                                envelope, plans)
                or _ends_beaten(tables, weights, lambda lams: end_least(lams), envelope, plans)):
            return None
        probe: _Stages | None = None
        if end_leasts and env.enabled and len(weights) > 3:
            # a deeper test before the end stages are solved: the lower DP (`_split_layers`) with
            # the middle stages at their ladder's powers and the end stages at their least costs
            # (the third test's minima, summed); a boundary layout it proves dead stays dead
            probe = cls(weights, solve, {}, None, None, factors(first).domain, eps, Stats(), env,
                        middle if uses_middle else None, shape.virtual_stages, shape.spread)
            least = end_leasts[0]
            probe.live = [b for b in np.flatnonzero(np.isfinite(least.head[:, 0])).tolist()
                          if _split_layers(probe, b, len(chain.layers), tables.p2p, eps, lower=True,
                                           corners=least) is not None]
            if not probe.live:
                return None
        lp = solve(last)
        if lp is None:
            return None
        ends: dict[Weights, MeshProblem] = {last: lp}
        if first != last:
            fp = solve(first)
            if fp is None:
                return None
            ends[first] = fp
        domain = ends[first].domain
        head, tail = ends[first].head, ends[last].tail
        assert head is not None and tail is not None
        if probe is not None:  # its middle stages' powers kept
            assert probe.domain is domain
            probe.set_ends(ends, env.prune(head), env.prune(tail))
            return probe
        if len(weights) > 1 or not env.enabled:
            return cls(weights, solve, ends, env.prune(head), env.prune(tail), domain, eps, Stats(), env,
                       middle if uses_middle else None, shape.virtual_stages, shape.spread)
        unit = ends[last].unit
        assert unit is not None
        done = _Completion(head, unit, tail, len(chain.layers) - 1, env.hull().lams)
        return cls(weights, solve, ends, env.prune_completed(head, done.rest(0, head=True)),
                   env.prune_completed(tail, done.rest(0, tail=True)), domain, eps, Stats(), env,
                   middle if uses_middle else None, shape.virtual_stages, shape.spread, done)

    def power(self, w: Weights) -> _Powers:
        """The k-layer powers of the layer frontier under weights w (its problem solved once)."""
        if w not in self.powers:
            if w in self.ends or self.middle is None:
                prob = self.ends.get(w) or self.solve(w)
                assert prob is not None and prob.unit is not None  # the stack solved as one layer under the ends
                unit = prob.unit
            else:
                unit = self.middle(w)
            self.powers[w] = _Powers(unit, self.domain, self.eps, self.stats, self.env, self.completion)
        return self.powers[w]

    def layer_floor(self, b: int) -> tuple[float, float]:
        """The least time and the least memory of one layer in boundary configuration b, over
        every stage (time weighs alike on every stage; memory least on the last, whose
        micro-batches in flight are fewest)."""
        unit = self.ends[self.weights[-1]].unit
        assert unit is not None
        sel = unit.keys[:, 0] == b
        return (float(unit.t[sel].min()), float(unit.m[sel].min())) if sel.any() else (np.inf, np.inf)

    def lower_weights(self, s: int) -> Weights:
        """Weights no heavier than stage s's in any factor, from a ladder shared by the middle
        stages: the same slots and weight copies, the micro-batches in flight rounded down to a
        power of two. Every assignment costs no more under them (all costs are non-negative
        and scale up with the weights), so the ladder's few layer problems bound all p - 2
        middle stages from below; the rungs are mostly stages' own weights (1F1B's middle
        stages hold 2 .. p - 1 micro-batches), solved once for both."""
        w = self.weights[s]
        if w.inflight < 1:
            return w
        return Weights(w.slots, w.copies, float(2 ** math.floor(math.log2(w.inflight))))

    def lower(self, s: int, k: int) -> Factor:
        """A lower bound on stage s holding k layers: for a middle stage the k-th power of the
        layer under `lower_weights`, else the stage itself."""
        if 0 < s < len(self.weights) - 1:
            w = self.lower_weights(s)
            return self(s, k) if w == self.weights[s] else self.power(w)(k)
        return self(s, k)

    def __call__(self, s: int, k: int) -> Factor:
        if (s, k) not in self.cache:
            self.cache[(s, k)] = self._stage(s, k)
        return self.cache[(s, k)]

    def _stage(self, s: int, k: int) -> Factor:
        """Stage s holding k layers (stage 0 counts layer 0, which the head carries)."""
        w, env = self.weights[s], self.env
        if s == 0:
            assert self.head is not None
            # one stage holds every layer: the head and the n - 1 others still miss the tail
            rest = self.completion.rest(k - 1, head=True) if self.completion is not None else None
            f = self.head if k == 1 else env.join(self.head, self.power(w)(k - 1), self.domain, self.eps, self.stats,
                                                  rest)
            if rest is not None and k > 1:
                f = env.prune_completed(f, rest)
        else:
            f = self.power(w)(k)
        if s == len(self.weights) - 1:
            assert self.tail is not None
            f = env.join(f, self.tail, self.domain, self.eps, self.stats)
        return f

    def boundary_configs(self) -> list[int]:
        assert self.head is not None
        return [int(b) for b in np.unique(self.head.keys[:, 0]) if self.live is None or b in self.live]


# the DP's answer: the points of every split (time, memory, per point the (layers, index in
# S(s, layers)) of every stage), sorted by time
_State = tuple[np.ndarray, np.ndarray, list[list[tuple[int, int]]]]


def _admitted_points(f: Factor, env: _Envelope, b: int, extra_t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points of the stage factor f in boundary configuration b, plus `extra_t`, that the
    envelope admits."""
    st, sm, idx = _staircase_of(f, b, extra_t)
    ok = env.admit(st, sm)
    return st[ok], sm[ok], idx[ok]


class _ByMemory:
    """A stage's points sorted by memory, with the least time within each point's memory (the
    running min): what `_OnGrid` looks up, once per points whatever the grid; which point gives
    it, and its memory, found when the read-back first asks (a lower pass never does)."""

    def __init__(self, st: np.ndarray, sm: np.ndarray, idx: np.ndarray) -> None:
        self.by_m = np.argsort(sm, kind="stable")
        self.m, self.t = sm[self.by_m], st[self.by_m]
        self.run = np.minimum.accumulate(self.t)
        self.idx, self.sm = idx, sm

    @functools.cached_property
    def giver(self) -> np.ndarray:
        """Per point in memory order, the point (its place in the stage's points) that sets the
        running min there: the last at or before it whose time beats every leaner one's."""
        new = np.ones(len(self.t), dtype=bool)
        new[1:] = self.t[1:] < self.run[:-1]
        return self.by_m[np.maximum.accumulate(np.where(new, np.arange(len(self.t)), 0))]


class _OnGrid:
    """A stage's points as the DP reads them on a grid of memory budgets: the least time within
    each budget (inf below the leanest point); `which` and `memory`: the point that gives it at
    some budgets (columns of the grid), its index and its memory."""

    def __init__(self, pts: _ByMemory, grid: np.ndarray) -> None:
        at = np.searchsorted(pts.m, grid, side="right") - 1
        self.at = np.maximum(at, 0)
        self.f = np.where(at >= 0, pts.run[self.at], np.inf)
        self.pts = pts

    def which(self, cols: np.ndarray) -> np.ndarray:
        return self.pts.idx[self.pts.giver[self.at[cols]]]

    def memory(self, cols: np.ndarray) -> np.ndarray:
        return self.pts.sm[self.pts.giver[self.at[cols]]]


def _run_key(S: _Stages, s: int) -> tuple[Weights, int]:
    """What prices middle stage s in the lower DP: its rung of the ladder (`_Stages.lower`,
    the slots within) and the boundaries it sends across (its transfer). Stages with one key
    have the very same points for every layer count."""
    return S.lower_weights(s), S.sends[s]


@functools.lru_cache(maxsize=4096)
def _run_sums(ks: tuple[int, ...], r: int, mask: int) -> np.ndarray:
    """Which totals r layer counts from the members of ks in `mask` (bit i: ks[i]) can make,
    repeats allowed: entry t says whether r * ks[0] + t is one."""
    offsets = [k - ks[0] for i, k in enumerate(ks) if mask >> i & 1]
    made = 1  # bit t: the total r * ks[0] + t is made (shifts of a Python int: a small bitset)
    for _ in range(r):
        made = functools.reduce(lambda a, b: a | b, (made << o for o in offsets))
    out = np.array([bool(made >> t & 1) for t in range(r * (ks[-1] - ks[0]) + 1)])
    out.flags.writeable = False  # shared through the cache
    return out


def _collapsed_run(F: np.ndarray, g: np.ndarray, ks: list[int], r: int, lo: int, hi: int) -> np.ndarray:
    """r stages alike taken at once: N(j, M) = min over r layer counts k_i from ks summing to d
    of max(F(j - d, M), max_i g_{k_i}(M)), for the states lo <= j <= hi (inf elsewhere); F the
    states before (rows: layers covered, columns: memory budgets), g[i] the stages' staircase
    holding ks[i] layers on the same budgets.

    Exactly what r steps of the DP give, without their admit tests in between (those only drop
    states that end in beaten plans): a stage step takes the min over k of a max, and min and
    max are exact in any order and grouping. Per budget M, sort the k by g_k(M): the max over a
    choice of counts is the g of its last in that order, so the least max for a total d is the
    least threshold tau = g_(t)(M) whose prefix {k: first t+1 in that order} makes d from r
    counts (`_run_sums`) - a prefix holds every k priced at most tau, and a choice whose max is
    tau draws from it. Ties need no care: a later k of equal g gives the same threshold."""
    n1 = F.shape[0]
    N = np.full_like(F, np.inf)
    lo, hi = max(lo, r * ks[0]), min(hi, n1 - 1)
    if lo > hi:
        return N
    if r == 1:
        P, d = g, np.array(ks)
    else:
        order = np.argsort(g, axis=0, kind="stable")
        tau = np.take_along_axis(g, order, axis=0)
        masks = np.cumsum(np.left_shift(1, order), axis=0)  # the prefixes as bit sets (distinct bits)
        uniq, inv = np.unique(masks.ravel(), return_inverse=True)
        made = np.array([_run_sums(tuple(ks), r, int(u)) for u in uniq])[inv.reshape(masks.shape)]
        P = np.where(made, tau[:, :, None], np.inf).min(axis=0).T  # (totals, budgets)
        d = r * ks[0] + np.arange(len(P))
        some = np.flatnonzero(np.isfinite(P).any(axis=1) & (d <= hi))
        P, d = P[some], d[some]
    src = np.arange(lo, hi + 1)[:, None] - d[None, :]  # the state before, per (state after, total)
    before = np.where((src >= 0)[:, :, None], F[np.maximum(src, 0)], np.inf)
    N[lo:hi + 1] = np.maximum(before, P[None, :, :]).min(axis=1, initial=np.inf)
    return N


def _split_layers(S: _Stages, b: int, n: int, p2p: np.ndarray, eps: float, lower: bool = False,
                  corners: EndLeast | None = None) -> _State | None:
    """The frontier of (max stage time, max stage memory) over every split of the n layers into
    the stages, the boundary in configuration b: F_i(j) = Pareto(union over k of
    max(F_{i-1}(j - k), S(s_i, k))), states j = layers covered by the first i stages taken. The
    layers are identical, so a stage's cost depends on its position and its layer count only
    and the stages may be taken in any order: the first and the last (solved before the DP, and
    the most loaded: the ops around the stack, the most micro-batches in flight) come first, so
    a shape whose end stages already lose dies before its middle stages are solved. Partial
    splits a known plan beats are dropped (the later stages only raise the max). Each point's
    (layers, index) per stage comes back in stage order. None if no split survives.

    With `lower`, the middle stages are priced by their lower bounds (`_Stages.lower`): few
    middle stages are solved, and every split's true point is weakly dominated by a point of
    the result, so None proves that no split through b survives the envelope. Only that
    matters there, so nothing is read back (each point is a budget and the least time within
    it, with no stages: the last step's test admitted exactly those), and a run of middle
    stages on one rung is taken in one step (`_collapsed_run`): the same None, as the DP
    finds a split iff some split of the bounds (each stage a point it admits) has its max
    point admitted - every test on the way is a valid lower-bound test, passed by such a
    split's states whatever the grid and whichever steps test them.

    With `corners` (and `lower`), the end stages too are priced by lower bounds: stage s holding
    k layers by one point, the least time and the least memory of its parts summed (EndLeast:
    every point of the stage costs at least that in both), pulled toward the origin by 2 RTOL
    for the order of float sums - no end stage need be solved, and None proves as above."""
    weights = S.weights
    p = len(weights)
    band = stage_band(n, p, S.virtual, S.spread)
    order = [0, p - 1, *range(1, p - 1)] if p > 1 else [0]
    # The DP runs on staircase functions of a memory budget M: F(j, M) = least max stage time of
    # the stages taken so far, covering j layers, with every stage's memory <= M. Then the max
    # of two staircases is their pointwise max and a union their pointwise min, exactly, on the
    # grid of every memory a stage point has (the max memory of a split is one of them); one
    # numpy sweep per (stage, layers) covers every state at once.
    grid = np.zeros(1)
    F = np.full((n + 1, 1), np.inf)
    F[0, 0] = 0.0
    live = [0]  # the states with a finite F, ascending
    # per i: the fewest boundaries a stage taken i-th or later sends
    least_sends = list(itertools.accumulate([S.sends[q] for q in reversed(order)], min))[::-1]
    steps: list[tuple[np.ndarray, np.ndarray, dict[int, _OnGrid]]] = []
    # a layer's least time and least memory (under any stage's weights: the last stage's holds
    # the fewest micro-batches), and what a middle stage sends: bounds on the stages not yet taken
    if corners is None:
        layer_t, layer_m = S.layer_floor(b)
    else:
        layer_t, layer_m = float(corners.ul[b, 0]) * _SHRINK, float(corners.ul[b, 1]) * _SHRINK
    seen: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    by_factor = S.admitted
    # stages alike (the middle stages at one rung of `_Stages.lower`'s ladder: one factor, one
    # transfer) share their points (`S.admitted`: the lower and the full pass too), and those
    # points' staircase on a grid the DP has not grown
    on_grid: dict[tuple[int, int], _OnGrid] = {}

    def points(s: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stage s's points holding k layers as the DP sees them (its transfer added), found once
        per DP (and per pass over a layout: `S.admitted`)."""
        if (s, k) in seen:
            return seen[(s, k)]
        extra_t = weights[s].slots * S.sends[s] * p2p[b]
        if corners is not None and s in (0, p - 1):
            part, unit, layers = (corners.head, corners.u0, k - 1) if s == 0 else (corners.tail, corners.ul, k)
            # (a layer's inf times 0 layers would be nan)
            st = np.array([(part[b, 0] + (layers * unit[b, 0] if layers else 0.0) + extra_t) * _SHRINK])
            sm = np.array([(part[b, 1] + (layers * unit[b, 1] if layers else 0.0)) * _SHRINK])
            ok = S.env.admit(st, sm)
            seen[(s, k)] = (st[ok], sm[ok], np.zeros(int(ok.sum()), dtype=np.int64))
        else:
            f = S.lower(s, k) if lower else S(s, k)  # kept alive by S's memos: its id stays its own
            key = (b, id(f), float(extra_t))
            if key not in by_factor:
                by_factor[key] = _admitted_points(f, S.env, b, extra_t)
            seen[(s, k)] = by_factor[key]
        return seen[(s, k)]

    by_memory: dict[int, _ByMemory] = {}

    def staircase_on(pts: tuple[np.ndarray, np.ndarray, np.ndarray], grid: np.ndarray) -> _OnGrid:
        key = (id(pts[0]), id(grid))  # both held for the whole DP (`by_factor`, `steps`)
        if key not in on_grid:
            if key[0] not in by_memory:
                by_memory[key[0]] = _ByMemory(*pts)
            on_grid[key] = _OnGrid(by_memory[key[0]], grid)
        return on_grid[key]

    i = 0
    while i < p:
        s = order[i]
        # a run of stages alike: in a lower pass, consecutive middle stages on one rung of the
        # ladder with one transfer (`_run_key`) take the same points for every layer count, and
        # are taken in one step (`_collapsed_run`); the full pass takes one stage a step, as its
        # read-back needs every step's choices. The run's inner states need no window of their
        # own: one out of its step's window leaves the run's last step out of reach too
        r = 1
        if lower and 0 < s < p - 1:
            key = _run_key(S, s)
            while i + r < p and _run_key(S, order[i + r]) == key:
                r += 1
        left_after = p - i - r
        # what the stage not yet taken that holds the most layers sends, at least
        send_ahead = weights[0].slots * least_sends[i + r] * p2p[b] if left_after else 0.0
        # the states this stage (run) may lead to: the stages after it must cover the rest in the band
        reach_lo, reach_hi = max(n - left_after * (band.stop - 1), 0), n - left_after * band.start
        stairs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for k in band:
            if r == 1:
                # some live state j with j + k in reach
                if bisect.bisect_left(live, reach_lo - k) >= bisect.bisect_right(live, reach_hi - k):
                    continue
            elif (live[0] + k + (r - 1) * band.start > reach_hi
                  or live[-1] + k + (r - 1) * (band.stop - 1) < reach_lo):
                continue  # no stage of the run can hold k layers on a way into reach
            pts = points(s, k)
            if len(pts[0]):
                stairs[k] = pts
        if not stairs:
            return None
        grid_new = np.unique(np.concatenate([grid] + [sm for _, sm, _ in stairs.values()]))
        if len(grid_new) != len(grid):  # else the same grid: it holds every memory already
            # a staircase holds between grid values; rows out of the live ones stay inf
            at = np.searchsorted(grid, grid_new, side="right") - 1
            F, rows = np.full((n + 1, len(grid_new)), np.inf), F[live[0]:live[-1] + 1]
            F[live[0]:live[-1] + 1] = rows[:, at]
            grid = grid_new
        # the states a live one leads to (F is inf on the others, and so is N)
        lo, hi = max(reach_lo, live[0] + r * min(stairs)), min(reach_hi, live[-1] + r * max(stairs))
        if lower:  # only the values matter: no read-back
            ks = list(stairs)
            g = np.array([staircase_on(stairs[k], grid).f for k in ks])
            N = _collapsed_run(F, g, ks, r, lo, hi)
        else:
            N = np.full_like(F, np.inf)
            K = np.zeros(F.shape, dtype=np.int16)
            # the stage's staircases on the grid: least time within each memory budget, and its point
            picks = {k: staircase_on(pts, grid) for k, pts in stairs.items()}
            for k, on in picks.items():
                # the states in reach that hold k layers or more after a live one
                a, z = max(lo, live[0] + k), min(hi, live[-1] + k)
                if a > z:
                    continue
                cand = np.maximum(F[a - k:z - k + 1], on.f[None, :])
                better = cand < N[a:z + 1]
                np.copyto(N[a:z + 1], cand, where=better)
                K[a:z + 1][better] = k
            steps.append((grid, K, picks))
        F = N
        # the stages not yet taken hold the other n - j layers: one holds at least its share, so
        # the iteration is at least that stage's time and memory; a state a known plan beats at
        # budget M ends in plans it beats (exact)
        reached = N[lo:hi + 1]  # a view: the states this step may have reached
        j = np.arange(lo, hi + 1)
        ahead = -(-(n - j) // left_after) if left_after else np.zeros(len(j), dtype=np.int64)
        fut_t = ahead * layer_t + np.where(ahead > 0, send_ahead, 0.0)
        if S.env.enabled:  # every state at every budget at once (an inf one stays inf, whatever the test says)
            t_at_least = np.maximum(reached, fut_t[:, None])
            reached[~S.env.admit(t_at_least, np.maximum(grid[None, :], (ahead * layer_m)[:, None]))] = np.inf
        live = (np.flatnonzero(np.isfinite(reached).any(axis=1)) + lo).tolist()
        if not live:
            return None  # every partial split is beaten: the stages not yet taken need not be solved
        i += r
    # the frontier: each budget's best split, read back stage by stage at that budget
    last = F[n]
    cols = np.flatnonzero(np.isfinite(last))
    if not len(cols):
        return None
    cols = cols[np.r_[True, last[cols][1:] < last[cols][:-1]]]  # a budget that buys no time adds nothing
    if lower:
        # each budget's least time and the budget itself: no worse than some split's bound point
        # (its time that least time, its memory within the budget), the last step's test passed
        keep = np.sort(pareto_mask(np.zeros(len(cols), dtype=np.int64), last[cols], grid[cols], eps))
        keep = keep[S.env.admit(last[cols][keep], grid[cols][keep])]
        return (last[cols][keep], grid[cols][keep], [[] for _ in keep]) if len(keep) else None
    # every budget at once, stage by stage from the last taken: its layers, its point (index,
    # time, memory) at that budget on the step's grid
    budgets = grid[cols]
    j = np.full(len(cols), n)
    layers, which = np.zeros((p, len(cols)), dtype=np.int64), np.zeros((p, len(cols)), dtype=np.int64)
    out_t, out_m = np.zeros(len(cols)), np.zeros(len(cols))
    for i in range(p - 1, -1, -1):
        g_i, K_i, picks_i = steps[i]
        col = np.searchsorted(g_i, budgets, side="right") - 1
        layers[i] = K_i[j, col]
        counts = set(layers[i].tolist())
        for k in counts:
            sel: np.ndarray | slice = np.flatnonzero(layers[i] == k) if len(counts) > 1 else slice(None)
            on = picks_i[k]
            which[i, sel] = on.which(col[sel])
            out_t[sel] = np.maximum(out_t[sel], on.f[col[sel]])
            out_m[sel] = np.maximum(out_m[sel], on.memory(col[sel]))
        j -= layers[i]
    assert not j.any()
    keep = np.sort(pareto_mask(np.zeros(len(out_t), dtype=np.int64), out_t, out_m, eps))
    keep = keep[S.env.admit(out_t[keep], out_m[keep])]
    if not len(keep):
        return None
    place = np.argsort(order)  # stage s was taken place[s]-th
    return out_t[keep], out_m[keep], [[(int(layers[place[s], a]), int(which[place[s], a])) for s in range(p)]
                                      for a in keep]


def _read_back(S: _Stages, maps: list[dict[str, str]], backs: list[list[tuple[int, int]]]
               ) -> tuple[list[Split], dict[str, np.ndarray]]:
    """Every point's layers per stage and every op's configuration, read back through the
    stage factors' provenance, one batch per (stage, its first layer, its layers)."""
    splits: list[Split] = []
    groups: dict[tuple[int, int, int], tuple[list[int], list[int]]] = {}
    for row, back in enumerate(backs):
        splits.append(tuple(k for k, _ in back))
        first = 0
        for s, (k, i) in enumerate(back):
            rows, idx = groups.setdefault((s, first, k), ([], []))
            rows.append(row)
            idx.append(i)
            first += k
    assigns: dict[str, np.ndarray] = {}
    for (s, first, k), (group_rows, group_idx) in groups.items():
        got = assignments(S(s, k), np.array(group_idx), maps[first - 1:] if s > 0 else maps)
        for name, v in got.items():
            assigns.setdefault(name, np.zeros(len(backs), dtype=np.int64))[group_rows] = v
    return splits, assigns


def solve_shape(graph: OpGraph, cm: CostModel, shape: PipeShape, eps: float = 0.0,
                recompute: bool = True, envelope: tuple[np.ndarray, np.ndarray] | None = None,
                chain: Chain | None = None, base: dict[str, OpCosts] | None = None,
                tables: PipeTables | None = None, known: _Known | None = None) -> PipeSolution | None:
    """The frontier of one pipeline shape over stage boundaries and every op's configuration.
    `graph` and `cm` are the micro-batch graph and its cost model; `envelope` holds (time,
    memory) of plans known to exist, which prune partial stages that cannot win (exact);
    `chain` and `base` as for pipe_tables; `tables`: the shape's pipe_tables (edges=False),
    where the caller made them already; `known`: `_known(envelope)`, where the caller has it
    (the search keeps it while the envelope does not grow)."""
    tables = tables if tables is not None else pipe_tables(graph, cm, shape, chain=chain, base=base, edges=False)
    if tables is None:
        return None
    known_t, known_m = envelope if envelope is not None else (np.zeros(0), np.zeros(0))
    env = _Envelope(known_t, known_m, tables.buffers, (lambda: _floor(tables)) if envelope is not None else (0.0, 0.0),
                    known.stair if known is not None else None)
    S = _Stages.build(graph, cm, tables, eps, recompute, env, envelope, known)
    if S is None:
        return None
    chain = tables.chain
    # per boundary configuration (the stack's tied layout): the best splits into stages
    out_t, out_m, out_b, out_back = [], [], [], []
    live = S.boundary_configs()
    if S.env.enabled and len(S.weights) > 3:
        # first the DP with every middle stage at its lower bound (a ladder of log2 p layer
        # problems): a layout where that finds nothing the known plans do not beat is dead,
        # and the other middle stages' layer problems (one solve per distinct weighting: most
        # of a deep pipeline's cost) are never built for it
        live = [b for b in live if _split_layers(S, b, len(chain.layers), tables.p2p, eps, lower=True) is not None]
    for b in live:
        found = _split_layers(S, b, len(chain.layers), tables.p2p, eps)
        if found is not None:
            out_t.append(found[0])
            out_m.append(found[1])
            out_b += [b] * len(found[0])
            out_back += found[2]
    if not out_t:
        return None
    t = np.concatenate(out_t)
    mem = np.concatenate(out_m) + tables.buffers
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, mem, eps)
    backs = [out_back[g] for g in keep]
    splits: list[Split] = [tuple(k for k, _ in back) for back in backs]
    boundary = np.array(out_b, dtype=np.int64)[keep]
    maps = chain.layer_maps()

    def reader(rows: np.ndarray) -> dict[str, np.ndarray]:
        """The points `rows`' configurations, read back through the stage factors' provenance
        (each point's read alone of the others: any rows, the same answer)."""
        _, assigns = _read_back(S, maps, [backs[int(r)] for r in rows])
        assigns = to_model_order(assigns, chain, [splits[int(r)] for r in rows], shape.virtual_stages)
        for layer in chain.layers:  # every layer's output takes the tied boundary layout
            assigns.setdefault(layer[-1], np.zeros(len(rows), dtype=np.int64))[:] = boundary[rows]
        return assigns

    root = Factor(scope=(), keys=np.zeros((len(keep), 0), dtype=np.int32), t=t[keep], m=mem[keep])
    return PipeSolution.of(with_edges(tables, cm), root, splits, stats=S.stats, reader=reader)

# ---- the whole pipeline pass --------------------------------------------------------------------
def search_pipelines(graph: OpGraph, cluster: Cluster, job: TrainingJob, zero_stages: tuple[int, ...],
                     recompute: bool = True, allow_async: bool = False, eps: float = 0.0,
                     shapes: list[PipeShape] | None = None, profile: DeviceProfile | ProfileLookup | None = None,
                     envelope: tuple[np.ndarray, np.ndarray] | None = None, pipelines: bool = True,
                     accumulate: bool = False, counts: dict[str, int] | None = None,
                     interleave: bool = False, bounds: Boundaries | None = None) -> list[PipeSolution]:
    """Every pipeline shape's frontier (empty when the graph has no stack to cut); the shapes as
    `pipeline_shapes` gives them (`pipelines`: p >= 2, `accumulate`: gradient accumulation on one
    stage) unless `shapes` names them. With an `envelope` of plans known to exist (e.g. the
    frontier without pipelines), each shape keeps only the points no such plan - nor an earlier
    shape's - beats; without one, each shape's complete frontier. `counts` hears how many shapes
    there were and how many their bound ruled out. `bounds`: `graph`'s Boundaries, where the
    caller has them (FT's cost model), not found again."""
    chain = find_chain(graph)
    # several block stacks (an encoder-decoder) pipeline through stacks.py: a chain here is the
    # first stack alone, and a cut of it alone would leave the other stack's inputs unpriced
    if chain is None or unsupported(graph, chain) is not None or len(graph.blocks) > 1:
        return []
    if shapes is None:
        shapes = pipeline_shapes(cluster, job, len(chain.layers), zero_stages, allow_async, pipelines=pipelines,
                                 accumulate=accumulate, interleave=interleave, spread=band_spread(graph, chain))
        if accumulate:  # and on the context-parallel meshes of a long-sequence graph
            shapes += context_accumulation_shapes(graph, cluster, job, zero_stages)
    graphs: dict[int, tuple[OpGraph, CostModel, Chain | None]] = {}
    tails: dict[int, set[str]] = {}  # the ops after the stack, per micro-batch graph
    placeable: dict[tuple[int, tuple[MeshAxis, ...]], bool] = {}
    tested: dict[int, list[Op]] = {}  # the ops whose placement stands for every op's, per micro-batch graph
    bases: dict[tuple[int, tuple[MeshAxis, ...], int], dict[str, OpCosts] | None] = {}
    # the micro-batch graphs differ from `graph` in shapes and FLOPs only: one Boundaries (its
    # pair constraints walk every op's modules) serves every micro-batch count's cost model
    bounds = bounds if bounds is not None else Boundaries.of(graph)

    def priced(shape: PipeShape) -> tuple[OpGraph, CostModel, Chain | None, dict[str, OpCosts] | None]:
        """The micro-batch graph, its cost model and stack, and the shape's op tables (None where
        the micro-batch does not split over the stage's data-parallel ranks), each made once."""
        m = shape.micro_batches
        if m not in graphs:
            g = micro_batch_graph(graph, m)
            # every micro-batch count's cost model shares the first one's shape-free parts
            like = next(iter(graphs.values()))[1] if graphs else None
            graphs[m] = (g, CostModel(g, cluster, job.model_copy(update={"global_batch": job.global_batch // m}),
                                      profile=profile, bounds=bounds, like=like), find_chain(g))
        g, cm, ch = graphs[m]
        key = (m, shape.mesh.axes, shape.zero)
        if key not in bases:
            sub = Mesh(pp=1, axes=shape.mesh.axes)
            if (m, shape.mesh.axes) not in placeable:
                if m not in tested:
                    # layers 2.. repeat the template's ops (the chain's premise, as their prices do)
                    covered = ch.copies if ch is not None else frozenset()
                    tested[m] = [op for op in g.ops if op.name not in covered]
                placeable[(m, shape.mesh.axes)] = ch is not None and unplaceable_op(tested[m], sub, g.batch_label) is None
            ok = placeable[(m, shape.mesh.axes)]
            bases[key] = mesh_costs(g, cm, sub, shape.zero, ch) if ok else None
        return g, cm, ch, bases[key]

    made: dict[int, PipeTables | None] = {}  # by the shape's identity: `bounded` keeps them alive

    def tables_of(shape: PipeShape) -> PipeTables | None:
        """The shape's tables, made once for the twin test and its solve."""
        if id(shape) not in made:
            g, cm, ch, base = priced(shape)
            made[id(shape)] = pipe_tables(g, cm, shape, chain=ch, base=base, edges=False)
        return made[id(shape)]

    # Bound every shape from its op tables alone, then solve the shapes in order of their bound
    # on time (accumulation first); a shape whose bounds the plans already found beat cannot add a point (every plan
    # of the shape lies inside its bounds): exact.
    lams = envelope_slopes(envelope)
    bounded: list[tuple[ShapeBound, int, PipeShape]] = []
    parts: _BoundParts = {}
    for shape in shapes:
        g, cm, ch, base = priced(shape)
        if ch is None or base is None or len(ch.layers) < shape.stages:
            continue
        if shape.micro_batches not in tails:
            tails[shape.micro_batches] = after_stack(g, ch)
        bounded.append((shape_bound(g, cm, shape, ch, base, lams, tails[shape.micro_batches], parts), len(bounded),
                        shape))
    # one-stage shapes (accumulation: one solve each, no middle stages) first: they are cheap and
    # fill the known plans that bound the pipelines; then each kind fastest bound first
    bounded.sort(key=lambda x: (x[2].stages > 1, x[0].t, x[1]))
    out: list[PipeSolution] = []
    skipped = solved = twins = 0
    # the shapes taken so far per everything but the ZeRO stage, with their tables once made
    taken: dict[tuple, list[tuple[PipeShape, list[PipeTables | None]]]] = {}
    # what the bounds read of the known plans, made again when they grow
    known = _known(envelope) if envelope is not None and len(envelope[0]) else None
    for bound, _, shape in bounded:
        if envelope is not None and known is not None and bound.covered(envelope, known.stair):
            skipped += 1
            continue
        g, cm, ch, base = priced(shape)
        if envelope is not None and _twin_taken(shape, taken, tables_of):
            twins += 1
            continue
        solved += 1
        if id(shape) in made and made[id(shape)] is None:
            continue  # no tables: nothing to solve (as solve_shape would find)
        sol = solve_shape(g, cm, shape, eps, recompute, envelope, chain=ch, base=base, tables=made.get(id(shape)),
                          known=known)
        if sol is not None and len(sol.root):
            out.append(sol)
            if envelope is not None:
                envelope = (np.concatenate([envelope[0], sol.root.t]), np.concatenate([envelope[1], sol.root.m]))
                known = _known(envelope)
    if counts is not None:
        counts.update(shapes=len(bounded), bounded_out=skipped, solved=solved, twins=twins)
    return out


def _twin_taken(shape: PipeShape, taken: dict[tuple, list[tuple[PipeShape, list[PipeTables | None]]]],
                tables: Callable[[PipeShape], PipeTables | None]) -> bool:
    """Whether a shape taken before this one differs from it in the ZeRO stage alone and prices
    alike: the same op tables to the bit, buffers and transfers (ZeRO 0 and 1 on a stage without
    data parallelism: nothing to shard). Its solve then finds the same points, every one of
    which the envelope already holds (those of the twin, or plans that beat them), and the
    envelope admits no point a known plan matches: the shape adds nothing, and is left unsolved
    (exact). `shape` is recorded among the taken either way; `tables` makes a shape's tables,
    asked for only when there is a twin candidate (and once per shape)."""
    sig = (shape.mesh, shape.micro_batches, shape.schedule, shape.virtual_stages, shape.spread)
    mine: list[PipeTables | None] = []
    found = False
    for other, theirs in taken.get(sig, []):
        if not mine:
            mine.append(tables(shape))
        if not theirs:
            theirs.append(tables(other))
        if mine[0] is not None and theirs[0] is not None and _same_tables(mine[0], theirs[0]):
            found = True
            break
    taken.setdefault(sig, []).append((shape, mine))
    return found


def _same_tables(a: PipeTables, b: PipeTables) -> bool:
    """Every table a stage solve reads, equal to the bit (edges are priced from the op tables'
    configurations, the same graph and mesh: equal with them)."""
    if a.graph is not b.graph or a.chain is not b.chain or a.buffers != b.buffers or a.op_costs.keys() != b.op_costs.keys():
        return False
    if not (np.array_equal(a.p2p, b.p2p) and np.array_equal(a.p2p_bytes, b.p2p_bytes)):
        return False
    # layers 2.. share their template op's table object in each shape: a pair of tables is
    # compared once, not once per layer (llama-70b: 80 layers' worth of array_equal calls)
    equal: set[tuple[int, int]] = set()
    for name, x in a.op_costs.items():
        y = b.op_costs[name]
        if x is y or (id(x), id(y)) in equal:
            continue
        if not _same_op_table(x, y):
            return False
        equal.add((id(x), id(y)))
    return True


def _same_op_table(x: OpCosts, y: OpCosts) -> bool:
    """Two ops' tables equal to the bit."""
    if x.configs != y.configs or x.estimated != y.estimated or (x.step is None) != (y.step is None):
        return False
    fields = ("time", "mem", "parts", "comm", "time_rc", "mem_rc", "parts_rc") + (("step",) if x.step is not None else ())
    return all(np.array_equal(getattr(x, f), getattr(y, f)) for f in fields)


class EndLeast(NamedTuple):
    """Per boundary configuration (rows; inf where none), the least of each objective over the
    points of an end stage's part: columns t, m, t + lam_j m for each slope, t / p + lam_j m for
    each slope. `head` and `u0` (one layer) under the first stage's weights or any lower bound
    of them, `ul` (one layer) and `tail` under the last stage's."""

    head: np.ndarray
    u0: np.ndarray
    ul: np.ndarray
    tail: np.ndarray


def _objectives(lams: np.ndarray, p: int) -> np.ndarray:
    """The rows (w_t, w_m) of EndLeast's columns."""
    one = np.ones(len(lams))
    return np.concatenate([[[1.0, 0.0], [0.0, 1.0]], np.stack([one, lams], 1), np.stack([one / p, lams], 1)])


def _layer_units(graph: OpGraph, tables: PipeTables, first: MeshFactors, last: MeshFactors, lams: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """EndLeast's `u0` and `ul`: one layer's minima under the first and the last stage's
    weights, by the min-sum elimination of the factors their solves eliminate. `_layer_least`
    and `_end_least` both read them: a shape that reaches the second test reuses the first's."""
    chain, p = tables.chain, tables.shape.stages
    diag = np.arange(len(first.op_costs[chain.boundary].configs))
    block, _, _ = stage_parts(graph, chain, first.op_costs, tables.tail)
    units = [u[diag, diag] for u in least_of([first] if last is first else [first, last], block, 1,
                                             (chain.boundary, chain.template[-1]), _objectives(lams, p))]
    return units[0], units[-1]


def _end_least(graph: OpGraph, tables: PipeTables, first: MeshFactors, last: MeshFactors, lams: np.ndarray,
               units: tuple[np.ndarray, np.ndarray] | None = None) -> EndLeast:
    """EndLeast by min-sum eliminations of the end stages' parts, from the very factors their
    solves eliminate (exactly the minima of those frontiers, up to the order of float sums).
    `units`: `_layer_units` of these factors and slopes, where the caller has them."""
    chain, tail = tables.chain, tables.tail
    w = _objectives(lams, tables.shape.stages)
    _, head_ops, _ = stage_parts(graph, chain, first.op_costs, tail)
    _, _, tail_ops = stage_parts(graph, chain, last.op_costs, tail)
    u0, ul = units if units is not None else _layer_units(graph, tables, first, last, lams)
    return EndLeast(least_of([first], head_ops, 0, (chain.boundary,), w)[0], u0, ul,
                    least_of([last], tail_ops, None, (chain.boundary,), w)[0])


def _op_least(graph: OpGraph, tables: PipeTables, first: Weights, last: Weights, lams: np.ndarray) -> EndLeast:
    """A lower EndLeast than `_layer_least`'s, from the op tables alone (no factor is built):
    every op of the end stages' parts - the layer's too - at its cheapest configuration under
    its stage's weights and every edge at no cost (`_Cheapest`, as `shape_bound` takes them),
    the same for every boundary configuration. Cheap enough to try first: most shapes that reach
    the end stages' test lose on it already."""
    chain, tail = tables.chain, tables.tail
    nb = len(tables.op_costs[chain.boundary].configs)
    # the stage problems' ops: layers 2.. are priced through the template (as `build` weighs them)
    own = tables.own_costs
    block, head_ops, tail_ops = stage_parts(graph, chain, own, tail)
    return EndLeast(*(_cheapest_rows(tables, ops, w, lams, nb)
                      for ops, w in ((head_ops, first), (block, first), (block, last), (tail_ops, last))))


def _layer_least(graph: OpGraph, tables: PipeTables, first_stage: tuple[MeshFactors, Weights],
                 last_stage: tuple[MeshFactors, Weights], lams: np.ndarray,
                 units: tuple[np.ndarray, np.ndarray] | None = None) -> EndLeast:
    """A lower EndLeast than `_end_least`'s, cheaper: the layer's minima by the same min-sum
    elimination, the ops before and after the stack each at its cheapest configuration under its
    stage's weights and their edges at no cost (`_Cheapest`, as `shape_bound` takes them), the
    same for every boundary configuration. Each stage: its factors and its weights; `units`:
    `_layer_units` of them, where the caller has them."""
    (first, w_first), (last, w_last) = first_stage, last_stage
    chain, tail = tables.chain, tables.tail
    nb = len(first.op_costs[chain.boundary].configs)
    _, head_ops, _ = stage_parts(graph, chain, first.op_costs, tail)
    _, _, tail_ops = stage_parts(graph, chain, last.op_costs, tail)
    u0, ul = units if units is not None else _layer_units(graph, tables, first, last, lams)
    return EndLeast(_cheapest_rows(tables, head_ops, w_first, lams, nb), u0, ul,
                    _cheapest_rows(tables, tail_ops, w_last, lams, nb))


def _cheapest_rows(tables: PipeTables, ops: list[Op], w: Weights, lams: np.ndarray, configs: int) -> np.ndarray:
    """EndLeast's rows for `ops` each at its cheapest configuration under weights w and their
    edges at no cost (`_Cheapest`), the same row for each of the `configs` boundary
    configurations: the columns t, m, t + lam_j m, t / p + lam_j m."""
    least = _Cheapest(tables.op_costs, [op.name for op in ops])
    row = np.concatenate([least.least(w, lams), least.least(w, lams, 1.0 / tables.shape.stages)[2:]])
    return np.broadcast_to(row, (configs, len(row)))


def frontier_least(f: Factor, configs: int, lams: np.ndarray, p: int) -> np.ndarray:
    """An EndLeast row per boundary configuration from a factor over the boundary (its frontier
    at hand): what `_end_least` finds without one."""
    out = np.full((configs, 2 + 2 * len(lams)), np.inf)
    for b in range(configs):
        sel = f.keys[:, 0] == b
        t, m = f.t[sel], f.m[sel]
        if len(t):
            out[b] = np.concatenate([[t.min(), m.min()], (t[:, None] + lams[None, :] * m[:, None]).min(axis=0),
                                     (1.0 / p * t[:, None] + lams[None, :] * m[:, None]).min(axis=0)])
    return out


class _Known(NamedTuple):
    """What the bounds read of the plans known to exist (an envelope), found once for the
    several tests of a shape: the slopes it is bounded at and the plans' staircase."""

    lams: np.ndarray
    stair: tuple[np.ndarray, np.ndarray]


def _known(envelope: tuple[np.ndarray, np.ndarray]) -> _Known:
    return _Known(envelope_slopes(envelope), _stair(envelope))


def _stair(envelope: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The known plans' staircase, as every `covered` test reads it."""
    return staircase(np.asarray(envelope[0], dtype=float), np.asarray(envelope[1], dtype=float))


def _ends_beaten(tables: PipeTables, weights: list[Weights], least: Callable[[np.ndarray], EndLeast],
                 envelope: tuple[np.ndarray, np.ndarray], known: _Known | None = None) -> bool:
    """Whether the plans known to exist beat every plan of this shape, judged from the first
    and last stage's parts alone (`ends_bounds`); `least` gives their minima at given slopes.
    `known`: `_known(envelope)`, where the caller has it."""
    known = known if known is not None else _known(envelope)
    return all(r.covered(envelope, known.stair)
               for r in ends_bounds(tables, weights, least(known.lams), known.lams).values())


class Regions:
    """Several regions where plans lie: region i is t >= t[i], m >= m[i] and t + lam_j m >=
    b[i, j] for each slope lam_j (ShapeBound's, many at once)."""

    def __init__(self, t: np.ndarray, m: np.ndarray, lams: np.ndarray, b: np.ndarray) -> None:
        self.t, self.m, self.lams, self.b = t, m, lams, b

    def holds(self, t: float, m: float, rtol: float = 0.0) -> bool:
        """Whether the point (t, m) lies in one of the regions (to rtol)."""
        lo = 1.0 - rtol
        inside = (t >= self.t * lo) & (m >= self.m * lo) & np.all(t + self.lams * m >= self.b * lo, axis=1)
        return bool(inside.any())

    def covered(self, envelope: tuple[np.ndarray, np.ndarray],
                stair: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
        """Whether known plans beat every point of every region: ShapeBound.covered's test (see
        there), one numpy sweep over the regions x the known plans' steps. `stair`: the
        envelope's staircase (`_stair`), where the caller has it."""
        if not len(self.t):
            return True
        st, sm = stair if stair is not None else _stair(envelope)
        if not len(st):
            return False
        margin = 1.0 - 2 * RTOL  # pull each region toward the origin: equal prices are no proof
        t0, m0 = self.t * margin, self.m * margin
        if np.any(st[0] > t0) or np.any(m0 < sm[-1]):
            return False  # a region starts faster than every known plan, or is leaner than all
        i0 = np.searchsorted(st, t0, side="right") - 1
        # of a run of steps with one memory only the last needs checking: g does not rise with
        # time (nor its float arithmetic), so it holds at every step of the run if at the last
        # one; the known plans' staircase drops at a few of its hundreds of points
        # (and no region needs a step before the earliest it starts in)
        steps = (np.flatnonzero(np.r_[sm[1:-1] != sm[:-2], True]) if len(st) > 1
                 else np.zeros(0, dtype=np.int64))
        steps = steps[steps >= i0.min()]
        pos = self.lams > 0
        g = np.broadcast_to(m0[:, None], (len(t0), len(steps)))
        if pos.any():
            b = self.b[:, pos] * margin
            g = np.maximum(g, np.max((b[:, :, None] - st[None, None, steps + 1]) / self.lams[pos][None, :, None],
                                     axis=1))
        # region r needs g(right end of step i) >= the step's memory for every step i >= i0[r]
        need = steps[None, :] >= i0[:, None]
        return bool(np.all(~need | (g >= sm[None, steps])))


def ends_bounds(tables: PipeTables, weights: list[Weights], ends: EndLeast, lams: np.ndarray) -> dict[int, Regions]:
    """Per boundary configuration, regions where every plan of this shape lies (each plan in at
    least one), from the least costs of the first and last stage's parts alone (before the
    middle stages are solved): one region per count of layers on the first and on the last
    stage that a split in the band allows. The first stage holds the ops before the stack and
    its k0 layers, the last the ops after it and its kl, some middle stage at least its share
    of the rest (each of its layers no cheaper than one on the last stage, whose micro-batches
    in flight are fewest), and the iteration time is at least every stage's average. Exact:
    each bound is a sum of minima."""
    p, n = len(weights), len(tables.chain.layers)
    v = tables.shape.virtual_stages
    L = len(lams)
    out: dict[int, Regions] = {}
    band = stage_band(n, p, v, tables.shape.spread) if p > 1 else range(n, n + 1)
    members = np.array(list(band), dtype=np.int64)
    if p == 1:
        k0 = kl = km = np.zeros(1, dtype=np.int64)
    else:
        k0, kl = (x.ravel() for x in np.meshgrid(members, members, indexing="ij"))
        rest = n - k0 - kl
        if p == 2:
            ok = rest == 0
        else:  # the rest must split over the middle stages inside the band
            ok = ((p - 2) * band.start <= rest) & (rest <= (p - 2) * (band.stop - 1))
        k0, kl, rest = k0[ok], kl[ok], rest[ok]
        # the middle stage holding the most layers holds at least its share, a band member
        km = (members[np.searchsorted(members * (p - 2), rest, side="left").clip(max=len(members) - 1)]
              if p > 2 else np.zeros(len(k0), dtype=np.int64))

    head, u0, ul, tail = ends
    lines, scaled = slice(2, 2 + L), slice(2 + L, 2 + 2 * L)
    # the least of the middle stages' sends per second of transfer, the same for every layout: a
    # product's rounding keeps the order of its factors (the transfer is >= 0), so the least
    # product is the least factor's (p = 64: 62 stages, once per layout and test before)
    mid_sends = min((weights[s].slots * sends(s, p, v) for s in range(1, p - 1)), default=0.0)
    for b in [int(x) for x in np.flatnonzero(np.isfinite(head[:, 0]))]:
        h, a, z, tl = head[b], u0[b], ul[b], tail[b]
        if p == 1:
            whole = h + (n - 1) * a + tl
            t_lb, m_lb = np.array([whole[0]]), np.array([whole[1] + tables.buffers])
            bnd = (whole[lines] + lams * tables.buffers)[None, :]
        else:
            send = weights[0].slots * sends(0, p, v) * float(tables.p2p[b])
            send_mid = mid_sends * float(tables.p2p[b])
            t_all = h[0] + tl[0] + (n - 1) * a[0]
            t_avg = (t_all + (p - 1) * send) / p
            s0 = h[None, :] + (k0 - 1)[:, None] * a[None, :]   # first stage: the ops before the stack, layer 0
            sl = tl[None, :] + kl[:, None] * z[None, :]         # last stage
            mid = km[:, None] * z[None, :]                      # the busiest middle stage, its send apart
            mid_send = np.where(km > 0, send_mid, 0.0)
            t_lb = np.maximum(np.maximum(t_avg, s0[:, 0] + send), np.maximum(sl[:, 0], mid[:, 0] + mid_send))
            m_lb = np.maximum(np.maximum(s0[:, 1], sl[:, 1]), mid[:, 1]) + tables.buffers
            bnd = np.maximum(np.maximum(s0[:, lines] + send, sl[:, lines]), mid[:, lines] + mid_send[:, None])
            if L:
                # average time with the first or the last stage's memory: each op counted once
                bnd = np.maximum(bnd, s0[:, scaled] + (t_avg - s0[:, :1] / p))
                bnd = np.maximum(bnd, sl[:, scaled] + (t_avg - sl[:, :1] / p))
            bnd = bnd + lams * tables.buffers
        # a region without finite bounds has no plan through this layout
        fin = np.isfinite(t_lb) & np.isfinite(m_lb)
        if fin.any():
            out[b] = Regions(t_lb[fin], m_lb[fin], lams, bnd[fin])
    return out


def envelope_slopes(envelope: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Trade-off slopes (seconds per byte) at which shapes are bounded: those of the known
    plans' own steps, where a bound has the most bite (as ft.py's stack bound picks them)."""
    if envelope is None or len(envelope[0]) < 2:
        return np.zeros(0)
    keep = pareto_mask(np.zeros(len(envelope[0]), dtype=np.int64), envelope[0], envelope[1])
    et, em = staircase(envelope[0][keep], envelope[1][keep])
    steps = (et[1:] - et[:-1]) / np.maximum(em[:-1] - em[1:], 1e-300)
    steps = steps[np.isfinite(steps) & (steps > 0)]
    return np.unique(np.quantile(steps, np.linspace(0.0, 1.0, 9))) if len(steps) else np.zeros(0)


class ShapeBound:
    """Where every plan of one shape lies: t >= `t`, m >= `m`, and t + lam_j m >= b_j for each
    slope lam_j (the lower convex hull of the shape's frontier lies above those lines)."""

    def __init__(self, t: float, m: float, lams: np.ndarray, b: np.ndarray) -> None:
        self.t, self.m, self.lams, self.b = t, m, lams, b

    def covered(self, envelope: tuple[np.ndarray, np.ndarray],
                stair: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
        """Whether known plans beat every point of the region: below the region's lower edge
        g(t) = max(m, max_j (b_j - t) / lam_j), the staircase of known plans' least memory L(t)
        is constant between two known times, and g is non-increasing, so g >= L everywhere
        from t on iff it holds at the right end of every step and after the last one. `stair`:
        the envelope's staircase (`_stair`), where the caller has it."""
        st, sm = stair if stair is not None else _stair(envelope)
        margin = 1.0 - 2 * RTOL  # pull the region toward the origin: equal prices are no proof
        t0, m0 = self.t * margin, self.m * margin
        if not len(st) or st[0] > t0:
            return False  # no known plan is as fast as the shape can be
        i0 = int(np.searchsorted(st, t0, side="right")) - 1
        ends = st[i0 + 1:]  # right ends of the steps from the one holding t0 on
        g = np.full(len(ends), m0)
        pos = self.lams > 0
        if len(ends) and pos.any():
            g = np.maximum(g, np.max((self.b[pos, None] * margin - ends[None, :]) / self.lams[pos, None], axis=0))
        return bool(np.all(g >= sm[i0:len(st) - 1]) and m0 >= sm[-1])


class _Cheapest:
    """Some ops' cost tables stacked, so the sum over the ops of each one's cheapest weighed
    configuration is a few numpy sweeps, not a dozen calls per op (`shape_bound` bounds every
    shape this way). Bit for bit what weighing each op (`weigh_op`) and adding up its minima in
    op order gives: the same elementwise arithmetic, minima per op, and a sequential sum."""

    def __init__(self, base: dict[str, OpCosts], names: list[str]) -> None:
        ocs = [base[name] for name in names]
        steps = [oc.step if oc.step is not None else np.zeros_like(oc.time) for oc in ocs]
        self.ops = len(ocs)
        self.time = np.concatenate([x for oc in ocs for x in (oc.time, oc.time_rc)]) if ocs else np.zeros(0)
        self.step = np.concatenate([x for st in steps for x in (st, st)]) if ocs else np.zeros(0)
        self.parts = np.concatenate([x for oc in ocs for x in (oc.parts, oc.parts_rc)]) if ocs else np.zeros((0, 4))
        sizes = [len(oc.time) + len(oc.time_rc) for oc in ocs]
        self.starts = np.cumsum([0, *sizes[:-1]]) if ocs else np.zeros(0, dtype=np.int64)

    def least(self, w: Weights, lams: np.ndarray, time_scale: float = 1.0) -> np.ndarray:
        """Summed over the ops: the least time, the least memory and, per slope lam_j, the least
        time_scale * time + lam_j * memory, each op under weights w."""
        L = len(lams)
        if not self.ops:
            return np.zeros(2 + L)
        t = w.slots * (self.time - self.step) + self.step
        m = (self.parts * np.array([w.copies, 1.0, 1.0, w.inflight])).sum(axis=1)
        cols = [np.minimum.reduceat(t, self.starts)[:, None], np.minimum.reduceat(m, self.starts)[:, None]]
        if L:
            cols.append(np.minimum.reduceat(time_scale * t[:, None] + lams[None, :] * m[:, None], self.starts, axis=0))
        # in op order, one op at a time, as a running sum from zero would add them
        return np.add.accumulate(np.concatenate(cols, axis=1), axis=0)[-1]


# per op tables (by identity, kept alive here): the buffers and the parts' stacked tables
# `shape_bound` reads, the same for every shape priced from those tables
_BoundParts = dict[int, tuple[dict[str, OpCosts], float, dict[str, _Cheapest]]]


def shape_bound(graph: OpGraph, cm: CostModel, shape: PipeShape, chain: Chain, base: dict[str, OpCosts],
                lams: np.ndarray, tail: set[str] | None = None, parts: _BoundParts | None = None) -> ShapeBound:
    """Lower bounds on every plan of a shape from its op tables (`mesh_costs` on the stage
    sub-mesh) alone: edges, transfers and a tied parameter's second copy cost >= 0 and are left
    out, and each op is taken at its cheapest configuration (with or without recomputation) for
    each objective or weighted sum separately. A plan's time is at least the stages' average
    and at least its first or last stage's, and its memory at least its first stage's (the most
    micro-batches in flight), its last stage's and a middle stage's, each stage at its fewest
    layers; so t + lam m is at least the best of those pairs. `parts`: where the caller keeps
    them, what the shapes priced from one `base` share (the shapes of one micro-batch count,
    sub-mesh and ZeRO stage: each schedule and stage count)."""
    p, n = shape.stages, len(chain.layers)
    weights = stage_weights(p, shape.micro_batches, shape.schedule, shape.virtual_stages)
    hit = parts.get(id(base)) if parts is not None else None
    if hit is not None and hit[0] is base:
        _, buffers, ops_of = hit
    else:
        sub = Mesh(pp=1, axes=shape.mesh.axes)
        covered = chain.copies
        buffers = cm.buffers(sub, [graph.op(name) for name in base if name not in covered], shape.zero)
        tail = tail if tail is not None else after_stack(graph, chain)
        head = [name for name in base if name not in covered and name not in chain.template and name not in tail]
        tail_ops = [name for name in base if name in tail]
        ops_of = {"head": _Cheapest(base, head), "template": _Cheapest(base, list(chain.template)),
                  "tail": _Cheapest(base, tail_ops)}
        if parts is not None:
            parts[id(base)] = (base, buffers, ops_of)
    L = len(lams)
    found: dict[tuple[Weights, str, float], np.ndarray] = {}  # the bounds below ask for most of these twice

    def least(w: Weights, part: str, time_scale: float = 1.0) -> np.ndarray:
        """Per column: the summed cheapest time, memory, and time_scale * time + lam_j * memory
        of the ops of `part` (the head, the template layer or the tail)."""
        key = (w, part, time_scale)
        if key not in found:
            found[key] = ops_of[part].least(w, lams, time_scale)
        return found[key]

    first, last = weights[0], weights[-1]
    if p == 1:
        whole = least(first, "head") + (n - 1) * least(first, "template") + least(first, "tail")
        return ShapeBound(float(whole[0]), buffers + float(whole[1]), lams, whole[2:] + lams * buffers)
    band = stage_band(n, p, shape.virtual_stages, shape.spread)
    k = max(band.start, n - (p - 1) * (band.stop - 1))  # the fewest layers an end stage holds
    s0 = least(first, "head") + (k - 1) * least(first, "template")      # first stage: ops before the stack, layer 0
    sl = least(last, "tail") + k * least(last, "template")          # last stage
    t_avg = (least(first, "head")[0] + least(last, "tail")[0] + (n - 1) * least(first, "template")[0]) / p
    mid = least(weights[1], "template")[1] * band.start if p > 2 else 0.0
    t_lb = max(t_avg, s0[0], sl[0])
    m_lb = buffers + max(s0[1], sl[1], mid)
    # t + lam m: the first stage's or the last stage's own time and memory, or the average time
    # with one of those stages' memory (each op counted once: its share of the average, plus its
    # memory where it sits on that stage)
    b = np.maximum(s0[2:], sl[2:]) if L else np.zeros(0)
    if L:
        rest_t = t_avg  # every op's cheapest time, averaged
        for w_, names, layers in ((first, "head", k - 1), (last, "tail", k)):
            own = least(w_, names, 1.0 / p) + layers * least(w_, "template", 1.0 / p)
            own_t = (least(w_, names)[0] + layers * least(w_, "template")[0]) / p
            b = np.maximum(b, own[2:] + (rest_t - own_t))
        b = b + lams * buffers
    return ShapeBound(t_lb, m_lb, lams, b)


__all__ = ["MAX_STAGES", "MICRO_BATCH_FACTORS", "partitions", "pipeline_shapes", "search_pipelines", "solve_shape",
           "stage_band"]
