"""Baseline planners: one plan each, configured the way practitioners do it today.

Every baseline is an assignment in FT's own strategy space - a mesh, a ZeRO stage, one
configuration per op (an index into ``mesh.op_configs(op, mesh)``) and a recomputation choice
per layer of the block stack - priced by the same cost model (``evaluate.tables`` +
``evaluate.evaluate``), so the frontier can be compared with it point by point. Since the
search covers that space, no baseline may lie strictly below-left of the frontier.

Planners (each skipped when it cannot apply, e.g. the global batch does not divide dp):

- ``data-parallel``: mesh dp=N x tp1; every op splits the batch on dp where it can; ZeRO 0
  (PyTorch DDP); ``data-parallel+recompute`` also recomputes every layer of the block stack.
- ``fsdp``: the same assignment under ZeRO-3 (FSDP / FSDP2 full sharding); ``fsdp+recompute``
  adds full activation checkpointing (torchtitan's usual setting).
- ``megatron-tp{t}-dp``: t = the largest divisor of gcd(N, devices per node) (a tensor-parallel
  group inside a node) that the model allows - every op of the block stack takes its Megatron
  split, as Megatron-LM requires heads and hidden sizes to divide tp - and dp = N/t. Batch on dp;
  on tp the Megatron-LM pattern inside the block stack: q/k/v, fc1, gate/up are column-parallel,
  attention splits heads, o/fc2/down are row-parallel, the pointwise ops between a column and a
  row linear split the column's label;
  norms, residual adds, embeddings, the lm head and the loss replicate on tp. ZeRO 0: plain
  Megatron-LM DDP (``--use-distributed-optimizer``, i.e. ZeRO-1, is an opt-in flag there, and
  with dp=1 it changes nothing). ``+recompute`` recomputes every layer (``--recompute-granularity
  full --recompute-method uniform``).
- ``megatron-tp{t}-sp-dp``: the same with sequence parallelism: the norms and pointwise ops
  outside the column->row spans (residual adds, dropouts, the final norm, the embedding sum)
  split the sequence label on tp where they can.
- ``megatron-3d``: Megatron-LM's TP x PP x DP with 1F1B and equal layers per stage, tuned as
  practitioners tune it: a grid over tp (inside a node), pp and the micro-batch count, with and
  without full recomputation, keeping the fastest point that fits the memory budget.
- ``pipedream-2bw`` (only with allow_async): PipeDream-2BW's planner - equi-replicated stages,
  double-buffered weights, depth and micro-batch count chosen the same way.
- ``min-time@budget``: what Alpa / Galvatron return - the single fastest plan under a memory
  budget - taken from a search result's frontier (``result=``).

Configurations a planner asks for that the op does not offer (a dimension that does not divide)
fall back to replication on that axis; the baseline lists those ops in ``fallbacks``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from search.algorithm.chain import layer_index, recompute_var
from search.algorithm.evaluate import PipeShape, evaluate, evaluate_pipeline, micro_batch_graph, pipe_tables, tables
from search.algorithm.frontier import Factor, Stats
from search.algorithm.pipeline import MAX_STAGES, MICRO_BATCH_FACTORS
from search.algorithm.results import FrontierPoint, MeshSolution, PipeSolution, SearchResult, Solution
from search.models.graph import Op, OpGraph
from search.plans.plan import pick
from search.prices.boundaries import INFEASIBLE
from search.prices.cluster import Cluster
from search.prices.costmodel import CostModel, EdgeCosts, OpCosts, TrainingJob
from search.prices.mesh import DATA, TENSOR, Config, Mesh, MeshAxis, op_configs
from search.prices.profile import DeviceProfile, ProfileLookup
from search.prices.schedule import ScheduleName

SEQ_LABEL = "seq"          # the label sequence parallelism splits
MEGATRON_ZERO = 0          # Megatron-LM's default DDP; its distributed optimizer (ZeRO-1) is opt-in
SP_KINDS = ("norm", "elementwise")  # ops sequence parallelism moves into the sequence-split region

DP, TP = "dp", "tp"

# rewrites one plan's op and edge cost tables before pricing (`paretoplan estimate`'s selective
# recomputation); it returns new dicts and leaves the given ones as they are
AdjustTables = Callable[[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts]],
                        tuple[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts]]]


@dataclass
class Baseline:
    name: str
    description: str
    time_s: float
    memory_bytes: float
    # mesh_index = this baseline's position in the list `baselines` returns, so that
    # [b.solution for b in bs][b.point.mesh_index] is b.solution (see `as_result`)
    point: FrontierPoint
    solution: Solution
    breakdown: dict[str, float] = field(default_factory=dict)   # params, grads, optimizer, activations, buffers
    comm_bytes: dict[str, float] = field(default_factory=dict)  # bytes sent per device per iteration, per axis
    fallbacks: list[str] = field(default_factory=list)          # ops that could not take the planned config

    @property
    def feasible(self) -> bool:
        """False when the layout breaks a rule of where placements may change (a pair priced
        INFEASIBLE, search/prices/boundaries.py): no torch program runs it as priced."""
        return self.time_s < INFEASIBLE and self.memory_bytes < INFEASIBLE

    @property
    def mesh(self) -> Mesh:
        return self.solution.mesh

    @property
    def zero(self) -> int:
        return self.solution.zero

    def configs(self, graph: OpGraph) -> dict[str, Config]:
        """op name -> its configuration (one label or None per mesh axis)."""
        mesh = self.solution.mesh
        row = self.point.row
        return {op.name: op_configs(op, mesh, graph.batch_label)[int(self.point.configs[op.name][row])] for op in graph.ops}

    def recomputed_layers(self) -> list[int]:
        return sorted(int(k.split("@")[1]) for k, v in self.point.configs.items()
                      if k.startswith("recompute@") and int(v[self.point.row]))


# ---- labels ------------------------------------------------------------------------------------
def _param_labels(op: Op) -> set[str]:
    return {d for p in op.params for d in p.dims}


def column_label(op: Op, batch: str) -> str | None:
    """A Linear's (or an embedding's) output-features label: on a parameter and on the output."""
    params = _param_labels(op)
    return next((lab for lab in op.splittable if lab != batch and lab in params and lab in op.output.dims), None)


def row_label(op: Op, batch: str) -> str | None:
    """A Linear's reduction label (an embedding's vocabulary): on a parameter, not on the output."""
    params = _param_labels(op)
    return next((lab for lab in op.splittable if lab != batch and lab in params and lab not in op.output.dims), None)


def heads_label(op: Op, batch: str) -> str | None:
    """The label an attention op splits across devices: its first splittable label other than batch."""
    return next((lab for lab in op.splittable if lab != batch), None)


# ---- turning wishes into configuration indices --------------------------------------------------
def _choose(op: Op, mesh: Mesh, want: dict[str, str | None], cache: dict[str, list[Config]],
            batch: str) -> tuple[int, bool]:
    """Index of the configuration closest to `want` (axis name -> label; a label the op cannot
    split at all means replicate): the wished config if the op offers it, else the one with the
    fewest axes replicated instead (inner axes give way first). Returns (index, whether it had
    to fall back because a wished split does not divide)."""
    cfgs = cache.setdefault(op.name, op_configs(op, mesh, batch))
    wished = tuple(want.get(ax.name) if ax.size > 1 and want.get(ax.name) in op.splittable else None
                   for ax in mesh.axes)
    index = {c: i for i, c in enumerate(cfgs)}
    if wished in index:  # a label the op does not have is no fallback: the op simply replicates
        return index[wished], False
    set_axes = [i for i, lab in enumerate(wished) if lab is not None]
    for k in range(1, len(set_axes) + 1):
        for drop in itertools.combinations(reversed(set_axes), k):
            cand = tuple(None if i in drop else lab for i, lab in enumerate(wished))
            if cand in index:
                return index[cand], True
    return index[tuple(None for _ in mesh.axes)], True


def _mesh(cluster: Cluster, tp: int) -> Mesh:
    """The same mesh the search builds for this tp (mesh.mesh_candidates)."""
    n = cluster.num_devices
    return Mesh(pp=1, axes=(MeshAxis(DP, n // tp, tp, DATA), MeshAxis(TP, tp, 1, TENSOR)))


def tp_only_mesh(tp: int) -> Mesh:
    """A mesh of `tp` devices on the tensor axis and none on the data axis."""
    return Mesh(pp=1, axes=(MeshAxis(DP, 1, tp, DATA), MeshAxis(TP, tp, 1, TENSOR)))


def block_ops(graph: OpGraph) -> list[list[str]]:
    return [list(layer) for b in graph.blocks for layer in b.layers]


def megatron_tp_labels(graph: OpGraph, sequence_parallel: bool = False) -> dict[str, str | None]:
    """op name -> the label Megatron-LM's tensor parallelism splits on the tp axis (None: replicate).

    Inside each layer of the block stack, in topological order: a Linear whose reduction label is
    the output-features label of an earlier column Linear or an attention op's heads label is
    row-parallel (o, fc2, down); any other Linear is column-parallel (q, k, v, fc1, gate, up) and
    its output label joins the layer's split span; attention splits heads; any other op that can
    split a label of the span does (gelu, the SwiGLU product, rotary embeddings, unfused attention
    matmuls and softmax). Outside the stack the vocabulary splits (Megatron's LM head, and
    the input embedding tied to it). Everything else
    replicates, or with `sequence_parallel`, norms and pointwise ops split the sequence label
    where they can."""
    batch = graph.batch_label
    order = {op.name: i for i, op in enumerate(graph.topological())}
    tp: dict[str, str | None] = {op.name: None for op in graph.ops}
    for layer in block_ops(graph):
        span: set[str] = set()
        for name in sorted(layer, key=order.__getitem__):
            op = graph.op(name)
            if op.kind == "linear":
                col, row = column_label(op, batch), row_label(op, batch)
                if row is not None and row in span:
                    tp[name] = row
                elif col is not None:
                    tp[name] = col
                    span.add(col)
            elif op.kind == "attention":
                heads = heads_label(op, batch)
                tp[name] = heads
                if heads is not None:
                    span.add(heads)
            else:
                tp[name] = next((lab for lab in op.splittable if lab in span), None)
    # outside the stack, Megatron splits the vocabulary: the LM head's output columns (gathered
    # where the head's module ends: the loss reads whole logits, as the graph has no
    # vocab-parallel cross-entropy) and, when it shares the head's weight, the input embedding
    # (partial sums, reduced as they leave it)
    inner = {name for layer in block_ops(graph) for name in layer}
    head_weights: set[str] = set()
    head = next((op for op in reversed(graph.topological()) if op.kind == "linear" and op.name not in inner), None)
    if head is not None and inner and order[head.name] > max(order[n] for n in inner):  # the last Linear: logits
        tp[head.name] = column_label(head, batch)
        head_weights.update(p.name for p in head.params if tp[head.name] in p.dims)
    for op in graph.ops:
        if op.name not in inner and op.kind == "embedding" and head_weights.intersection(p.name for p in op.params):
            tp[op.name] = row_label(op, batch)
    if sequence_parallel:
        for op in graph.ops:
            if tp[op.name] is None and op.kind in SP_KINDS and SEQ_LABEL in op.splittable:
                tp[op.name] = SEQ_LABEL
    return tp


# ---- costing ----------------------------------------------------------------------------------
class Pricer:
    """Cost tables per (mesh, zero), built once per `baselines` call."""

    def __init__(self, graph: OpGraph, cluster: Cluster, job: TrainingJob,
                 profile: DeviceProfile | ProfileLookup | None = None) -> None:
        self.graph, self.cluster, self.job, self.profile = graph, cluster, job, profile
        self.cm = CostModel(graph, cluster, job, profile=profile)
        self.layer_of = layer_index(graph)
        self.n_layers = len(graph.blocks[0].layers) if graph.blocks else 0
        self._tables: dict[tuple[Mesh, int], tuple[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts], float]] = {}
        self._cfgs: dict[Mesh, dict[str, list[Config]]] = {}
        self._micro: dict[int, tuple[OpGraph, CostModel]] = {}

    def tables(self, mesh: Mesh, zero: int) -> tuple[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts], float]:
        key = (mesh, zero)
        if key not in self._tables:
            ops, edges = tables(self.graph, self.cm, mesh, zero)
            self._tables[key] = (ops, edges, self.cm.buffers(mesh, zero=zero))
        return self._tables[key]

    def micro_batch(self, m: int) -> tuple[OpGraph, CostModel]:
        """The graph of one of m micro-batches and its cost model."""
        if m not in self._micro:
            g = micro_batch_graph(self.graph, m)
            job = self.job.model_copy(update={"global_batch": self.job.global_batch // m})
            self._micro[m] = (g, CostModel(g, self.cluster, job, profile=self.profile))
        return self._micro[m]

    def assign(self, mesh: Mesh, dp: dict[str, str | None], tp: dict[str, str | None]
               ) -> tuple[dict[str, int], list[str]]:
        cache = self._cfgs.setdefault(mesh, {})
        out, fallbacks = {}, []
        for op in self.graph.ops:
            idx, fell = _choose(op, mesh, {DP: dp.get(op.name), TP: tp.get(op.name)}, cache,
                                 self.graph.batch_label)
            out[op.name] = idx
            if fell:
                fallbacks.append(op.name)
        return out, fallbacks

    def price(self, name: str, description: str, mesh: Mesh, zero: int, assignment: dict[str, int],
              recompute: bool, fallbacks: list[str], adjust: AdjustTables | None = None) -> Baseline:
        """One plan on `mesh` priced from its tables (through `adjust` first, when given: e.g. a
        recomputation the per-layer choice cannot express)."""
        ops, edges, buffers = self.tables(mesh, zero)
        if adjust is not None:
            ops, edges = adjust(ops, edges)
        configs = {k: np.array([v]) for k, v in assignment.items()}
        for i in range(self.n_layers):
            configs[recompute_var(i)] = np.array([int(recompute)])
        res = evaluate(ops, edges, buffers, configs, self.layer_of)
        t, m = float(res["time"][0]), float(res["memory"][0])
        root = Factor(scope=(), keys=np.zeros((1, 0), dtype=np.int32), t=np.array([t]), m=np.array([m]))
        sol = MeshSolution(mesh=mesh, root=root, chain=None, op_costs=ops, edge_costs=edges, buffers=buffers,
                           stats=Stats(), zero=zero, assigns=configs)
        parts = res["parts"][0]
        breakdown = {"params": float(parts[0]), "grads": float(parts[1]), "optimizer": float(parts[2]),
                     "activations": float(parts[3]), "buffers": float(buffers)}
        comm = {ax.name: float(res["comm"][0][a]) for a, ax in enumerate(mesh.axes)}
        if fallbacks:
            description += f"; {len(fallbacks)} ops replicate where the planned split does not divide"
        return Baseline(name=name, description=description, time_s=t, memory_bytes=m,
                        point=FrontierPoint(time_s=t, memory_bytes=m, mesh_index=-1, configs=configs, row=0),
                        solution=sol, breakdown=breakdown, comm_bytes=comm, fallbacks=fallbacks)


# ---- the planners -------------------------------------------------------------------------------
def batch_on_dp(graph: OpGraph) -> dict[str, str | None]:
    return {op.name: graph.batch_label for op in graph.ops}


def _batch_divides(job: TrainingJob, dp: int) -> bool:
    return job.global_batch % dp == 0


def data_parallel(pr: Pricer) -> list[Baseline]:
    graph, cluster = pr.graph, pr.cluster
    n = cluster.num_devices
    if not _batch_divides(pr.job, n):
        return []
    mesh = _mesh(cluster, 1)
    assignment, fallbacks = pr.assign(mesh, batch_on_dp(graph), {})
    out = [pr.price("data-parallel", f"DDP: batch split {n} ways, parameters replicated, ZeRO 0", mesh, 0,
                    assignment, False, fallbacks),
           pr.price("fsdp", f"FSDP (ZeRO-3): batch split {n} ways, parameters, gradients and optimizer "
                    "states sharded and all-gathered per use", mesh, 3, assignment, False, fallbacks)]
    if pr.n_layers:
        out += [pr.price("data-parallel+recompute", "DDP with every layer of the block stack recomputed",
                         mesh, 0, assignment, True, fallbacks),
                pr.price("fsdp+recompute", "FSDP (ZeRO-3) with full activation checkpointing of every layer",
                         mesh, 3, assignment, True, fallbacks)]
    return out


def megatron_tp_size(pr: Pricer) -> int | None:
    """The largest tensor-parallel size a Megatron-LM user can set: it divides the devices per
    node and the device count (tp stays inside a node) and every op of the block stack can take
    its Megatron split (Megatron-LM requires the heads, the hidden and the FFN sizes to divide
    tp; GPT-2's 12 heads allow tp 4 on a node of 8, not 8). None if only tp 1 qualifies."""
    graph, cluster = pr.graph, pr.cluster
    n = cluster.num_devices
    g = math.gcd(n, cluster.devices_per_node)
    block = {name for layer in block_ops(graph) for name in layer}
    tp = megatron_tp_labels(graph)
    for t in sorted((d for d in range(2, g + 1) if g % d == 0), reverse=True):
        if not _batch_divides(pr.job, n // t):
            continue
        _, fallbacks = pr.assign(_mesh(cluster, t), batch_on_dp(graph), tp)
        if not block.intersection(fallbacks):
            return t
    return None


def megatron(pr: Pricer) -> list[Baseline]:
    graph, cluster = pr.graph, pr.cluster
    n = cluster.num_devices
    t = megatron_tp_size(pr) if graph.blocks else None
    if t is None:
        return []
    mesh = _mesh(cluster, t)
    dp = batch_on_dp(graph)
    out = []
    for sp in (False, True):
        tp = megatron_tp_labels(graph, sequence_parallel=sp)
        if sp and tp == megatron_tp_labels(graph):
            continue  # nothing to split on the sequence: identical to the plain plan
        assignment, fallbacks = pr.assign(mesh, dp, tp)
        name = f"megatron-tp{t}{'-sp' if sp else ''}-dp"
        desc = (f"Megatron-LM: tensor parallel {t} inside a node (column q/k/v/fc1, heads, row o/fc2)"
                f"{', sequence-parallel norms and residuals' if sp else ''}, data parallel {n // t}, "
                f"ZeRO {MEGATRON_ZERO}")
        out.append(pr.price(name, desc, mesh, MEGATRON_ZERO, assignment, False, fallbacks))
        out.append(pr.price(name + "+recompute", desc + ", every layer recomputed", mesh, MEGATRON_ZERO,
                            assignment, True, fallbacks))
    return out


# ---- pipeline planners: a grid search over (tp, pp, micro-batches), as practitioners tune them ----
def uniform_split(n_layers: int, p: int) -> tuple[int, ...]:
    """Megatron-LM's split: equal layers per stage (the remainder on the first stages)."""
    return tuple(n_layers // p + (1 if s < n_layers % p else 0) for s in range(p))


@dataclass(frozen=True)
class GridPoint:
    """One pipeline configuration a planner's grid tries."""

    tp: int
    p: int
    m: int
    schedule: ScheduleName
    zero: int
    recompute: bool
    tp_labels: dict[str, str | None]
    virtual_stages: int = 1  # > 1: interleaved 1F1B (no planner's grid has it; `paretoplan estimate` prices it)


@dataclass
class Candidate:
    """A grid point priced: one plan, as a PipeSolution with one point."""

    time_s: float
    memory_bytes: float
    solution: PipeSolution
    configs: dict[str, np.ndarray]
    split: tuple[int, ...]
    breakdown: dict[str, float]
    fallbacks: list[str]


def pipeline_candidate(pr: Pricer, gp: GridPoint, adjust: AdjustTables | None = None,
                       min_layers: int = 3) -> Candidate | None:
    """One pipeline plan on the grid, priced stage by stage; None if it cannot be built.
    `adjust` rewrites the unweighted tables before pricing; `min_layers` is the shortest block
    stack to cut (pipe_tables)."""
    g, cm = pr.micro_batch(gp.m)
    n = pr.cluster.num_devices
    sub = Mesh(pp=1, axes=(MeshAxis(DP, n // (gp.tp * gp.p), gp.tp, DATA), MeshAxis(TP, gp.tp, 1, TENSOR)))
    shape = PipeShape(Mesh(pp=gp.p, axes=sub.axes), gp.zero, gp.m, gp.schedule, gp.virtual_stages)
    tabs = pipe_tables(g, cm, shape, min_layers)
    if tabs is None:
        return None
    if adjust is not None:
        ops, edges = adjust(tabs.op_costs, tabs.edge_costs)
        tabs = dataclasses.replace(tabs, op_costs=ops, edge_costs=edges)
    cfg_cache: dict[str, list[Config]] = {}
    configs: dict[str, np.ndarray] = {}
    fallbacks = []
    for op in g.ops:
        idx, fell = _choose(op, sub, {DP: g.batch_label, TP: gp.tp_labels.get(op.name)}, cfg_cache, g.batch_label)
        configs[op.name] = np.array([idx])
        if fell:
            fallbacks.append(op.name)
    for layer in tabs.chain.layers[1:]:  # the stack's layout is tied, as in the searched space
        configs[layer[-1]] = configs[tabs.chain.boundary]
    for i in range(len(tabs.chain.layers)):
        configs[recompute_var(i)] = np.array([int(gp.recompute)])
    split = uniform_split(len(tabs.chain.layers), gp.p)
    res = evaluate_pipeline(tabs, configs, split)
    t, mem = float(res["time"][0]), float(res["memory"][0])
    root = Factor(scope=(), keys=np.zeros((1, 0), dtype=np.int32), t=np.array([t]), m=np.array([mem]))
    parts = res["parts"][0]
    breakdown = {"params": float(parts[0]), "grads": float(parts[1]), "optimizer": float(parts[2]),
                 "activations": float(parts[3]), "buffers": float(tabs.buffers)}
    return Candidate(t, mem, PipeSolution.of(tabs, root, [split], configs), configs, split, breakdown, fallbacks)


def _grid_pick(pr: Pricer, name: str, describe: Callable[[GridPoint, tuple[int, ...]], str],
               grid: list[GridPoint], budget: float) -> list[Baseline]:
    """Price every grid point, keep the fastest that fits the budget (else the leanest)."""
    priced = []
    for gp in grid:
        got = pipeline_candidate(pr, gp)
        if got is not None:
            priced.append((gp, got))
    if not priced:
        return []
    fitting = [x for x in priced if x[1].memory_bytes <= budget]
    gp, c = (min(fitting, key=lambda x: (x[1].time_s, x[1].memory_bytes)) if fitting
             else min(priced, key=lambda x: x[1].memory_bytes))
    desc = describe(gp, c.split) + ("" if fitting else f"; nothing on its grid fits {budget / 2**30:.1f} GiB: the leanest")
    return [Baseline(name=name, description=desc, time_s=c.time_s, memory_bytes=c.memory_bytes,
                     point=FrontierPoint(time_s=c.time_s, memory_bytes=c.memory_bytes, mesh_index=-1, configs=c.configs,
                                         row=0, stages=c.split),
                     solution=c.solution, breakdown=c.breakdown, fallbacks=c.fallbacks)]


def _pipeline_grid(pr: Pricer, tps: list[int], recompute: tuple[bool, ...]) -> Iterator[tuple[int, int, int, bool]]:
    """(tp, pp, micro-batches, recompute) wherever the devices and the global batch divide."""
    n, B = pr.cluster.num_devices, pr.job.global_batch
    for tp in tps:
        for p in range(2, min(n // tp, pr.n_layers, MAX_STAGES) + 1):
            if (n // tp) % p:
                continue
            dp = n // tp // p
            for f in MICRO_BATCH_FACTORS:
                m = f * p
                if B % m or (B // m) % dp:
                    continue
                for rc in recompute:
                    yield tp, p, m, rc


def megatron_3d(pr: Pricer, budget: float) -> list[Baseline]:
    """Megatron-LM 3-D parallelism (TP x PP x DP, 1F1B, equal layers per stage), tuned the way
    practitioners do: a grid over tp (inside a node), pp and the micro-batch count, with and
    without full recomputation, keeping the fastest configuration that fits the budget."""
    if not pr.graph.blocks or pr.n_layers < 2:
        return []
    g = math.gcd(pr.cluster.num_devices, pr.cluster.devices_per_node)
    labels = megatron_tp_labels(pr.graph)
    block = {name for layer in block_ops(pr.graph) for name in layer}
    # whether Megatron's split divides every block op is a question of tp alone: ask it on a mesh
    # of the tp axis only, as the grid's data-parallel size is chosen later (and may not be n // tp)
    tps = [1] + [t for t in range(2, g + 1) if g % t == 0
                 and not block.intersection(pr.assign(tp_only_mesh(t), {}, labels)[1])]
    grid = [GridPoint(tp, p, m, "1f1b", MEGATRON_ZERO, rc, labels) for tp, p, m, rc in _pipeline_grid(pr, tps, (False, True))]

    def describe(gp: GridPoint, split: tuple[int, ...]) -> str:
        dp = pr.cluster.num_devices // (gp.tp * gp.p)
        return (f"Megatron-LM 3-D: tp {gp.tp} x pp {gp.p} x dp {dp}, 1F1B with {gp.m} micro-batches, layers "
                f"{'/'.join(map(str, split))}, ZeRO {gp.zero}{', every layer recomputed' if gp.recompute else ''} "
                "(fastest fitting point of a tp/pp/micro-batch grid)")

    return _grid_pick(pr, "megatron-3d", describe, grid, budget)


def pipedream_2bw(pr: Pricer, budget: float) -> list[Baseline]:
    """PipeDream-2BW's planner: equi-replicated stages (every stage data-parallel over the same
    number of devices, no tensor parallelism), double-buffered weights, the depth and micro-batch
    count chosen for throughput within memory, with or without recomputation."""
    if not pr.graph.blocks or pr.n_layers < 2:
        return []
    grid = [GridPoint(1, p, m, "2bw", 0, rc, {}) for _, p, m, rc in _pipeline_grid(pr, [1], (False, True))]

    def describe(gp: GridPoint, split: tuple[int, ...]) -> str:
        dp = pr.cluster.num_devices // gp.p
        return (f"PipeDream-2BW: {gp.p} stages each replicated {dp} ways, {gp.m} micro-batches per update, 1-stale "
                f"weights, layers {'/'.join(map(str, split))}{', every layer recomputed' if gp.recompute else ''}")

    return _grid_pick(pr, "pipedream-2bw", describe, grid, budget)


def min_time_at_budget(result: SearchResult, budget: float, points: list[FrontierPoint] | None = None
                       ) -> Baseline | None:
    """The fastest frontier point within `budget` bytes per device (less memory on ties)."""
    p = pick(result.points if points is None else points, budget)
    if p is None:
        return None
    sol = result.solutions[p.mesh_index]
    return Baseline(name="min-time@budget",
                    description=f"fastest searched plan within {budget / 2**30:.2f} GiB per device "
                                f"(Alpa/Galvatron-style single answer): {sol.describe()}",
                    time_s=p.time_s, memory_bytes=p.memory_bytes,
                    point=FrontierPoint(time_s=p.time_s, memory_bytes=p.memory_bytes, mesh_index=-1,
                                        configs=p.configs, row=p.row, stages=p.stages),
                    solution=sol)


def baselines(graph: OpGraph, cluster: Cluster, job: TrainingJob, budget: float | None = None,
              frontier: list[FrontierPoint] | SearchResult | None = None,
              result: SearchResult | None = None, profile: DeviceProfile | ProfileLookup | None = None,
              pipelines: bool = True,
              allow_async: bool = False) -> list[Baseline]:
    """Every baseline that applies, each priced by the search's own cost model (with the
    search's DeviceProfile, `profile`, when it had one).

    ``min-time@budget`` needs a budget and the search result the frontier came from (``result``,
    or a SearchResult passed as ``frontier``); a plain list of points in ``frontier`` then
    restricts which of the result's points it may pick."""
    if isinstance(frontier, SearchResult):
        result, frontier = frontier, None
    if frontier is not None and result is None and budget is not None:
        raise ValueError("min-time@budget needs the SearchResult its frontier points index into: pass result=")
    pr = Pricer(graph, cluster, job, profile)
    out = data_parallel(pr) + megatron(pr)
    fit = budget if budget is not None else float(cluster.memory_per_device)
    if pipelines:
        out += megatron_3d(pr, fit) + (pipedream_2bw(pr, fit) if allow_async else [])
    if budget is not None and result is not None:
        b = min_time_at_budget(result, budget, frontier)
        if b is not None:
            out.append(b)
    for i, b in enumerate(out):
        b.point.mesh_index = i
    return out


def as_result(graph: OpGraph, cluster: Cluster, job: TrainingJob, bs: list[Baseline]) -> SearchResult:
    """The baselines as a SearchResult (one solution and one point each), e.g. for plan.build_plans."""
    return SearchResult(graph=graph, cluster=cluster, job=job, solutions=[b.solution for b in bs],
                        points=[FrontierPoint(time_s=b.time_s, memory_bytes=b.memory_bytes, mesh_index=i,
                                              configs=b.point.configs, row=b.point.row, stages=b.point.stages)
                                for i, b in enumerate(bs)],
                        search_seconds=0.0, eps=0.0, stats={"baselines": [b.name for b in bs]})


class Priced(Protocol):
    """Anything with a predicted time and memory: a FrontierPoint, a Baseline, a stored
    frontier entry, an estimate."""

    @property
    def time_s(self) -> float: ...
    @property
    def memory_bytes(self) -> float: ...


def against_frontier(points: Sequence[Priced], b: Priced) -> dict:
    """The frontier point that beats baseline b at its memory (fastest within it) and at its
    time (leanest within it), and by how much (None where no frontier point qualifies)."""
    at_mem = min((i for i, p in enumerate(points) if p.memory_bytes <= b.memory_bytes * (1 + 1e-9)),
                 key=lambda i: points[i].time_s, default=None)
    at_time = min((i for i, p in enumerate(points) if p.time_s <= b.time_s * (1 + 1e-9)),
                  key=lambda i: points[i].memory_bytes, default=None)
    return {
        "faster_point": at_mem,
        "speedup": b.time_s / points[at_mem].time_s if at_mem is not None else None,
        "leaner_point": at_time,
        "memory_ratio": b.memory_bytes / points[at_time].memory_bytes if at_time is not None else None,
    }
