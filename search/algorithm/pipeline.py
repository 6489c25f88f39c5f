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
linear in their sizes.

The space searched, and what is left out on purpose:
- p divides the device count, 2 <= p <= min(the number of layers, MAX_STAGES); m in {p, 2p, 4p,
  8p} dividing the global batch; the sub-mesh from mesh_candidates over devices / p;
- every stage holds within STAGE_BAND layers of n / p (identical layers make far-off splits
  slower at no memory gain except to offset the embedding and head, which the band covers);
- ZeRO 0 and 1 only: ZeRO-2/3 shard gradients/parameters that micro-batches re-gather every
  step (DeepSpeed refuses ZeRO-2/3 with pipelines for this reason);
- GPipe is costed (planners, exhaustive reference) but never reaches the frontier: it has
  1F1B's bubble and at least its in-flight activations, so the search proves it dominated and
  skips it; 2BW only with allow_async (1-stale weights);
- the boundary activation's layout is the block stack's tied layout, sent point-to-point in
  that layout (forward activation and backward gradient per micro-batch, on the pp link); it
  is counted in the sending stage's memory; a tied embedding's second copy on the last stage
  is not counted.
"""

from __future__ import annotations

import math

import numpy as np

from search.algorithm.chain import find_chain
from search.algorithm.evaluate import (
    PipeShape,
    PipeTables,
    Weights,
    micro_batch_graph,
    pipe_tables,
    stage_weights,
    unsupported,
    weigh_op,
)
from search.algorithm.factor_graph import prepare_mesh
from search.algorithm.frontier import RTOL, Factor, Stats, assignments, join, least_memory, pareto_mask, select, staircase
from search.algorithm.results import PipeSolution, Split
from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.mesh import Mesh, data_ways, mesh_candidates
from search.prices.profile import DeviceProfile, ProfileLookup
from search.prices.schedule import ScheduleName

STAGE_BAND = 2
MAX_STAGES = 16  # deeper pipelines leave a layer or two per stage; Megatron's largest runs use <= 16
MICRO_BATCH_FACTORS = (1, 2, 4, 8)  # m = factor * p
PIPELINE_ZERO = (0, 1)


# ---- shapes ------------------------------------------------------------------------------------
def pipeline_shapes(cluster: Cluster, job: TrainingJob, n_layers: int, zero_stages: tuple[int, ...],
                    allow_async: bool = False, schedules: tuple[ScheduleName, ...] | None = None) -> list[PipeShape]:
    """Every (p, sub-mesh, ZeRO stage, m, schedule) the search tries."""
    schedules = schedules or (("1f1b", "2bw") if allow_async else ("1f1b",))
    shapes = []
    n = cluster.num_devices
    for p in range(2, min(n, n_layers, MAX_STAGES) + 1):
        if n % p:
            continue
        inner = n // p
        # the stage's sub-mesh lives inside whatever the per-node layout gives it
        sub = cluster.model_copy(update={"num_devices": inner, "devices_per_node": math.gcd(inner, cluster.devices_per_node)})
        for mesh in mesh_candidates(sub):
            mesh = Mesh(pp=p, axes=mesh.axes)
            for zero in zero_stages:
                if zero not in PIPELINE_ZERO:
                    continue
                for f in MICRO_BATCH_FACTORS:
                    m = f * p
                    if job.global_batch % (m * data_ways(mesh)):
                        continue  # each micro-batch splits over the data-parallel ranks
                    for sched in schedules:
                        shapes.append(PipeShape(mesh, zero, m, sched))
    return shapes


def stage_band(n_layers: int, p: int) -> range:
    lo = max(1, n_layers // p - STAGE_BAND)
    hi = min(n_layers - (p - 1), -(-n_layers // p) + STAGE_BAND)
    return range(lo, hi + 1)


def partitions(n_layers: int, p: int) -> list[tuple[int, ...]]:
    """Every split of n layers into p stages inside the band (for the exhaustive reference)."""
    band = list(stage_band(n_layers, p))
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
def _maxcomb(at: np.ndarray, am: np.ndarray, bt: np.ndarray, bm: np.ndarray) -> tuple[np.ndarray, ...]:
    """Pareto set of (max(ta, tb), max(ma, mb)) over all pairs of two staircases, with the pair
    that makes each point: for each candidate time T, each side's least memory within T."""
    T = np.unique(np.concatenate([at, bt]))
    ia = np.searchsorted(at, T * (1 + RTOL), side="right") - 1
    ib = np.searchsorted(bt, T * (1 + RTOL), side="right") - 1
    ok = (ia >= 0) & (ib >= 0)
    T, ia, ib = T[ok], ia[ok], ib[ok]
    # staircases are sorted by time with memory decreasing: the last point within T is the leanest
    M = np.maximum(am[ia], bm[ib])
    tt = np.maximum(at[ia], bt[ib])
    keep = pareto_mask(np.zeros(len(tt), dtype=np.int64), tt, M)
    return tt[keep], M[keep], ia[keep], ib[keep]


