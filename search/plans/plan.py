"""The Plan: the one output format, from search to database to dashboard to worker.

A Plan says, for one point of the frontier, everything needed to run it without searching
again: the mesh, each op's configuration with the DTensor placements of its parameters and
output, how the layers of a block stack are configured (distinct layer configurations are
stored once as *variants*, with the variant of every layer, so a 96-layer plan stays small), and
the prediction with its memory breakdown and communication volume per mesh axis.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from search.algorithm.chain import recompute_var
from search.algorithm.evaluate import PipeShape
from search.algorithm.interleave import chunk_layers
from search.algorithm.results import FrontierPoint, SearchResult, Solution, Split
from search.models.graph import Op, OpGraph, block_layout
from search.models.source import ModelSource
from search.plans.flops import mfu, model_flops
from search.prices.accuracy import PricedFrom
from search.prices.mesh import (
    EXPERT_LABEL,
    SEQ_LABEL,
    Config,
    Mesh,
    default_role,
    format_placement,
    op_configs,
    output_placement,
    param_placement,
)

PLAN_VERSION = 2  # 2: mesh axes carry a role; one role per axis


class AxisSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    size: int
    stride: int
    role: Literal["data", "tensor", "expert", "context"]  # what torch runs on this axis: DDP/ZeRO/FSDP,
    # parallelize_module, routed experts split over it (all-to-all dispatch and combine), or the
    # sequence split over it (ring attention)

    @model_validator(mode="before")
    @classmethod
    def _role_from_name(cls, data: Any) -> Any:
        """Plans written before axes carried a role named them dp (data) and tp (tensor)."""
        if isinstance(data, dict) and "role" not in data and "name" in data:
            return {**data, "role": default_role(str(data["name"]))}
        return data


class MeshSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    pp: int = 1
    axes: list[AxisSpec]

    @property
    def shape(self) -> str:
        return " x ".join([f"pp{self.pp}"] + [f"{a.name}{a.size}" for a in self.axes])


class OpPlan(BaseModel):
    model_config = ConfigDict(frozen=True)
    op: str
    kind: str
    module: str = ""
    config: list[str] = Field(description="per mesh axis: the dimension label it shards, or 'R'")
    params: dict[str, list[str]] = Field(default_factory=dict, description="DTensor placements per parameter")
    output: list[str] = Field(default_factory=list, description="DTensor placements of the output")


class BlockPlan(BaseModel):
    prefix: str
    variants: list[list[OpPlan]] = Field(description="distinct layer configurations, ops in layer 0's names")
    layer_variant: list[int] = Field(description="the variant of every layer")


class MemoryBreakdown(BaseModel):
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers


class Prediction(BaseModel):
    time_s: float
    memory_bytes: int
    breakdown: MemoryBreakdown
    comm_bytes: dict[str, float] = Field(description="bytes sent per device per iteration, per mesh axis")
    estimated: bool = Field(default=True, description="some op or collective priced from the device catalog's "
                                                      "roofline (a profile lacked it, or there was no profile)")
    priced_from: PricedFrom = Field(default="catalog", description="catalog: the device catalog's roofline; "
                                    "profile: a DeviceProfile measured on the device (search/prices/accuracy.json "
                                    "holds the held-out error of each)")
    model_flops: float | None = Field(default=None, ge=0.0, description="forward + backward FLOPs of the model per "
                                      "iteration (3 x forward, recomputation not counted); None in plans written "
                                      "before it was recorded")
    mfu: float | None = Field(default=None, ge=0.0, description="model FLOPs utilisation: model_flops / (time_s x "
                              "devices x peak FLOP/s at the job's precision)")

    @model_validator(mode="before")
    @classmethod
    def _priced_from_estimated(cls, data: Any) -> Any:
        """Plans written before `priced_from` was recorded: a plan with no estimated cost was
        priced from a profile."""
        if isinstance(data, dict) and "priced_from" not in data and data.get("estimated") is False:
            return {**data, "priced_from": "profile"}
        return data


class PipelineSpec(BaseModel):
    """How the layers are split into pipeline stages over the mesh's pp axis (stages == 1: none).

    Stage s holds block-stack layers [stage_layers[s][0], stage_layers[s][1]); stage 0 also holds
    every op before the stack, the last stage every op after it. Interleaved (virtual_stages v >
    1): stage_layers lists the stages x v chunks in model order, chunk c on pp rank c % stages
    (search/algorithm/interleave.py); stage_time_s and stage_memory_bytes stay per pp rank."""

    stages: int = Field(default=1, ge=1)
    schedule: Literal["none", "gpipe", "1f1b", "2bw"] = "none"
    micro_batches: int = Field(default=1, ge=1)
    micro_batch_size: int | None = Field(default=None, description="samples per micro-batch per data-parallel rank")
    stage_layers: list[list[int]] = Field(default_factory=list)
    stage_time_s: list[float] = Field(default_factory=list,
                                      description="predicted iteration time per stage (its slots and its step)")
    stage_memory_bytes: list[int] = Field(default_factory=list, description="predicted peak memory per stage")
    async_weights: bool = Field(default=False, description="PipeDream-2BW: weight updates are 1-stale")
    virtual_stages: int = Field(default=1, ge=1, description="> 1: Megatron-LM's interleaved 1F1B, each device "
                                "holding this many chunks of layers (stage_layers lists the chunks)")


class Plan(BaseModel):
    version: int = PLAN_VERSION
    model: str
    source: ModelSource | None = Field(default=None, description="how a launcher rebuilds the model (zoo name, HF "
                                       "config, or an uploaded graph, which cannot be launched); None: a plan written "
                                       "before sources were recorded, whose model is a zoo name")
    cluster: str
    device: str
    num_devices: int
    devices_per_node: int
    global_batch: int
    seq_len: int | None
    precision: str
    mesh: MeshSpec
    ops: list[OpPlan] = Field(description="ops outside block stacks")
    blocks: list[BlockPlan] = Field(default_factory=list)
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec)
    zero_stage: int = 0
    recompute: list[str] = Field(default_factory=list)
    predicted: Prediction
    summary: str


# ---- from a search result ----------------------------------------------------------------------
def _op_plan(op: Op, mesh: Mesh, cfg: tuple[str | None, ...]) -> OpPlan:
    return OpPlan(
        op=op.name, kind=op.kind, module=op.module,
        config=[lab if lab is not None else "R" for lab in cfg],
        params={p.name: format_placement(param_placement(cfg, p.dims), p.dims) for p in op.params if p.owner},
        output=format_placement(output_placement(cfg, op), op.output.dims),
    )


def _role(op: Op, label: str | None, batch: str) -> str:
    if label is None:
        return "rep"
    if label == batch:
        return "batch"
    if label == EXPERT_LABEL:
        return "experts"
    if label == SEQ_LABEL and not any(label in p.dims for p in op.params):
        return "seq"  # the sequence as a row dimension (context axis, or sequence parallelism)
    in_params = any(label in p.dims for p in op.params)
    if op.kind == "attention":
        return "heads"
    if in_params:
        return "col" if label in op.output.dims else "row"
    return "other"


def weighted_ops(graph: OpGraph) -> list[tuple[Op, int]]:
    """The ops a summary describes (those carrying parameters, and attention) with their weight."""
    out = []
    for op in graph.ops:
        n = sum(p.numel for p in op.params)
        if op.kind in ("linear", "embedding", "conv", "attention") and (n or op.kind == "attention"):
            out.append((op, max(n, 1)))
    return out


def summarize(graph: OpGraph, mesh: Mesh, configs: dict[str, tuple[str | None, ...]], zero: int = 0,
              recomputed: int = 0, weighted: list[tuple[Op, int]] | None = None,
              pipe: PipelineSpec | None = None) -> str:
    """One line: the mesh, pipeline schedule, ZeRO stage and recomputed layers, then per axis how
    the parameter-carrying ops use it (by weight count)."""
    head = mesh.describe()
    if pipe is not None and pipe.stages > 1:
        v = f" interleaved v{pipe.virtual_stages}" if pipe.virtual_stages > 1 else ""
        head += f" {pipe.schedule}{v} m{pipe.micro_batches} layers {'/'.join(str(b - a) for a, b in pipe.stage_layers)}"
    elif pipe is not None and pipe.micro_batches > 1:  # one stage, m micro-batches: gradient accumulation
        head += f" accumulate m{pipe.micro_batches}"
    if zero:
        head += f" zero{zero}"
    if graph.blocks:
        b0 = graph.blocks[0]  # counted in module layers, a periodic stack's too
        head += f" recompute {recomputed}/{len(b0.layers) * block_layout(graph, b0)[1]}"
    parts = [head]
    weighted = weighted_ops(graph) if weighted is None else weighted
    for ai, ax in enumerate(mesh.axes):
        if ax.size == 1:
            continue
        weights: Counter[str] = Counter()
        for op, n in weighted:
            weights[_role(op, configs[op.name][ai], graph.batch_label)] += n
        total = sum(weights.values()) or 1
        desc = " ".join(f"{r} {100 * w / total:.0f}%" for r, w in weights.most_common() if w / total >= 0.005)
        parts.append(f"{ax.name}: {desc}")
    experts = _experts_clause(graph, mesh, configs)
    if experts:
        parts.append(experts)
    return " | ".join(parts)


def _experts_clause(graph: OpGraph, mesh: Mesh, configs: dict[str, tuple[str | None, ...]]) -> str:
    """For a graph with routed experts: how many experts each rank holds (over which axes they are
    split) and the load the prices assume."""
    total = graph.meta.get("moe_experts")
    if not isinstance(total, int):
        return ""
    ways = 1
    axes = []
    first = next((op for op in graph.ops if EXPERT_LABEL in op.splittable and op.params), None)
    if first is not None:
        for ai, ax in enumerate(mesh.axes):
            if configs[first.name][ai] == EXPERT_LABEL:
                ways *= ax.size
                axes.append(ax.name)
    over = f" (split over {'x'.join(axes)}, all-to-all dispatch and combine)" if axes else ""
    return (f"experts: {total // ways} of {total} per rank{over}, top-{graph.meta.get('moe_top_k', '?')}, "
            f"load {graph.meta.get('moe_load', 'balanced')}")


def build_plans(result: SearchResult, points: list[FrontierPoint] | None = None) -> list[Plan]:
    """Plans for the given frontier points (all by default)."""
    points = result.points if points is None else points
    by_mesh: dict[int, list[int]] = {}
    for i, p in enumerate(points):
        by_mesh.setdefault(p.mesh_index, []).append(i)
    out: dict[int, Plan] = {}
    for mi, idxs in by_mesh.items():
        plans = _solution_plans(result, result.solutions[mi], [points[i] for i in idxs])
        out.update(zip(idxs, plans, strict=True))
    return [out[i] for i in range(len(points))]


class _OpPlans:
    """OpPlans on one solution's mesh, the same op in the same configuration shared by every plan.

    Configuration indices are positional, so each op reads its own labels from its own list (a
    layer priced through the template carries the template's index, not its labels); a
    pipeline's ops were configured on its micro-batch graph."""

    def __init__(self, graph: OpGraph, sol: Solution) -> None:
        self.graph, self.mesh = graph, sol.mesh
        self.configs = {op.name: op_configs(op, sol.mesh, graph.batch_label) for op in sol.configured_graph(graph).ops}
        self.plans: dict[tuple[str, int], OpPlan] = {}

    def config(self, name: str, k: int) -> Config:
        return self.configs[name][k]

    def __call__(self, name: str, k: int) -> OpPlan:
        if (name, k) not in self.plans:
            self.plans[(name, k)] = _op_plan(self.graph.op(name), self.mesh, self.configs[name][k])
        return self.plans[(name, k)]


def _solution_plans(result: SearchResult, sol: Solution, points: list[FrontierPoint]) -> list[Plan]:
    """Plans for points of one solution, re-costed together from its tables."""
    graph, cluster, job = result.graph, result.cluster, result.job
    mesh = sol.mesh
    rows = np.array([p.row for p in points])
    assign = {name: np.asarray(v)[rows] for name, v in points[0].configs.items()}
    costs = sol.recost(graph, assign, [p.stages for p in points])
    op_plan = _OpPlans(graph, sol)
    block_names = {n for b in graph.blocks for layer in b.layers for n in layer}
    weighted = weighted_ops(graph)
    flops = model_flops(graph)
    plans = []
    for j, point in enumerate(points):
        configs = {op.name: op_plan.config(op.name, int(assign[op.name][j])) for op, _ in weighted}
        pred, pipe = _prediction(sol, costs, j, point.stages, job.global_batch)
        pred.model_flops, pred.mfu = flops, mfu(flops, pred.time_s, cluster, job.precision)
        recomputed = _recomputed(graph, assign, j)
        plans.append(Plan(
            model=graph.meta.get("model", graph.name) if graph.meta else graph.name,
            cluster=cluster.describe(), device=cluster.device.name, num_devices=cluster.num_devices,
            devices_per_node=cluster.devices_per_node, global_batch=job.global_batch, seq_len=job.seq_len,
            precision=job.precision,
            mesh=MeshSpec(pp=mesh.pp, axes=[AxisSpec(name=a.name, size=a.size, stride=a.stride, role=a.role)
                                            for a in mesh.axes]),
            ops=[op_plan(op.name, int(assign[op.name][j])) for op in graph.ops if op.name not in block_names],
            blocks=_block_plans(graph, assign, j, op_plan), predicted=pred, zero_stage=sol.zero,
            recompute=recomputed, pipeline=pipe,
            summary=summarize(graph, mesh, configs, sol.zero, len(recomputed), weighted, pipe),
        ))
    return plans


def _recomputed(graph: OpGraph, assign: dict[str, np.ndarray], j: int) -> list[str]:
    """The module layers recomputed in plan j (a periodic stack's layer is `period` of them)."""
    out = []
    for b in graph.blocks[:1]:
        first, period = block_layout(graph, b)
        for k in range(len(b.layers)):
            if recompute_var(k) in assign and assign[recompute_var(k)][j]:
                out += [f"{b.prefix}.{first + k * period + m}" for m in range(period)]
    return out


def _block_plans(graph: OpGraph, assign: dict[str, np.ndarray], j: int, op_plan: _OpPlans) -> list[BlockPlan]:
    """Each block stack's distinct layer configurations (variants), and the variant of every layer."""
    blocks = []
    for b in graph.blocks:
        variants: dict[tuple[int, ...], int] = {}
        vlist: list[list[OpPlan]] = []
        layer_variant = []
        for layer in b.layers:
            key = tuple(int(assign[n][j]) for n in layer)
            if key not in variants:
                variants[key] = len(vlist)
                vlist.append([op_plan(n0, k) for n0, k in zip(b.layers[0], key, strict=True)])
            layer_variant.append(variants[key])
        blocks.append(BlockPlan(prefix=b.prefix, variants=vlist, layer_variant=layer_variant))
    return blocks


def _prediction(sol: Solution, costs: dict[str, np.ndarray], j: int, split: Split | None,
                global_batch: int) -> tuple[Prediction, PipelineSpec]:
    """Assignment j's predicted time, memory and communication, and its pipeline (if any)."""
    parts = costs["parts"][j]
    breakdown = MemoryBreakdown(params=int(parts[0]), grads=int(parts[1]), optimizer=int(parts[2]),
                                activations=int(parts[3]), buffers=int(costs["buffers"][j]))
    comm = {ax.name: float(costs["comm"][j][a]) for a, ax in enumerate(sol.mesh.axes)}
    pipe = PipelineSpec()
    shape = sol.pipeline
    if shape is not None:
        comm["pp"] = float(costs["pp_bytes"][j])
        pipe = _pipeline_spec(shape, split, costs, j, global_batch)
    pred = Prediction(time_s=float(costs["time"][j]), memory_bytes=int(round(costs["memory"][j])),
                      breakdown=breakdown, comm_bytes=comm)
    return pred, pipe


def _pipeline_spec(shape: PipeShape, split: Split | None, costs: dict[str, np.ndarray], j: int,
                   global_batch: int) -> PipelineSpec:
    assert split is not None, "a pipeline point always has its split"
    bounds = [list(c) for c in chunk_layers(split, shape.virtual_stages)]
    dp = math.prod(ax.size for ax in shape.mesh.axes if ax.name == "dp")
    return PipelineSpec(stages=shape.stages, schedule=shape.schedule, micro_batches=shape.micro_batches,
                        micro_batch_size=max(1, global_batch // shape.micro_batches // dp), stage_layers=bounds,
                        stage_time_s=[float(x) for x in costs["stage_time"][j]],
                        stage_memory_bytes=[int(round(x)) for x in costs["stage_memory"][j]],
                        async_weights=shape.schedule == "2bw", virtual_stages=shape.virtual_stages)


def pick(points: list[FrontierPoint], budget_bytes: float,
         time_target_s: float | None = None) -> FrontierPoint | None:
    """The point a job runs: without a time target, the fastest whose peak memory per device fits
    the budget (the leaner of equally fast ones); with one, the leanest that fits the budget and
    runs an iteration within the target (the faster of equally lean ones). None if none does."""
    fitting = [p for p in points if p.memory_bytes <= budget_bytes]
    if time_target_s is None:
        return min(fitting, key=lambda p: (p.time_s, p.memory_bytes)) if fitting else None
    in_time = [p for p in fitting if p.time_s <= time_target_s]
    return min(in_time, key=lambda p: (p.memory_bytes, p.time_s)) if in_time else None
