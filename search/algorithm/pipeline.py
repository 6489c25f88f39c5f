"""Pipeline parallelism in the search (DESIGN.md section 5, last part).

A pipeline plan puts the devices in a pp x dp x tp mesh: the block stack is cut into p stages of
consecutive layers (the ops before the stack go with stage 0, those after it with the last
stage), every stage runs on its own dp x tp sub-mesh with per-op configurations as in FT, and
the global batch runs as m micro-batches under a schedule (search/prices/schedule.py).

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
from dataclasses import dataclass, field

import numpy as np

from search.algorithm.frontier import RTOL, Factor, Stats, assignments, join, pareto_mask, select
from search.algorithm.ft import Chain, _least_memory, _staircase, after_stack, find_chain, layer_index, mesh_costs, prepare_mesh
from search.models.graph import OpGraph
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts, TrainingJob
from search.prices.mesh import (
    Mesh,
    data_ways,
    mesh_candidates,
    op_configs,
    output_placement,
    param_placement,
    shard_factor,
    unplaceable_op,
)
from search.prices.schedule import ScheduleName, in_flight, weight_copies

STAGE_BAND = 2
MAX_STAGES = 16  # deeper pipelines leave a layer or two per stage; Megatron's largest runs use <= 16
MICRO_BATCH_FACTORS = (1, 2, 4, 8)  # m = factor * p
PIPELINE_ZERO = (0, 1)


@dataclass(frozen=True)
class Weights:
    """How one stage's per-op costs scale: per-micro-batch time x slots, weights x copies,
    activations x in-flight micro-batches."""

    slots: int
    copies: int
    inflight: int


def stage_weights(p: int, m: int, schedule: ScheduleName) -> list[Weights]:
    slots = m if schedule == "2bw" else m + p - 1
    return [Weights(slots, weight_copies(schedule), in_flight(s, p, m, schedule)) for s in range(p)]


def micro_batch_graph(graph: OpGraph, m: int) -> OpGraph:
    """The graph of one micro-batch: every batch dimension divided by m (FLOPs scale with it)."""
    if m == 1:
        return graph
    lab = graph.batch_label

    def scaled(t):
        if lab not in t.dims:
            return t
        return t.model_copy(update={"shape": tuple(s // m if d == lab else s for s, d in zip(t.shape, t.dims))})

    ops = []
    for op in graph.ops:
        batched = lab in op.output.dims or any(lab in t.dims for t in op.inputs)
        ops.append(op.model_copy(update={"inputs": tuple(scaled(t) for t in op.inputs), "output": scaled(op.output),
                                         "flops": op.flops / m if batched else op.flops}))
    meta = dict(graph.meta)
    if "global_batch" in meta:
        meta["global_batch"] = int(meta["global_batch"]) // m
    out = graph.model_copy(update={"ops": tuple(ops), "meta": meta})
    out.__dict__.pop("_op_index", None)  # model_copy copies the name -> op cache of the full-batch graph
    return out


def weigh_op(oc: OpCosts, w: Weights) -> OpCosts:
    step = oc.step if oc.step is not None else np.zeros_like(oc.time)
    scale = np.array([w.copies, 1.0, 1.0, w.inflight])
    parts, parts_rc = oc.parts * scale, oc.parts_rc * scale
    return OpCosts(configs=oc.configs, time=w.slots * (oc.time - step) + step, mem=parts.sum(axis=1), parts=parts,
                   comm=oc.comm * w.slots, time_rc=w.slots * (oc.time_rc - step) + step, mem_rc=parts_rc.sum(axis=1),
                   parts_rc=parts_rc, estimated=oc.estimated, step=step)


def weigh_edge(ec: EdgeCosts, w: Weights) -> EdgeCosts:
    return EdgeCosts(src=ec.src, dst=ec.dst, time=ec.time * w.slots, mem=ec.mem * w.inflight, comm=ec.comm * w.slots)


class _WeightedModel:
    """A CostModel whose edges are priced under one stage's weights (ops are weighed by the
    caller, from tables computed once)."""

    def __init__(self, cm: CostModel, w: Weights) -> None:
        self._cm, self._w = cm, w

    def edge_costs(self, *args) -> EdgeCosts:
        return weigh_edge(self._cm.edge_costs(*args), self._w)

    def pair_costs(self, *args) -> EdgeCosts:
        return weigh_edge(self._cm.pair_costs(*args), self._w)

    def __getattr__(self, name: str):
        return getattr(self._cm, name)


def unsupported(graph: OpGraph, chain: Chain | None) -> str | None:
    """Why this graph cannot be pipelined by the search (None if it can)."""
    if chain is None:
        return "no stack of at least 3 identical layers"
    tail = after_stack(graph, chain)
    last = chain.layers[-1][-1]
    for name in tail:
        for t in graph.op(name).inputs:
            if t.source is not None and t.source not in tail and t.source != last:
                return f"op {name} after the stack reads {t.source} from before it"
    return None


@dataclass
class PipeShape:
    mesh: Mesh            # pp = stages, axes = the stage's dp x tp sub-mesh
    zero: int
    micro_batches: int
    schedule: ScheduleName

    @property
    def stages(self) -> int:
        return self.mesh.pp

    def describe(self) -> str:
        return f"{self.mesh.describe()} zero{self.zero} {self.schedule} m{self.micro_batches}"


@dataclass
class PipeSolution:
    """One pipeline shape's frontier, with what plan building and re-costing need. Plays the
    role of ft.MeshSolution in a SearchResult (`root` holds the points, `chain` the layers)."""

    shape: PipeShape
    graph: OpGraph                               # the micro-batch graph
    chain: Chain
    op_costs: dict[str, OpCosts]                 # unweighted, one micro-batch, every op
    edge_costs: dict[tuple[str, str], EdgeCosts]
    buffers: float
    p2p: np.ndarray                              # [boundary configs] seconds per micro-batch, both ways
    p2p_bytes: np.ndarray                        # [boundary configs] bytes sent per micro-batch, one way
    root: Factor
    partitions: list[tuple[int, ...]]            # per point: layers per stage
    assigns: dict[str, np.ndarray]               # per point: every op's configuration, recompute vars
    stats: Stats = field(default_factory=Stats)

    @property
    def mesh(self) -> Mesh:
        return self.shape.mesh

    @property
    def zero(self) -> int:
        return self.shape.zero

    def describe(self) -> str:
        return self.shape.describe()


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


def p2p_costs(graph: OpGraph, cm: CostModel, shape: PipeShape, boundary: str, configs) -> tuple[np.ndarray, np.ndarray]:
    """Seconds (activation forward plus its gradient back) and bytes per micro-batch of sending
    the boundary tensor, in each boundary configuration, between neighbouring stages."""
    op = graph.op(boundary)
    inner = shape.mesh.num_devices // shape.stages
    alpha, beta = cm.p2p_coefficients(shape.stages, inner)
    nbytes = np.array([op.output.numel * cm.esize(op.output) / shard_factor(output_placement(c, op), shape.mesh)
                       for c in configs])
    return 2.0 * (alpha + beta * nbytes), nbytes


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
        self.stair = _staircase(np.asarray(t, dtype=float), np.asarray(m, dtype=float))
        self.buffers = buffers
        self.floor_t, self.floor_m = floor  # no plan of the shape is faster or leaner than this
        self.enabled = len(t) > 0

    def admit(self, t: np.ndarray, m: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return np.ones(len(t), dtype=bool)
        return (_least_memory(self.stair, np.maximum(t, self.floor_t))
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


def pipe_tables(graph: OpGraph, cm: CostModel, shape: PipeShape) -> PipeSolution | None:
    """Unweighted cost tables of one micro-batch on the stage sub-mesh, and the boundary
    transfers: what the DP, plan re-costing, the planners and the exhaustive reference share.
    `graph` and `cm` are the micro-batch graph and its cost model. None if it cannot pipeline."""
    chain = find_chain(graph)
    if unsupported(graph, chain) is not None or len(chain.layers) < shape.stages:  # type: ignore[union-attr]
        return None
    assert chain is not None
    sub = Mesh(pp=1, axes=shape.mesh.axes)
    if unplaceable_op(graph.ops, sub, graph.batch_label) is not None:
        return None  # the micro-batch does not split over the stage's data-parallel ranks
    # layers 2.. are priced with the template layer's tables (identical ops, identical costs)
    base = mesh_costs(graph, cm, sub, shape.zero, chain)
    base.update(_tied_copies(graph, cm, sub, shape, chain))
    edges = _all_edges(graph, cm, sub, base, chain, skip={n for layer in chain.layers[2:] for n in layer})
    template = set(chain.template)
    template_edges = {k: ec for k, ec in edges.items() if k[1] in template}
    for i in range(2, len(chain.layers)):
        names = dict(zip(chain.template, chain.layers[i]))
        names[chain.boundary] = chain.layers[i - 1][-1]
        for a, b in zip(chain.template, chain.layers[i]):
            base[b] = base[a]
        for (src, dst), ec in template_edges.items():
            edges[(names.get(src, src), names[dst])] = ec
    p2p, p2p_bytes = p2p_costs(graph, cm, shape, chain.boundary, base[chain.boundary].configs)
    covered = {name for layer in chain.layers[2:] for name in layer}
    buffers = cm.buffers(sub, [graph.op(n) for n in base if n not in covered], shape.zero)
    empty = Factor(scope=(), keys=np.zeros((0, 0), dtype=np.int32), t=np.zeros(0), m=np.zeros(0))
    return PipeSolution(shape=shape, graph=graph, chain=chain, op_costs=base, edge_costs=edges,
                        buffers=buffers, p2p=p2p, p2p_bytes=p2p_bytes, root=empty, partitions=[], assigns={})


def _floor(tables: PipeSolution) -> tuple[float, float]:
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


def solve_shape(graph: OpGraph, cm: CostModel, shape: PipeShape, eps: float = 0.0,
                recompute: bool = True, envelope: tuple[np.ndarray, np.ndarray] | None = None) -> PipeSolution | None:
    """The frontier of one pipeline shape over stage boundaries and every op's configuration.
    `graph` and `cm` are the micro-batch graph and its cost model; `envelope` holds (time,
    memory) of plans known to exist, which prune partial stages that cannot win (exact)."""
    tables = pipe_tables(graph, cm, shape)
    if tables is None:
        return None
    env = _Envelope(*(envelope if envelope is not None else (np.zeros(0), np.zeros(0))), tables.buffers,
                    _floor(tables) if envelope is not None else (0.0, 0.0))
    chain, base, p2p = tables.chain, tables.op_costs, tables.p2p
    p, n = shape.stages, len(chain.layers)
    stats = Stats()
    sub = Mesh(pp=1, axes=shape.mesh.axes)
    weights = stage_weights(p, shape.micro_batches, shape.schedule)
    covered = {name for layer in chain.layers[2:] for name in layer}  # priced through the template
    problems = {}
    for w in dict.fromkeys(weights):
        weighted = {name: weigh_op(oc, w) for name, oc in base.items() if name not in covered}
        prob = prepare_mesh(graph, _WeightedModel(cm, w), sub, True, eps, shape.zero, recompute,  # type: ignore[arg-type]
                            weighted, split_outside=(w == weights[0], w == weights[-1]))
        if prob.unit is None:
            return None
        problems[w] = prob
    domain = next(iter(problems.values())).domain
    powers = {w: _Powers(prob.unit, domain, eps, stats, env) for w, prob in problems.items()}
    head, tail = problems[weights[0]].head, problems[weights[-1]].tail
    assert head is not None and tail is not None
    head, tail = env.prune(head), env.prune(tail)
    band = stage_band(n, p)

    def stage_factor(s: int, k: int) -> Factor:
        """Stage s holding k layers (stage 0 counts layer 0, which the head carries)."""
        w = weights[s]
        if s == 0:
            f = head if k == 1 else env.join(head, powers[w](k - 1), domain, eps, stats)
        else:
            f = powers[w](k)
        if s == p - 1:
            f = env.join(f, tail, domain, eps, stats)
        return f

    stage_cache: dict[tuple[int, int], Factor] = {}

    def S(s: int, k: int) -> Factor:
        if (s, k) not in stage_cache:
            stage_cache[(s, k)] = stage_factor(s, k)
        return stage_cache[(s, k)]

    # per boundary configuration: DP over stages, states = layers covered so far
    out_t, out_m, out_b, out_back = [], [], [], []
    for b in np.unique(head.keys[:, 0]):
        b = int(b)
        # state j -> (t, m, back) where back[i] = list of (k, index in S(s, k)) per stage so far
        states: dict[int, tuple[np.ndarray, np.ndarray, list[list[tuple[int, int]]]]] = {}
        for k in band:
            st, sm, idx = _staircase_of(S(0, k), b, weights[0].slots * p2p[b] if p > 1 else 0.0)
            ok = env.admit(st, sm)
            st, sm, idx = st[ok], sm[ok], idx[ok]
            if len(st):
                states[k] = (st, sm, [[(k, int(i))] for i in idx])
        for s in range(1, p):
            nxt: dict[int, tuple[np.ndarray, np.ndarray, list[list[tuple[int, int]]]]] = {}
            left_after = p - 1 - s
            for j, (ft, fm, fback) in states.items():
                for k in band:
                    jj = j + k
                    if jj + left_after * band.start > n or jj + left_after * band.stop - left_after < n:
                        continue
                    if s == p - 1 and jj != n:
                        continue
                    extra = weights[s].slots * p2p[b] if s < p - 1 else 0.0
                    st, sm, idx = _staircase_of(S(s, k), b, extra)
                    ok = env.admit(st, sm)
                    st, sm, idx = st[ok], sm[ok], idx[ok]
                    if not len(st):
                        continue
                    tt, mm, ia, ib = _maxcomb(ft, fm, st, sm)
                    back = [fback[i] + [(k, int(idx[q]))] for i, q in zip(ia, ib)]
                    if jj in nxt:
                        ot, om, oback = nxt[jj]
                        tt, mm, back = np.concatenate([ot, tt]), np.concatenate([om, mm]), oback + back
                    order = np.argsort(tt, kind="stable")
                    tt, mm, back = tt[order], mm[order], [back[i] for i in order]
                    keep = pareto_mask(np.zeros(len(tt), dtype=np.int64), tt, mm, eps)
                    keep = np.sort(keep)
                    nxt[jj] = (tt[keep], mm[keep], [back[i] for i in keep])
            states = nxt
        if n in states:
            ft, fm, fback = states[n]
            out_t.append(ft)
            out_m.append(fm)
            out_b += [b] * len(ft)
            out_back += fback
    if not out_t:
        return None
    t = np.concatenate(out_t)
    mem = np.concatenate(out_m) + tables.buffers
    keep = pareto_mask(np.zeros(len(t), dtype=np.int64), t, mem, eps)
    # read every kept point's configurations back, one batch per (stage, its first layer, layers)
    maps = chain.layer_maps()
    assigns: dict[str, np.ndarray] = {}
    parts_list: list[tuple[int, ...]] = []
    groups: dict[tuple[int, int, int], tuple[list[int], list[int]]] = {}
    for row, g in enumerate(keep):
        back = out_back[g]
        parts_list.append(tuple(k for k, _ in back))
        first = 0
        for s, (k, i) in enumerate(back):
            rows, idx = groups.setdefault((s, first, k), ([], []))
            rows.append(row)
            idx.append(i)
            first += k
    for (s, first, k), (rows, idx) in groups.items():
        got = assignments(S(s, k), np.array(idx), maps[first - 1:] if s > 0 else maps)
        for name, v in got.items():
            assigns.setdefault(name, np.zeros(len(keep), dtype=np.int64))[rows] = v
    for layer in chain.layers:  # every layer's output takes the tied boundary layout
        assigns.setdefault(layer[-1], np.zeros(len(keep), dtype=np.int64))[:] = np.array(out_b)[keep]
    tables.root = Factor(scope=(), keys=np.zeros((len(keep), 0), dtype=np.int32), t=t[keep], m=mem[keep])
    tables.partitions, tables.assigns, tables.stats = parts_list, assigns, stats
    return tables


def _tied_copies(graph: OpGraph, cm: CostModel, sub: Mesh, shape: PipeShape, chain: Chain) -> dict[str, OpCosts]:
    """Ops after the stack that read a parameter owned before it (GPT's lm head and the token
    embedding) hold a copy of it on the last stage, as Megatron-LM does: its own gradients and
    optimizer state, and an all-reduce of the gradients with the first stage once per iteration."""
    tail = after_stack(graph, chain)
    owned_in_tail = {p.name for op in graph.ops if op.name in tail for p in op.params if p.owner}
    out: dict[str, OpCosts] = {}
    for op in graph.ops:
        tied = [p for p in op.params if not p.owner and p.name not in owned_in_tail]
        if op.name not in tail or not tied:
            continue
        own = op.model_copy(update={"params": tuple(p.model_copy(update={"owner": True}) if p in tied else p
                                                    for p in op.params)})
        oc = cm.op_costs(own, sub, shape.zero)
        alpha, beta = cm.p2p_coefficients(shape.stages, sub.num_devices)
        # an all-reduce of two ranks: each sends its gradient shard and receives the other's
        grads = np.array([sum(p.numel / shard_factor(param_placement(c, p.dims), sub) for p in tied) * cm.bytes.grad
                          for c in oc.configs])
        t_tie = 2.0 * (alpha + beta * grads)
        step = (oc.step if oc.step is not None else np.zeros_like(oc.time)) + t_tie
        out[op.name] = OpCosts(configs=oc.configs, time=oc.time + t_tie, mem=oc.mem, parts=oc.parts, comm=oc.comm,
                               time_rc=oc.time_rc + t_tie, mem_rc=oc.mem_rc, parts_rc=oc.parts_rc, step=step,
                               estimated=oc.estimated)
    return out


def _all_edges(graph: OpGraph, cm: CostModel, mesh: Mesh, ops: dict[str, OpCosts], chain: Chain,
               skip: set[str] = frozenset()) -> dict[tuple[str, str], EdgeCosts]:  # type: ignore[assignment]
    """Every edge, and the pair constraints the DP applies: those within one part it solves
    together (the head with layer 0, a layer, the tail). Tied parameters across the head and the
    tail become two copies on two stages (worker/analyze.py) and are not constrained."""
    out: dict[tuple[str, str], EdgeCosts] = {}
    for op in graph.ops:
        if op.name in skip:
            continue
        for src in dict.fromkeys(t.source for t in op.inputs if t.source is not None):
            prod = graph.op(src)
            out[(src, op.name)] = cm.edge_costs(prod, op, mesh, op_configs(prod, mesh, graph.batch_label), ops[op.name].configs)
    tail = after_stack(graph, chain)
    layer_of = {name: i for i, layer in enumerate(chain.layers) if i > 0 for name in layer}  # layer 0: the head

    def part_of(name: str):
        return "tail" if name in tail else layer_of.get(name, "head")

    cm.add_pair_edges(out, mesh, lambda name: op_configs(graph.op(name), mesh, graph.batch_label),
                      [p for p in cm.bounds.pairs if p.b not in skip and part_of(p.a) == part_of(p.b)])
    return out


# ---- re-costing a pipeline assignment (plans, planners, the exhaustive reference) -------------
def stage_ops(graph: OpGraph, chain: Chain, layers_per_stage: tuple[int, ...]) -> list[set[str]]:
    """The op names of every stage."""
    tail = after_stack(graph, chain)
    in_stack = {n for layer in chain.layers for n in layer}
    head = {op.name for op in graph.ops if op.name not in tail and op.name not in in_stack}
    out, first = [], 0
    for s, k in enumerate(layers_per_stage):
        names = {n for layer in chain.layers[first:first + k] for n in layer}
        if s == 0:
            names |= head
        if s == len(layers_per_stage) - 1:
            names |= tail
        out.append(names)
        first += k
    return out


def evaluate_pipeline(sol_like: PipeSolution, assignment: dict[str, np.ndarray],
                      layers_per_stage: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Time, memory and the max-memory stage's parts for many assignments at once, straight from
    the unweighted tables: an independent check of the DP, and how plans are re-costed."""
    from search.algorithm.exhaustive import evaluate

    shape, graph, chain = sol_like.shape, sol_like.graph, sol_like.chain
    p = shape.stages
    weights = stage_weights(p, shape.micro_batches, shape.schedule)
    layer_of = layer_index(graph)
    n = np.size(next(iter(assignment.values())))
    b = np.asarray(assignment[chain.boundary]).reshape(-1)
    per_t, per_m, per_parts, per_comm = [], [], [], []
    for s, names in enumerate(stage_ops(graph, chain, layers_per_stage)):
        w = weights[s]
        ops = {k: weigh_op(oc, w) for k, oc in sol_like.op_costs.items() if k in names}
        edges = {k: weigh_edge(ec, w) for k, ec in sol_like.edge_costs.items() if k[1] in names}
        res = evaluate(ops, edges, sol_like.buffers, assignment, layer_of)
        t = res["time"] + (w.slots * sol_like.p2p[b] if s < p - 1 else 0.0)
        per_t.append(t)
        per_m.append(res["memory"])
        per_parts.append(res["parts"])
        per_comm.append(res["comm"])
    T, M = np.stack(per_t), np.stack(per_m)
    worst = np.argmax(M, axis=0)
    cols = np.arange(n)
    return {"time": T.max(axis=0), "memory": M.max(axis=0), "stage_time": T.T, "stage_memory": M.T,
            "parts": np.stack(per_parts)[worst, cols], "buffers": np.full(n, sol_like.buffers),
            "comm": np.stack(per_comm).max(axis=0),
            "pp_bytes": 2.0 * shape.micro_batches * sol_like.p2p_bytes[b]}


# ---- the whole pipeline pass --------------------------------------------------------------------
def search_pipelines(graph: OpGraph, cluster: Cluster, job: TrainingJob, zero_stages: tuple[int, ...],
                     recompute: bool = True, allow_async: bool = False, eps: float = 0.0,
                     shapes: list[PipeShape] | None = None, profile=None,
                     envelope: tuple[np.ndarray, np.ndarray] | None = None) -> list[PipeSolution]:
    """Every pipeline shape's frontier (empty when the graph has no stack to cut). With an
    `envelope` of plans known to exist (e.g. the frontier without pipelines), each shape keeps
    only the points no such plan - nor an earlier shape's - beats; without one, each shape's
    complete frontier."""
    chain = find_chain(graph)
    if unsupported(graph, chain) is not None:
        return []
    assert chain is not None
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


__all__ = ["PipeShape", "PipeSolution", "Weights", "evaluate_pipeline", "micro_batch_graph", "partitions",
           "pipe_tables", "pipeline_shapes", "search_pipelines", "solve_shape", "stage_band", "stage_ops",
           "stage_weights"]