def _staircase_of(f: Factor, b: int, add_t: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points of f for boundary configuration b, sorted by time (memory then decreases)."""
    sel = np.flatnonzero(f.keys[:, 0] == b)
    order = sel[np.argsort(f.t[sel], kind="stable")]
    return f.t[order] + add_t, f.m[order], order


class _Envelope:
    """Plans known to exist (time, memory). Every cost is non-negative and a pipeline takes the
    max over its stages, so a partial stage point (t, m) ends in plans with time >= t and
    memory >= m + buffers: if a known plan is no worse in both, the partial point can go (exact)."""

    def __init__(self, t: np.ndarray, m: np.ndarray, buffers: float, floor: tuple[float, float] = (0.0, 0.0)) -> None:
        self.stair = staircase(np.asarray(t, dtype=float), np.asarray(m, dtype=float))
        self.buffers = buffers
        self.floor_t, self.floor_m = floor  # no plan of the shape is faster or leaner than this
        self.enabled = len(t) > 0

    def admit(self, t: np.ndarray, m: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return np.ones(len(t), dtype=bool)
        return (least_memory(self.stair, np.maximum(t, self.floor_t))
                > np.maximum(m + self.buffers, self.floor_m) * (1.0 + RTOL))

    def prune(self, f: Factor) -> Factor:
        if not self.enabled:
            return f
        return select(f, np.flatnonzero(self.admit(f.t, f.m)))

    def join(self, a: Factor, b: Factor, domain: dict[str, int], eps: float, stats: Stats) -> Factor:
        admit = (lambda t, m, keys: self.admit(t, m)) if self.enabled else None
        return join(a, b, domain=domain, eps=eps, stats=stats, admit=admit)


class _Powers:
    """U^k, the k-layer Minkowski powers of one layer factor, built on demand and memoised."""

    def __init__(self, unit: Factor, domain: dict[str, int], eps: float, stats: Stats, env: _Envelope) -> None:
        self.domain, self.eps, self.stats, self.env = domain, eps, stats, env
        self.memo: dict[int, Factor] = {1: env.prune(unit)}

    def __call__(self, k: int) -> Factor:
        if k not in self.memo:
            half = self(k // 2)
            f = self.env.join(half, self(k - k // 2), self.domain, self.eps, self.stats)
            f.layers = k
            self.memo[k] = f
        return self.memo[k]


def _floor(tables: PipeTables) -> tuple[float, float]:
    """A lower bound on the iteration time and peak memory of every plan of a shape: the slowest
    stage takes at least the average of all stages, and every op and edge costs at least its
    cheapest configuration (the leanest stage weights for memory)."""
    shape = tables.shape
    weights = stage_weights(shape.stages, shape.micro_batches, shape.schedule)
    lean = min(weights, key=lambda w: (w.inflight, w.copies))
    t = m = 0.0
    for oc in tables.op_costs.values():
        w = weigh_op(oc, lean)
        t += float(min(w.time.min(), w.time_rc.min()))
        m += float(min(w.mem.min(), w.mem_rc.min()))
    t += sum(float(ec.time.min()) * lean.slots for ec in tables.edge_costs.values())
    return t / shape.stages, m / shape.stages + tables.buffers


class _Stages:
    """S(s, k): stage s holding k consecutive layers, as a factor over the boundary
    configuration - the layer frontier under stage s's weights to the k-th Minkowski power, with
    the ops before the stack (and layer 0) on stage 0 and those after it on the last stage.
    Built on demand and memoised; every join drops what the envelope proves cannot win."""

    def __init__(self, weights: list[Weights], powers: dict[Weights, _Powers], head: Factor, tail: Factor,
                 domain: dict[str, int], eps: float, stats: Stats, env: _Envelope) -> None:
        self.weights, self.powers, self.head, self.tail = weights, powers, head, tail
        self.domain, self.eps, self.stats, self.env = domain, eps, stats, env
        self.cache: dict[tuple[int, int], Factor] = {}

    @classmethod
    def build(cls, graph: OpGraph, cm: CostModel, tables: PipeTables, eps: float, recompute: bool,
              env: _Envelope) -> _Stages | None:
        """One factor graph per distinct stage weighting (FT's per-mesh problem, its ops weighed
        here and its edges by prepare_mesh); None if the stack cannot be solved as one layer."""
        shape, chain = tables.shape, tables.chain
        weights = stage_weights(shape.stages, shape.micro_batches, shape.schedule)
        sub = Mesh(pp=1, axes=shape.mesh.axes)
        covered = {name for layer in chain.layers[2:] for name in layer}  # priced through the template
        problems = {}
        for w in dict.fromkeys(weights):
            weighted = {name: weigh_op(oc, w) for name, oc in tables.op_costs.items() if name not in covered}
            prob = prepare_mesh(graph, cm, sub, True, eps, shape.zero, recompute, weighted,
                                split_outside=(w == weights[0], w == weights[-1]), edge_weights=w)
            if prob.unit is None:
                return None
            problems[w] = prob
        domain = next(iter(problems.values())).domain
        stats = Stats()
        powers = {w: _Powers(prob.unit, domain, eps, stats, env) for w, prob in problems.items() if prob.unit is not None}
        head, tail = problems[weights[0]].head, problems[weights[-1]].tail
        assert head is not None and tail is not None
        return cls(weights, powers, env.prune(head), env.prune(tail), domain, eps, stats, env)

    def __call__(self, s: int, k: int) -> Factor:
        if (s, k) not in self.cache:
            self.cache[(s, k)] = self._stage(s, k)
        return self.cache[(s, k)]

    def _stage(self, s: int, k: int) -> Factor:
        """Stage s holding k layers (stage 0 counts layer 0, which the head carries)."""
        w, env = self.weights[s], self.env
        if s == 0:
            f = self.head if k == 1 else env.join(self.head, self.powers[w](k - 1), self.domain, self.eps, self.stats)
        else:
            f = self.powers[w](k)
        if s == len(self.weights) - 1:
            f = env.join(f, self.tail, self.domain, self.eps, self.stats)
        return f

    def boundary_configs(self) -> list[int]:
        return [int(b) for b in np.unique(self.head.keys[:, 0])]


# a DP state: the points of the stages so far (time, memory, per point the (layers, index in
# S(s, layers)) of every stage), sorted by time
_State = tuple[np.ndarray, np.ndarray, list[list[tuple[int, int]]]]


def _stage_points(S: _Stages, s: int, k: int, b: int, extra_t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points of S(s, k) in boundary configuration b, plus `extra_t`, that the envelope admits."""
    st, sm, idx = _staircase_of(S(s, k), b, extra_t)
    ok = S.env.admit(st, sm)
    return st[ok], sm[ok], idx[ok]


def _split_layers(S: _Stages, b: int, n: int, p2p: np.ndarray, eps: float) -> _State | None:
    """The frontier of (max stage time, max stage memory) over every split of the n layers into
    the stages, the boundary in configuration b: F_s(j) = Pareto(union over k of
    max(F_{s-1}(j - k), S(s, k))), states j = layers covered so far. None if no split fits."""
    weights = S.weights
    p = len(weights)
    band = stage_band(n, p)
    states: dict[int, _State] = {}
    for k in band:
        st, sm, idx = _stage_points(S, 0, k, b, weights[0].slots * p2p[b] if p > 1 else 0.0)
        if len(st):
            states[k] = (st, sm, [[(k, int(i))] for i in idx])
    for s in range(1, p):
        nxt: dict[int, _State] = {}
        left_after = p - 1 - s
        for j, (ft, fm, fback) in states.items():
            for k in band:
                jj = j + k
                if jj + left_after * band.start > n or jj + left_after * band.stop - left_after < n:
                    continue  # the stages after this one cannot cover the rest inside the band
                if s == p - 1 and jj != n:
                    continue
                st, sm, idx = _stage_points(S, s, k, b, weights[s].slots * p2p[b] if s < p - 1 else 0.0)
                if not len(st):
                    continue
                tt, mm, ia, ib = _maxcomb(ft, fm, st, sm)
                back = [fback[i] + [(k, int(idx[q]))] for i, q in zip(ia, ib, strict=True)]
                if jj in nxt:
                    ot, om, oback = nxt[jj]
                    tt, mm, back = np.concatenate([ot, tt]), np.concatenate([om, mm]), oback + back
                order = np.argsort(tt, kind="stable")
                tt, mm, back = tt[order], mm[order], [back[i] for i in order]
                keep = pareto_mask(np.zeros(len(tt), dtype=np.int64), tt, mm, eps)
                keep = np.sort(keep)
                nxt[jj] = (tt[keep], mm[keep], [back[i] for i in keep])
        states = nxt
    return states.get(n)


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
                recompute: bool = True, envelope: tuple[np.ndarray, np.ndarray] | None = None) -> PipeSolution | None:
    """The frontier of one pipeline shape over stage boundaries and every op's configuration.
    `graph` and `cm` are the micro-batch graph and its cost model; `envelope` holds (time,
    memory) of plans known to exist, which prune partial stages that cannot win (exact)."""
    tables = pipe_tables(graph, cm, shape)
    if tables is None:
        return None
    known_t, known_m = envelope if envelope is not None else (np.zeros(0), np.zeros(0))
    env = _Envelope(known_t, known_m, tables.buffers, _floor(tables) if envelope is not None else (0.0, 0.0))
    S = _Stages.build(graph, cm, tables, eps, recompute, env)
    if S is None:
        return None
    chain = tables.chain
    # per boundary configuration (the stack's tied layout): the best splits into stages
    out_t, out_m, out_b, out_back = [], [], [], []
    for b in S.boundary_configs():
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
    splits, assigns = _read_back(S, chain.layer_maps(), [out_back[g] for g in keep])
    for layer in chain.layers:  # every layer's output takes the tied boundary layout
        assigns.setdefault(layer[-1], np.zeros(len(keep), dtype=np.int64))[:] = np.array(out_b)[keep]
    root = Factor(scope=(), keys=np.zeros((len(keep), 0), dtype=np.int32), t=t[keep], m=mem[keep])
    return PipeSolution.of(tables, root, splits, assigns, S.stats)

