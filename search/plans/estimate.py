"""Price one plan a user writes the way Megatron-LM is configured (`paretoplan estimate`,
`POST /api/estimate`): tensor-, pipeline- and data-parallel sizes, the micro-batch size, ZeRO,
recomputation, sequence parallelism and the pipeline schedule.

The plan is built by the Megatron planners of `search.plans.baselines` (Megatron-LM's tensor-
parallel split of every layer, batch on the data axis, equal layers per stage) and priced by the
search's own cost model, so it sits on the same chart as the searched frontier and is compared
with it point by point. What the cost model cannot say exactly is said in `notes`; what the
executor cannot run is still priced, and flagged (`launchable`, `not_launchable_reason`).

Megatron-LM's terms: dp = devices / (tp x pp); `micro_batch` is --micro-batch-size, the samples
of one micro-batch on one data-parallel rank; m = global batch / (dp x micro_batch) micro-batches
per iteration (gradient accumulation without a pipeline, the pipeline's micro-batches with one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from search.algorithm.chain import find_chain
from search.algorithm.evaluate import micro_batch_graph, unsupported
from search.algorithm.results import FrontierPoint
from search.errors import InputError
from search.models.graph import OpGraph
from search.plans.api import (
    JobRequest,
    SearchRequest,
    mark_estimated,
    request_cluster,
    request_profile,
    request_source,
    resolve,
    with_source,
)
from search.plans.baselines import (
    AdjustTables,
    Baseline,
    GridPoint,
    Priced,
    Pricer,
    against_frontier,
    as_result,
    batch_on_dp,
    block_ops,
    megatron_tp_labels,
    pipeline_candidate,
    tp_only_mesh,
)
from search.plans.flops import peak_flops
from search.plans.plan import MemoryBreakdown, Plan, build_plans
from search.plans.reports import SearchSummary
from search.prices.accuracy import Confidence, PricedFrom, confidence
from search.prices.costmodel import EdgeCosts, OpCosts, recomputed_mem
from search.prices.mesh import DATA, TENSOR, Mesh, MeshAxis, unplaceable_op

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "gpipe", "2bw"]
ZeroStage = Literal[0, 1, 2, 3]
PIPELINE_MIN_LAYERS = 2  # one given pipeline may cut a stack of 2 layers (the search asks for 3)


class EstimateRequest(JobRequest):
    """The model, cluster and job (as for a search), and one plan in Megatron-LM's terms."""

    tp: int = Field(default=1, gt=0, le=1_000_000, description="tensor-parallel size (--tensor-model-parallel-size)")
    pp: int = Field(default=1, gt=0, le=1_000_000, description="pipeline stages (--pipeline-model-parallel-size)")
    micro_batch: int = Field(default=1, gt=0, le=10_000_000,
                             description="samples per micro-batch per data-parallel rank (--micro-batch-size)")
    virtual_stages: int = Field(default=1, gt=0, le=1024,
                                description="> 1: interleaved 1F1B, this many chunks of layers per device "
                                            "(--num-layers-per-virtual-pipeline-stage)")
    zero: ZeroStage = Field(default=0, description="ZeRO stage over the data-parallel ranks (1: Megatron-LM's "
                                                   "--use-distributed-optimizer)")
    recompute: Recompute = Field(default="none", description="activation recomputation (--recompute-granularity)")
    sequence_parallel: bool = Field(default=False, description="sequence-parallel norms and residuals (--sequence-parallel)")
    schedule: Schedule = Field(default="1f1b", description="pipeline schedule (2bw: PipeDream-2BW, 1-stale weights)")


class AgainstFrontier(BaseModel):
    """Where an estimate lands against a frontier: the fastest point within its memory and the
    leanest point within its time (indices into the frontier), and by how much they beat it."""

    points: int = Field(description="frontier points compared with")
    faster_point: int | None = Field(default=None, description="the fastest point within the estimate's memory")
    speedup: float | None = Field(default=None, description="estimate time / that point's time (> 1: it is faster)")
    leaner_point: int | None = Field(default=None, description="the leanest point within the estimate's time")
    memory_ratio: float | None = Field(default=None, description="estimate memory / that point's memory "
                                                                 "(> 1: it needs less)")
    dominated: bool = Field(description="a frontier point is at least as fast and as lean, and better in one")
    dominated_by: int | None = Field(default=None, description="the point that dominates it the most (its "
                                                                "faster point if that one dominates, else its leaner one)")
    on_frontier: bool = Field(description="a frontier point has its time and memory")
    message: str


