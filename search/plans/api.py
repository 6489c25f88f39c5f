"""One entry point for a whole search: request in, frontier with Plans and baselines out.

The CLI, the service and the worker's `run` all go through `run_search`, so a job submitted over
REST and the same job typed at a shell produce the same document. `SearchRequest` is the pydantic
model at the edge (what a user may ask for); `FrontierReport` is what is stored and served.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from search.errors import InputError
from search.plans.reports import BaselineEntry, FrontierEntry, FrontierReport

Progress = Callable[..., None]  # (stage, fraction done in [0, 1], message=None)


class JobRequest(BaseModel):
    """What is trained and where: a model (exactly one of zoo name, HF config contents, OpGraph
    JSON), a cluster (a catalog device and counts, or a cluster JSON object), the training job
    and an optional DeviceProfile. A search (`SearchRequest`) and a priced plan
    (`search.plans.estimate.EstimateRequest`) both start from these fields."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, description="zoo model name (see GET /api/models)")
    name: str | None = Field(default=None, max_length=200, description="label for a model given as hf_config")
    hf_config: dict[str, Any] | None = Field(default=None, description="contents of a HuggingFace config.json")
    graph: dict[str, Any] | None = Field(default=None, description="an OpGraph in its JSON form")
    device: str = Field(default="h100-80gb", description="catalog device type")
    devices: int = Field(default=8, gt=0, le=1_000_000, description="number of devices")
    devices_per_node: int | None = Field(default=None, gt=0, le=1_000_000)
    cluster: dict[str, Any] | None = Field(default=None, description="cluster JSON (overrides device/devices)")
    memory_budget: int | str | None = Field(default=None, description="bytes or a size such as '40GiB'")
    global_batch: int | None = Field(default=None, gt=0, le=10_000_000)
    seq_len: int | None = Field(default=None, gt=0, le=10_000_000)
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"
    profile: dict[str, Any] | None = Field(default=None, description="a DeviceProfile (paretoplan.profile/1): price "
                                           "ops and collectives from measured costs; sets the device unless given")

    @model_validator(mode="after")
    def _one_model(self) -> JobRequest:
        given = [k for k in ("model", "hf_config", "graph") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of model, hf_config, graph (got {', '.join(given) or 'none'})")
        return self


class SearchRequest(JobRequest):
    """What to search: the model, cluster and job (`JobRequest`), and the space to search."""

    eps: float = Field(default=0.0, ge=0.0, le=1.0, description="approximate mode: one point per (1+eps) cell")
    zero_stages: list[int] = Field(default=[0, 1, 2, 3], min_length=1)
    recompute: bool = True
    pipeline: bool = Field(default=True, description="also split the layers into pipeline stages (false: plans "
                           "without pipelines only)")
    grad_accumulation: bool = Field(default=True, description="plans without pipelines may run the batch as "
                                    "micro-batches, accumulating gradients (false: one pass per iteration)")
    allow_async_pipeline: bool = Field(default=False, description="admit PipeDream-2BW (1-stale weights)")
    interleave: bool = Field(default=False, description="also interleave pipeline stages (1F1B over 2-4 virtual "
                             "stages per device; the search takes longer)")
    tensor_2d: bool = Field(default=False, description="also meshes with two tensor axes (2-D tensor parallelism; "
                            "the search takes longer)")
    baselines: bool = True
    exhaustive: bool = False
    reuse_blocks: bool = True
    time_target: float | str | None = Field(default=None, description="seconds per iteration or a time such as "
                                            "'250ms': pick the leanest plan that fits the memory budget and runs "
                                            "within it, instead of the fastest that fits (a resize keeps the rule)")

    @model_validator(mode="after")
    def _check(self) -> SearchRequest:
        if any(z not in (0, 1, 2, 3) for z in self.zero_stages):
            raise ValueError(f"zero_stages must be among 0-3, got {self.zero_stages}")
        self.zero_stages = sorted(set(self.zero_stages))
        return self

    @field_validator("time_target")
    @classmethod
    def _seconds(cls, v: float | str | None) -> float | None:
        from search.prices.cluster import parse_duration

        return parse_duration(v) if v is not None else None


def request_cluster(req: JobRequest, check_batch: bool = True):
    """The cluster a request names (a profile sets the device unless the request does), checked
    against the profile's device and (with `check_batch`) that the global batch splits over some
    data-parallel size the search offers; cheap: the service runs it before storing a job."""
    from search.prices.cluster import cluster_from_dict, make_cluster

    prof = request_profile(req)
    device = prof.device if prof is not None and "device" not in req.model_fields_set else req.device
    cluster = (cluster_from_dict(req.cluster) if req.cluster is not None
               else make_cluster(device, req.devices, req.devices_per_node))
    if prof is not None and cluster.device.name != prof.device:
        raise InputError(f"the profile was measured on {prof.device!r}, but the cluster is of {cluster.device.name!r}; "
                         f"search {prof.device!r} devices with it (or profile {cluster.device.name!r})")
    if check_batch and req.global_batch is not None:
        from search.prices.mesh import CONTEXT_MIN_SEQ, CONTEXT_SIZES, data_ways, mesh_candidates

        ways = sorted({data_ways(m) for m in mesh_candidates(cluster)})
        seq = req.seq_len or 0
        if seq >= CONTEXT_MIN_SEQ:  # a long sequence may split over a context axis inside the data axis
            ways = sorted({*ways, *(w // cp for w in ways for cp in CONTEXT_SIZES if w % cp == 0 and seq % cp == 0)})
        if not any(req.global_batch % w == 0 for w in ways):
            raise InputError(f"global_batch {req.global_batch} does not split over any data-parallel size this cluster "
                             f"offers ({', '.join(map(str, ways))}): every op carrying the batch splits it over dp")
    return cluster


def resolve(req: JobRequest, progress: Progress | None = None, check_batch: bool = True):
    """The graph, cluster, job and budget a request names (InputError on anything invalid);
    `check_batch` as for `request_cluster` (a priced plan checks its own data-parallel size)."""
    from search.models.capture import capture_model
    from search.models.graph import parse_graph
    from search.models.zoo import get_model, spec_from_hf_config
    from search.prices.cluster import parse_size
    from search.prices.costmodel import TrainingJob

    cluster = request_cluster(req, check_batch)
    budget = parse_size(req.memory_budget) if req.memory_budget is not None else cluster.memory_per_device
    if budget <= 0:
        raise InputError(f"memory budget must be positive, got {req.memory_budget!r}")
    batch = req.global_batch or max(8, cluster.num_devices)
    if progress:
        progress("capture", 0.0)
    if req.graph is not None:
        graph = parse_graph(req.graph)
        batch = int(graph.meta.get("global_batch", batch))
        seq = graph.meta.get("seq_len")
        seq_len = int(seq) if seq is not None else None
    else:
        spec = get_model(req.model) if req.model else spec_from_hf_config(req.hf_config, req.name or "config",
                                                                                 origin=req.name or "hf_config")
        graph = capture_model(spec, batch, req.seq_len)
        seq_len = (req.seq_len or spec.default_seq_len) if spec.kind != "vision" else None
    job = TrainingJob(global_batch=batch, seq_len=seq_len, precision=req.precision)
    return graph, cluster, job, float(budget)


@dataclass
class SearchOutcome:
    result: Any            # search.algorithm.ft.SearchResult
    baselines: list        # search.plans.baselines.Baseline, inside the searched space
    plans: list            # search.plans.plan.Plan per frontier point
    best: Any              # the FrontierPoint picked at the budget, or None
    budget: float
    capture_seconds: float
    report: FrontierReport  # what gets stored and served


def run_search(req: SearchRequest, progress: Progress | None = None) -> SearchOutcome:
    """Search the frontier a request asks for."""
    from search.plans.plan import build_plans, pick
    from search.prices.profile import ProfileLookup

    t0 = time.perf_counter()
    graph, cluster, job, budget = resolve(req, progress)
    capture_s = time.perf_counter() - t0
    profile = ProfileLookup(request_profile(req), job.precision) if req.profile is not None else None
    if progress:
        progress("search", 0.1)
    if req.exhaustive:
        from search.algorithm.exhaustive import exhaustive_search
        from search.prices.mesh import mesh_candidates

        result = exhaustive_search(graph, cluster, job, mesh_candidates(cluster, tensor_2d=req.tensor_2d),
                                   tie_blocks=req.reuse_blocks, zero_stages=tuple(req.zero_stages),
                                   recompute=req.recompute, profile=profile)
    else:
        from search.algorithm.ft import SearchOptions, search

        def searched(fraction: float, message: str) -> None:
            if progress:
                progress("search", 0.1 + 0.7 * fraction, message=message)

        options = SearchOptions(eps=req.eps, reuse_blocks=req.reuse_blocks, zero_stages=tuple(req.zero_stages),
                                recompute=req.recompute, profile=profile,
                                pipeline=req.pipeline or req.allow_async_pipeline or req.interleave,
                                allow_async=req.allow_async_pipeline, accumulate=req.grad_accumulation,
                                interleave=req.interleave, tensor_2d=req.tensor_2d)
        result = search(graph, cluster, job, options, progress=searched)
    if progress:
        progress("plans", 0.8)
    target = float(req.time_target) if req.time_target is not None else None
    best = pick(result.points, budget, target)
    bases = baseline_points(result, budget, profile) if req.baselines else []
    source = request_source(req, graph)
    plans = with_source(mark_estimated(result, build_plans(result), profile), source)
    if profile is not None:
        result.stats["profile"] = profile.summary()
    if progress:
        progress("baselines", 0.9)
    report = FrontierReport(
        model=graph.meta.get("model", graph.name) if graph.meta else graph.name,
        params=graph.param_count(), cluster=cluster.describe(), device=cluster.device.name,
        num_devices=cluster.num_devices, memory_per_device=int(cluster.memory_per_device),
        job=job.model_dump(), memory_budget_bytes=int(budget), time_target_s=target, search_seconds=result.search_seconds,
        capture_seconds=capture_s, eps=result.eps, stats=result.stats,
        picked=result.points.index(best) if best is not None else None,
        frontier=[FrontierEntry(time_s=p.time_s, memory_bytes=int(round(p.memory_bytes)), mfu=plan.predicted.mfu,
                                plan=plan)  # PlanJSON dumps a Plan once, unvalidated again
                  for p, plan in zip(result.points, plans, strict=True)],
        baselines=baselines_json(result, bases, profile, source),
    )
    if progress:
        progress("done", 1.0)
    return SearchOutcome(result, bases, plans, best, budget, capture_s, report)


def request_profile(req: JobRequest):
    """The request's DeviceProfile, parsed (InputError when it is not a valid one)."""
    if req.profile is None:
        return None
    from search.prices.profile import parse_profile

    return parse_profile(req.profile, origin="profile")


def request_source(req: JobRequest, graph):
    """How a launcher rebuilds the model the request names (search.models.source)."""
    from search.models.source import graph_source, hf_source, zoo_source

    if req.model is not None:
        return zoo_source(req.model)
    if req.hf_config is not None:
        return hf_source(req.hf_config, req.name or "config", params=graph.param_count())
    return graph_source(graph.name, params=graph.param_count())


def with_source(plans: list, source) -> list:
    """The plans, each carrying its model's source (None leaves them as they are)."""
    if source is not None:
        for plan in plans:
            plan.source = source
    return plans


def mark_estimated(result, plans: list, profile=None) -> list:
    """Each plan's `predicted.priced_from` ("profile" when the search had one) and
    `predicted.estimated`: False only when every cost table of its mesh (every
    op in every configuration, every edge) was priced from measured costs - and, for a
    pipeline, the profile has a send/recv fit for the stage-to-stage transfers."""
    if profile is None:
        return plans
    for plan, p in zip(plans, result.points, strict=True):
        plan.predicted.priced_from = "profile"
        sol = result.solutions[p.mesh_index]
        est = any(oc.estimated for oc in sol.op_costs.values()) or any(ec.estimated for ec in sol.edge_costs.values())
        if plan.mesh.pp > 1:
            est = est or profile.profile.collective("send_recv", 2) is None
        plan.predicted.estimated = est
    return plans


def baseline_points(result, budget: float, profile=None) -> list:
    """The baselines inside the space that was searched (a restricted search, e.g. zero 0, says
    nothing about FSDP)."""
    from search.plans.baselines import baselines

    stages = set(result.stats.get("zero_stages", [0, 1, 2, 3]))
    recompute = result.stats.get("recompute", True)

    def inside(b) -> bool:
        rc = any(v.startswith("recompute@") and int(a[b.point.row]) for v, a in b.point.configs.items())
        piped = b.point.stages is not None
        return b.solution.zero in stages and (recompute or not rc) and (not piped or result.stats.get("pipeline"))

    found = [b for b in baselines(result.graph, result.cluster, result.job, budget=budget, result=result,
                                  profile=profile, pipelines=bool(result.stats.get("pipeline")),
                                  allow_async=bool(result.stats.get("allow_async_pipeline")))
             if inside(b)]
    # a baseline whose layout breaks a placement rule has no price to compare: it is named, not drawn
    result.stats["infeasible_baselines"] = [
        {"name": b.name, "description": b.description,
         "reason": "its layout changes a placement where torch cannot (a module-boundary rule of the executor), "
                   "so no program runs it as priced"}
        for b in found if not b.feasible]
    return [b for b in found if b.feasible]


def baselines_json(result, bases: list, profile=None, source=None) -> list[BaselineEntry]:
    if not bases:
        return []
    from search.plans.baselines import against_frontier, as_result
    from search.plans.plan import build_plans

    as_res = as_result(result.graph, result.cluster, result.job, bases)
    plans = with_source(mark_estimated(as_res, build_plans(as_res), profile), source)
    return [BaselineEntry(name=b.name, description=b.description, time_s=b.time_s,
                          memory_bytes=int(round(b.memory_bytes)), mfu=plan.predicted.mfu,
                          against_frontier=against_frontier(result.points, b),
                          plan=plan)  # PlanJSON dumps a Plan once, unvalidated again
            for b, plan in zip(bases, plans, strict=True)]


def resized(req: SearchRequest, devices: int, memory_per_device: int | None,
            devices_per_node: int | None) -> SearchRequest:
    """The same request for new resources (a resize); the global batch stays what the job trains
    with. Shared by the service (a resize's frontier) and the worker (re-planning a run)."""
    from search.prices.cluster import parse_size

    batch = req.global_batch
    if batch is None and req.graph is None:
        old = int(req.cluster.get("devices", req.devices)) if req.cluster is not None else req.devices
        batch = max(8, old)  # what resolve defaulted it to
    update: dict[str, Any] = {"global_batch": batch}
    if req.cluster is not None:
        cluster = dict(req.cluster, devices=devices)
        if devices_per_node is not None:
            cluster["devices_per_node"] = devices_per_node
        update["cluster"] = cluster
    else:
        update["devices"] = devices
        if devices_per_node is not None:
            update["devices_per_node"] = devices_per_node
    if memory_per_device is not None:
        update["memory_budget"] = parse_size(memory_per_device)
    return SearchRequest.model_validate(req.model_copy(update=update).model_dump())