# ---- the whole pipeline pass --------------------------------------------------------------------
def search_pipelines(graph: OpGraph, cluster: Cluster, job: TrainingJob, zero_stages: tuple[int, ...],
                     recompute: bool = True, allow_async: bool = False, eps: float = 0.0,
                     shapes: list[PipeShape] | None = None, profile: DeviceProfile | ProfileLookup | None = None,
                     envelope: tuple[np.ndarray, np.ndarray] | None = None) -> list[PipeSolution]:
    """Every pipeline shape's frontier (empty when the graph has no stack to cut). With an
    `envelope` of plans known to exist (e.g. the frontier without pipelines), each shape keeps
    only the points no such plan - nor an earlier shape's - beats; without one, each shape's
    complete frontier."""
    chain = find_chain(graph)
    if chain is None or unsupported(graph, chain) is not None:
        return []
    shapes = shapes if shapes is not None else pipeline_shapes(cluster, job, len(chain.layers), zero_stages, allow_async)
    graphs: dict[int, tuple[OpGraph, CostModel]] = {}
    out: list[PipeSolution] = []
    for shape in shapes:
        m = shape.micro_batches
        if m not in graphs:
            g = micro_batch_graph(graph, m)
            graphs[m] = (g, CostModel(g, cluster, job.model_copy(update={"global_batch": job.global_batch // m}),
                                      profile=profile))
        g, cm = graphs[m]
        sol = solve_shape(g, cm, shape, eps, recompute, envelope)
        if sol is not None and len(sol.root):
            out.append(sol)
            if envelope is not None:
                envelope = (np.concatenate([envelope[0], sol.root.t]), np.concatenate([envelope[1], sol.root.m]))
    return out


__all__ = ["MAX_STAGES", "MICRO_BATCH_FACTORS", "partitions", "pipeline_shapes", "search_pipelines", "solve_shape",
           "stage_band"]