class Estimate(BaseModel):
    """One priced plan: what `paretoplan estimate` prints and `POST /api/estimate` answers."""

    time_s: float = Field(description="predicted seconds per iteration")
    memory_bytes: int = Field(description="predicted peak memory per device")
    breakdown: MemoryBreakdown
    model_flops: float = Field(description="forward + backward FLOPs of the model per iteration (3 x forward; "
                                           "recomputation not counted)")
    mfu: float | None = Field(description="model_flops / (time_s x devices x peak FLOP/s of the device)")
    peak_flops: float = Field(description="peak FLOP/s of one device at the job's precision")
    devices: int
    tp: int
    pp: int
    dp: int
    micro_batch: int = Field(description="samples per micro-batch per data-parallel rank")
    micro_batches: int = Field(description="micro-batches per iteration: global batch / (dp x micro_batch)")
    virtual_stages: int
    schedule: str = Field(description="the schedule priced ('none' without a pipeline)")
    zero: int
    recompute: Recompute
    sequence_parallel: bool
    description: str
    plan: Plan = Field(description="the plan, in the format `paretoplan search` writes (`paretoplan run --plan`)")
    launchable: bool = Field(description="whether the executor runs it as priced, as far as the search knows (the "
                                         "worker's own analysis of the plan runs at launch)")
    not_launchable_reason: str | None = None
    priced_from: PricedFrom
    confidence: Confidence
    notes: list[str] = Field(default_factory=list, description="where the price knowingly approximates the plan")
    fallbacks: list[str] = Field(default_factory=list, description="ops that replicate where the planned split "
                                                                   "does not divide")
    memory_budget_bytes: int
    fits_budget: bool
    against_frontier: AgainstFrontier | None = None


@dataclass(frozen=True)
class Shape:
    """The plan's sizes, checked against the devices and the global batch."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    micro_batches: int
    virtual_stages: int


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _listed(xs: Sequence[int], most: int = 12) -> str:
    shown = ", ".join(map(str, xs[:most]))
    return shown + (", ..." if len(xs) > most else "")


def plan_shape(req: EstimateRequest, devices: int, global_batch: int) -> Shape:
    """dp and the micro-batch count, or an InputError naming the flag and the values that work."""
    tp, pp, mb, v = req.tp, req.pp, req.micro_batch, req.virtual_stages
    if devices % (tp * pp):
        raise InputError(f"--tp {tp} x --pp {pp} = {tp * pp} does not divide the {devices} devices: tp x pp must be "
                         f"one of {_listed(_divisors(devices))} (dp = devices / (tp x pp))")
    dp = devices // (tp * pp)
    if global_batch % dp:
        raise InputError(f"--global-batch {global_batch} does not split over dp {dp} (= {devices} devices / (tp {tp} "
                         f"x pp {pp})): use a global batch that is a multiple of {dp * mb}, or a larger --tp or --pp")
    per_rank = global_batch // dp
    if per_rank % mb:
        raise InputError(f"--micro-batch {mb} does not divide the {per_rank} samples each of the dp {dp} ranks gets "
                         f"from --global-batch {global_batch}: --micro-batch must be one of {_listed(_divisors(per_rank))}")
    m = per_rank // mb
    if v > 1:
        if pp < 2:
            raise InputError(f"--virtual-stages {v} interleaves pipeline stages: it needs --pp 2 or more")
        if req.schedule != "1f1b":
            raise InputError(f"--virtual-stages {v} is Megatron-LM's interleaved 1F1B: use --schedule 1f1b "
                             f"(not {req.schedule})")
        if m % pp:
            ok = [d for d in _divisors(per_rank) if (per_rank // d) % pp == 0]
            raise InputError(f"Megatron-LM's interleaved schedule needs the micro-batch count to be a multiple of --pp "
                             f"{pp}; --micro-batch {mb} gives {m} (= {per_rank} samples per dp rank / {mb}): "
                             + (f"--micro-batch must be one of {_listed(ok)}" if ok else
                                "no --micro-batch does at this global batch: use a larger --global-batch"))
    return Shape(tp=tp, pp=pp, dp=dp, micro_batch=mb, micro_batches=m, virtual_stages=v)


def _request_batch(req: JobRequest, devices: int) -> int:
    """The global batch the job will be captured with (as `resolve` defaults it)."""
    if req.graph is not None:
        from search.models.graph import parse_graph

        return int(parse_graph(req.graph).meta.get("global_batch", req.global_batch or max(8, devices)))
    return req.global_batch or max(8, devices)


def _model_name(req: JobRequest, graph: OpGraph | None = None) -> str:
    if req.model is not None:
        return req.model
    if graph is not None:
        return str(graph.meta.get("model", graph.name)) if graph.meta else graph.name
    return req.name or "the model"


def _check_structure(req: EstimateRequest, graph: OpGraph, pr: Pricer, shape: Shape) -> None:
    """What the model itself must offer for this plan."""
    name = _model_name(req, graph)
    n_layers = len(graph.blocks[0].layers) if graph.blocks else 0
    if shape.pp > 1 and not n_layers:
        raise InputError(f"--pp {shape.pp}: {name} has no block stack of repeated layers to cut into pipeline stages: "
                         f"use --pp 1")
    if shape.pp > 1 and n_layers < PIPELINE_MIN_LAYERS:
        raise InputError(f"--pp {shape.pp}: {name} has a single layer; a pipeline needs at least "
                         f"{PIPELINE_MIN_LAYERS}: use --pp 1")
    if shape.pp > n_layers > 0:
        raise InputError(f"--pp {shape.pp}: {name} has {n_layers} layers, so at most --pp {n_layers} stages")
    if shape.virtual_stages > 1 and n_layers % (shape.pp * shape.virtual_stages):
        ok = [v for v in _divisors(max(n_layers // shape.pp, 1)) if n_layers % (shape.pp * v) == 0]
        raise InputError(f"--virtual-stages {shape.virtual_stages}: {name}'s {n_layers} layers do not split into "
                         f"pp {shape.pp} x {shape.virtual_stages} equal chunks: --virtual-stages must be one of "
                         f"{_listed(ok)}")
    if shape.pp == 1 and shape.micro_batches > 1 and not n_layers:
        raise InputError(f"--micro-batch {shape.micro_batch} makes {shape.micro_batches} micro-batches per dp rank "
                         f"(gradient accumulation), which is priced through the block stack, and {name} has none: "
                         f"use --micro-batch {shape.micro_batch * shape.micro_batches}")
    if req.recompute != "none" and not n_layers:
        raise InputError(f"--recompute {req.recompute} recomputes layers of the block stack; {name} has none: "
                         f"use --recompute none")
    if shape.tp > 1:
        block = {op for layer in block_ops(graph) for op in layer}
        plain = megatron_tp_labels(graph)
        if not graph.blocks:
            raise InputError(f"--tp {shape.tp}: Megatron-LM's tensor parallelism splits the layers of a block stack; "
                             f"{name} has none: use --tp 1")

        def splits(t: int) -> bool:
            return t == 1 or not block.intersection(pr.assign(tp_only_mesh(t), {}, plain)[1])

        if not splits(shape.tp):
            ok = [t for t in _divisors(pr.cluster.num_devices // shape.pp) if splits(t)]
            raise InputError(f"--tp {shape.tp}: Megatron-LM's split needs {name}'s heads, hidden and FFN sizes to divide "
                             f"tp; with --pp {shape.pp} on {pr.cluster.num_devices} devices --tp may be one of "
                             f"{_listed(ok)}")
    if req.recompute == "selective" and not attention_core(graph)[0]:
        raise InputError(f"--recompute selective recomputes the attention core of each layer; {name} has no "
                         f"attention: use --recompute full or none")


# ---- selective recomputation -----------------------------------------------------------------------
CORE_KINDS = ("attention", "matmul", "softmax")


def attention_core(graph: OpGraph) -> tuple[set[str], set[str]]:
    """Megatron-LM's "core attention" in every layer of the block stack, and the ops of it whose
    output leaves it: the attention op (fused), or the activation matmuls and softmax (unfused)
    with the pointwise ops between them (scale, mask, dropout); not the q/k/v projections nor
    what they feed before the core (rotary embeddings), not the output projection."""
    order = {op.name: i for i, op in enumerate(graph.topological())}
    core: set[str] = set()
    for layer in block_ops(graph):
        for name in sorted(layer, key=order.__getitem__):
            op = graph.op(name)
            if op.kind in CORE_KINDS or (op.kind == "elementwise" and any(t.source in core for t in op.inputs)):
                core.add(name)
    consumers = graph.consumers()
    outputs = {n for n in core if any(c not in core for c, _ in consumers[n])}
    return core, outputs


def selective_adjust(core: set[str], outputs: set[str]) -> AdjustTables:
    """Table rewrite for selective recomputation: the core's ops run their forward twice (their
    `_rc` time); they keep no activations for backward, except the core's output, which the
    checkpoint keeps; the copies redistributed between core ops are not kept either."""

    def adjust(ops: dict[str, OpCosts], edges: dict[tuple[str, str], EdgeCosts]
               ) -> tuple[dict[str, OpCosts], dict[tuple[str, str], EdgeCosts]]:
        out_ops = dict(ops)
        for name in core & ops.keys():
            oc = ops[name]
            keep = name in outputs
            out_ops[name] = OpCosts(configs=oc.configs, time=oc.time_rc, mem=oc.mem if keep else oc.mem_rc,
                                    parts=oc.parts if keep else oc.parts_rc, comm=oc.comm, time_rc=oc.time_rc,
                                    mem_rc=oc.mem_rc, parts_rc=oc.parts_rc, estimated=oc.estimated, step=oc.step)
        out_edges = dict(edges)
        for (src, dst), ec in edges.items():
            if src in core and dst in core:
                out_edges[(src, dst)] = EdgeCosts(src=src, dst=dst, time=ec.time, mem=recomputed_mem(ec.mem),
                                                  comm=ec.comm, estimated=ec.estimated)
        return out_ops, out_edges

    return adjust


# ---- pricing ------------------------------------------------------------------------------------------
def _mesh(devices: int, tp: int, pp: int) -> Mesh:
    """The stage's dp x tp sub-mesh (tp innermost, as the search and the planners lay it out)."""
    return Mesh(pp=1, axes=(MeshAxis("dp", devices // (tp * pp), tp, DATA), MeshAxis("tp", tp, 1, TENSOR)))


def _why_no_pipeline(pr: Pricer, shape: Shape) -> str:
    g = micro_batch_graph(pr.graph, shape.micro_batches)
    chain = find_chain(g, PIPELINE_MIN_LAYERS)
    why = unsupported(g, chain, PIPELINE_MIN_LAYERS)
    if why is None:
        bad = unplaceable_op(g.ops, _mesh(pr.cluster.num_devices, shape.tp, shape.pp), g.batch_label)
        why = (f"a micro-batch does not split over the stage's {shape.dp} data-parallel ranks at {bad}" if bad
               else "the stack cannot be cut into these stages")
    return why


def _price(req: EstimateRequest, pr: Pricer, shape: Shape, labels: dict[str, str | None], schedule: Schedule,
           adjust: AdjustTables | None, description: str) -> Baseline:
    graph, n = pr.graph, pr.cluster.num_devices
    full = req.recompute == "full"
    if shape.pp == 1 and shape.micro_batches == 1:
        mesh = _mesh(n, shape.tp, 1)
        assignment, fallbacks = pr.assign(mesh, batch_on_dp(graph), labels)
        return pr.price("estimate", description, mesh, req.zero, assignment, full, fallbacks, adjust=adjust)
    gp = GridPoint(shape.tp, shape.pp, shape.micro_batches, schedule, req.zero, full, labels,
                   virtual_stages=shape.virtual_stages)
    c = pipeline_candidate(pr, gp, adjust=adjust, min_layers=PIPELINE_MIN_LAYERS)
    if c is None:
        raise InputError(f"cannot price this plan: {_why_no_pipeline(pr, shape)}")
    return Baseline(name="estimate", description=description, time_s=c.time_s, memory_bytes=c.memory_bytes,
                    point=FrontierPoint(time_s=c.time_s, memory_bytes=c.memory_bytes, mesh_index=-1, configs=c.configs,
                                        row=0, stages=c.split),
                    solution=c.solution, breakdown=c.breakdown, fallbacks=c.fallbacks)


def _launch_blockers(req: EstimateRequest, shape: Shape, schedule: str) -> list[str]:
    """Why the executor would not run this plan as priced (worker/analyze.py's refusals the
    search can tell from the plan's shape alone)."""
    out = []
    if req.model is None:
        out.append("the executor rebuilds models from the zoo by name, and this model is given as "
                   + ("an HF config" if req.hf_config is not None else "a graph"))
    if shape.pp > 1 and schedule in ("1f1b", "2bw") and shape.micro_batches < shape.pp:
        out.append(f"1F1B needs at least as many micro-batches as stages ({shape.micro_batches} < {shape.pp})")
    if shape.pp > 1 and req.precision == "fp16":
        out.append("fp16 needs loss scaling, which the pipeline schedules do not apply to their per-micro-batch losses")
    if req.recompute == "selective":
        out.append("selective recomputation is not executed: the executor checkpoints whole layers")
    return out


def compare(points: Sequence[Priced], est: Priced) -> AgainstFrontier:
    """Where `est` lands against frontier `points` (FrontierPoints, FrontierEntries, stored points)."""
    d = against_frontier(points, est)
    tol = 1e-9
    fp, lp = d["faster_point"], d["leaner_point"]
    dom_fast = fp is not None and d["speedup"] > 1 + tol
    dom_lean = lp is not None and d["memory_ratio"] > 1 + tol
    same = next((i for i, p in enumerate(points) if math.isclose(p.time_s, est.time_s, rel_tol=tol)
                 and math.isclose(p.memory_bytes, est.memory_bytes, rel_tol=tol, abs_tol=1.0)), None)
    dominated = (dom_fast or dom_lean) and same is None
    by = fp if dom_fast else lp if dom_lean else None
    if not points:
        message = "no frontier to compare with"
    elif same is not None:
        message = f"on the frontier (point #{same} has its time and memory)"
    elif dominated:
        parts = []
        if dom_fast:
            parts.append(f"#{fp} is {d['speedup']:.2f}x faster within its memory")
        if dom_lean:
            parts.append(f"#{lp} needs {d['memory_ratio']:.2f}x less memory at no more time")
        message = f"dominated by #{by}: " + "; ".join(parts)
    else:
        message = ("not dominated: no frontier point is as fast within its memory"
                   + (" (it lies outside the space that was searched)" if fp is None or d["speedup"] < 1 - tol else ""))
    return AgainstFrontier(points=len(points), faster_point=fp, speedup=d["speedup"], leaner_point=lp,
                           memory_ratio=d["memory_ratio"], dominated=dominated, dominated_by=by if dominated else None,
                           on_frontier=same is not None, message=message)


def estimate(req: EstimateRequest, frontier: Sequence[Priced] | None = None,
             via: Literal["cli", "api"] = "cli") -> Estimate:
    """Price the plan `req` describes (InputError for anything that cannot be planned), and place it
    against `frontier` when one is given; `via` words the hint on how to get a profile."""
    from search.prices.profile import ProfileLookup

    cluster = request_cluster(req, check_batch=False)
    n = cluster.num_devices
    shape = plan_shape(req, n, _request_batch(req, n))  # before the capture: a bad flag fails at once
    graph, cluster, job, budget = resolve(req, check_batch=False)
    shape = plan_shape(req, n, job.global_batch)
    prof = request_profile(req)
    profile = ProfileLookup(prof, job.precision) if prof is not None else None
    pr = Pricer(graph, cluster, job, profile)
    sp = req.sequence_parallel and shape.tp > 1
    labels = megatron_tp_labels(graph, sequence_parallel=sp) if shape.tp > 1 else {}
    _check_structure(req, graph, pr, shape)

    notes: list[str] = []
    schedule: Schedule = req.schedule
    if shape.pp == 1:
        if req.schedule != "1f1b":
            notes.append(f"--schedule {req.schedule} has no effect without a pipeline: micro-batches run one after "
                         "another (Megatron-LM's forward_backward_no_pipelining)")
        schedule = "1f1b"  # one stage: each micro-batch's forward and backward, then the next
    if req.sequence_parallel and shape.tp == 1:
        notes.append("--sequence-parallel has no effect with --tp 1 (Megatron-LM turns it off)")
    adjust = None
    if req.recompute == "selective":
        core, outputs = attention_core(graph)
        adjust = selective_adjust(core, outputs)
        layer0 = [o for o in block_ops(graph)[0] if o in core]
        kinds = {graph.op(o).kind for o in layer0}
        if kinds == {"attention"}:
            notes.append("--recompute selective: the attention core of each layer is one fused attention op "
                         f"({', '.join(layer0)}), which keeps only its output (the checkpoint's output, kept) and its "
                         "log-sum-exp: recomputing it saves little memory against --recompute none")
        else:
            notes.append(f"--recompute selective: priced per op: the attention core of each layer ({', '.join(layer0)} "
                         "in layer 0) runs its forward twice and keeps no activations except its output; its inputs "
                         "(q, k, v) stay kept, as Megatron-LM's checkpointed core attention does")
    if shape.virtual_stages > 1:
        notes.append(f"interleaved 1F1B priced by its bubble, (pp - 1) / (v m) = {shape.pp - 1}/({shape.virtual_stages} "
                     f"x {shape.micro_batches}) of the micro-batch slots, {shape.virtual_stages}x the stage-to-stage "
                     "transfers and Megatron-LM's warm-up count of in-flight micro-batches; layers per device as "
                     "without interleaving (each device's chunks hold the same layers in total)")
    if shape.pp > 1 and graph.blocks and len(graph.blocks[0].layers) < 3:
        notes.append("a stack of 2 layers is pipelined here; the search pipelines stacks of 3 or more")

    description = (f"Megatron-LM: tp {shape.tp} x pp {shape.pp} x dp {shape.dp}, "
                   f"{shape.micro_batches} micro-batch{'es' if shape.micro_batches != 1 else ''} of {shape.micro_batch} "
                   f"per dp rank" + (f", {schedule}" if shape.pp > 1 else "")
                   + (f" interleaved v{shape.virtual_stages}" if shape.virtual_stages > 1 else "")
                   + f", ZeRO {req.zero}, recompute {req.recompute}" + (", sequence parallel" if sp else ""))
    b = _price(req, pr, shape, labels, schedule, adjust, description)
    if not b.feasible:
        raise InputError("this layout changes a placement where torch cannot (a module-boundary rule of the executor), "
                         "so no program runs it as priced"
                         + ("; try without --sequence-parallel" if sp else ""))
    as_res = as_result(graph, cluster, job, [b])
    plan = with_source(mark_estimated(as_res, build_plans(as_res), profile), request_source(req, graph))[0]
    if req.recompute == "selective":
        plan.summary += " | selective recompute: attention core"
    blockers = _launch_blockers(req, shape, schedule)
    pred = plan.predicted
    out = Estimate(
        time_s=pred.time_s, memory_bytes=pred.memory_bytes, breakdown=pred.breakdown,
        model_flops=pred.model_flops or 0.0, mfu=pred.mfu, peak_flops=peak_flops(cluster, job.precision), devices=n,
        tp=shape.tp, pp=shape.pp, dp=shape.dp, micro_batch=shape.micro_batch, micro_batches=shape.micro_batches,
        virtual_stages=shape.virtual_stages, schedule=schedule if shape.pp > 1 else "none", zero=req.zero,
        recompute=req.recompute, sequence_parallel=sp, description=description, plan=plan,
        launchable=not blockers, not_launchable_reason="; ".join(blockers) or None, priced_from=pred.priced_from,
        confidence=confidence(pred.priced_from, req.model, n, via), notes=notes, fallbacks=b.fallbacks,
        memory_budget_bytes=int(budget), fits_budget=pred.memory_bytes <= budget,
    )
    if frontier is not None:
        out.against_frontier = compare(frontier, out)
    return out


def same_job(frontier: SearchSummary, plan: Plan, what: str) -> None:
    """InputError unless `frontier` was searched for the plan's model, devices and job: an estimate
    is only placed against the frontier of the same training job."""
    job = frontier.job
    theirs = {"model": frontier.model, "device": frontier.device, "devices": frontier.num_devices,
              "global batch": job.get("global_batch"), "sequence length": job.get("seq_len"),
              "precision": job.get("precision")}
    mine = {"model": plan.model, "device": plan.device, "devices": plan.num_devices, "global batch": plan.global_batch,
            "sequence length": plan.seq_len, "precision": plan.precision}
    differ = [k for k in mine if theirs[k] != mine[k]]
    if differ:
        raise InputError(f"{what} is for another job: its " + ", ".join(f"{k} is {theirs[k]}" for k in differ)
                         + "; the estimate's " + ", ".join(f"{k} is {mine[k]}" for k in differ)
                         + ": compare a plan with the frontier of its own job")


def compare_request(req: EstimateRequest) -> SearchRequest:
    """The search of the same model, cluster and job (`--compare`): the default space (pipelines and
    gradient accumulation included, whatever the plan uses), without the baselines."""
    fields = req.model_dump(include=set(JobRequest.model_fields), exclude_unset=True)
    return SearchRequest.model_validate({**fields, "baselines": False})
