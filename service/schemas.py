"""The API's edge: pydantic models of what comes in and goes out.

A job's body *is* the CLI's `search.plans.api.SearchRequest` (one validation path for both front ends)
plus what only the service knows: a stored profile to price the devices with, and further device
counts to search ahead so that a resize has its answer ready.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, model_validator

from search import Confidence, EstimateRequest, FrontierReport, ResizeTimes, RunReport, SearchRequest, SearchSummary


def _utc(dt: datetime | None) -> str | None:
    return None if dt is None else dt.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")


Timestamp = Annotated[datetime, PlainSerializer(_utc, return_type=str)]

Status = Literal["queued", "running", "done", "failed"]
Count = Annotated[int, Field(gt=0, le=1_000_000)]
TaskKind = Literal["search", "run"]


def _takes(annotation: Any, kind: type) -> bool:
    """Whether a field's annotation admits `kind` (through Optional, unions, lists, Annotated)."""
    if annotation is kind:
        return True
    return any(_takes(a, kind) for a in get_args(annotation))


class StrictNumbers(BaseModel):
    """JSON `true` is no count: pydantic's lax mode reads it as 1 (`"devices": true` was one device).
    A model with this base refuses a boolean in any field (or list of them) that takes integers
    and not booleans."""

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                v = data.get(name)
                if v is None or not _takes(field.annotation, int) or _takes(field.annotation, bool):
                    continue
                if isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v)):
                    raise ValueError(f"{name}: {json_dumps(v)} is a boolean, not a number")
        return data


def json_dumps(v: Any) -> str:
    import json

    return json.dumps(v)[:80]


class Error(BaseModel):
    detail: str = Field(description="what went wrong, in one sentence")


class JobCreate(StrictNumbers, SearchRequest):
    """A search request, plus a stored profile and further device counts to search ahead."""

    profile_id: int | None = Field(default=None, gt=0, le=2**31 - 1,
                                   description="price ops and collectives with this stored DeviceProfile "
                                               "(GET /api/profiles); instead of an inline `profile`")
    device_counts: list[Count] = Field(default_factory=list, max_length=8,
                                       description="further device counts to search now, so a resize is answered at once")

    def search_request(self) -> SearchRequest:
        # exclude_unset: which fields were given matters (a profile sets the device unless one is given)
        return SearchRequest.model_validate(self.model_dump(exclude={"profile_id", "device_counts"}, exclude_unset=True))


class EstimateIn(StrictNumbers, EstimateRequest):
    """One plan in Megatron-LM's terms on a model, cluster and job (as a job's), to price; with
    `job_id`, placed against that job's stored frontier (the same model, devices and job)."""

    job_id: int | None = Field(default=None, gt=0, le=2**31 - 1,
                               description="compare with this job's frontier (it must be done)")
    profile_id: int | None = Field(default=None, gt=0, le=2**31 - 1,
                                   description="price with this stored DeviceProfile instead of an inline `profile`")

    def estimate_request(self, profile: dict[str, Any] | None = None) -> EstimateRequest:
        fields = self.model_dump(exclude={"job_id", "profile_id"}, exclude_unset=True)
        if profile is not None:
            fields["profile"] = profile
        return EstimateRequest.model_validate(fields)


class Alternate(BaseModel):
    devices: int
    search_id: int
    status: Status


class JobOut(BaseModel):
    id: int
    name: str
    status: Status
    stage: str | None = None
    progress: float = Field(description="fraction of the search done, 0 to 1")
    error: str | None = None
    search_id: int
    devices: int
    device: str | None = Field(default=None, description="the device type asked for, e.g. h100-80gb "
                                                         "(None for a cluster given in full)")
    cached: bool = Field(description="answered from a stored frontier of an identical earlier search")
    frontier_size: int | None = None
    feasible: bool | None = Field(default=None, description="whether any plan fits the memory budget (when done)")
    picked_strategy_id: int | None = Field(default=None, description="the fastest plan within the budget")
    selected_strategy_id: int | None = None
    profile_id: int | None = None
    alternates: list[Alternate] = Field(default_factory=list)
    created_at: Timestamp
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None


class JobDetail(JobOut):
    request: dict[str, Any] = Field(description="the search request as stored (normalised)")


class JobList(BaseModel):
    total: int
    items: list[JobOut]


class PointOut(BaseModel):
    """One frontier point: the CLI's `search --json` entry (`time_s`, `memory_bytes`, `mfu`) with the plan
    by strategy id instead of inline."""

    id: int = Field(description="strategy id: GET /api/strategies/{id} for the full Plan")
    index: int
    time_s: float
    memory_bytes: int
    mfu: float | None = Field(default=None, description="model FLOPs utilisation of the plan (None: stored "
                                                        "before plans recorded it)")
    fits: bool = Field(description="within the job's memory budget")
    summary: str
    plan: dict[str, Any] | None = Field(default=None, description="the full Plan, with ?plans=true")


class BaselineOut(BaseModel):
    id: int
    name: str
    description: str
    time_s: float
    memory_bytes: int
    mfu: float | None = None
    summary: str
    against_frontier: dict[str, Any]
    plan: dict[str, Any] | None = Field(default=None, description="the full Plan, with ?plans=true")


class FrontierOut(SearchSummary):
    job_id: int
    search_id: int
    status: Status
    feasible: bool
    picked: int | None = Field(description="index into `frontier` of the fastest plan within the budget "
                                           "(as in `paretoplan search --json`); None when no plan fits")
    picked_strategy_id: int | None
    least_memory_bytes: int | None
    confidence: Confidence = Field(description="whether the catalog or a profile priced the plans, and the "
                                               "held-out error band of that pricing")
    frontier: list[PointOut] = Field(description="the Pareto points, fastest first (`search --json`'s `frontier`)")
    baselines: list[BaselineOut]


class StrategyOut(BaseModel):
    id: int
    search_id: int
    kind: Literal["frontier", "baseline"]
    index: int
    name: str | None = None
    description: str | None = None
    time_s: float
    memory_bytes: int
    summary: str
    against_frontier: dict[str, Any] | None = None
    plan: dict[str, Any] = Field(description="the full Plan (search.plans.plan.Plan)")
    launchable_here: bool = Field(default=True, description="whether the machine the service runs on (and starts "
                                                            "its workers on) can run this plan")
    not_launchable_reason: str | None = Field(default=None, description="why not, when it cannot")


class SelectIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    strategy_id: int = Field(gt=0, le=2**31 - 1)


class LaunchIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    strategy_id: int | None = Field(default=None, gt=0, le=2**31 - 1,
                                    description="default: the selected strategy, else the fastest that fits")
    steps: int = Field(default=20, gt=0, le=1_000_000, description="training steps to run")
    checkpoint_every: int | None = Field(default=None, gt=0, le=1_000_000,
                                         description="save a checkpoint after every N steps: a run whose worker "
                                                     "dies resumes from the last one (default: only at a resize)")


class Metrics(BaseModel):
    time_s: float | None = None
    memory_bytes: int | None = None


class SegmentOut(BaseModel):
    """One launch of a run (search.plans.reports.Segment without its plan): steps [from_step,
    to_step) on `devices`, and what starting it took."""

    model_config = ConfigDict(extra="ignore")
    from_step: int = Field(ge=0, le=2**31 - 1)
    to_step: int = Field(ge=0, le=2**31 - 1)
    devices: int = Field(gt=0, le=1_000_000)
    plan_summary: str = Field(max_length=2000)
    cause: Literal["launch", "resize", "restart"]
    ended: Literal["finished", "resize", "stopped", "failed", "running"]
    error: str | None = Field(default=None, max_length=4000)
    resize_s: ResizeTimes | None = None
    time_s: float | None = Field(default=None, ge=0)
    memory_bytes: int | None = Field(default=None, ge=0, le=2**63 - 1)


class RunOut(BaseModel):
    id: int
    job_id: int
    strategy_id: int
    status: Status
    steps: int
    step: int | None = None
    stage: str | None = None
    progress: float
    attempts: int
    worker: str | None = None
    error: str | None = None
    checkpoint: str | None = Field(default=None, description="the run directory its checkpoints are saved to")
    checkpoint_every: int | None = None
    devices: int | None = Field(default=None, description="the devices it runs on now")
    segments: list[SegmentOut] = Field(default_factory=list, description="its launches so far: one per resize "
                                                                          "or restart")
    resize: ResizeOut | None = Field(default=None, description="a resize asked for and not yet carried out")
    predicted: Metrics = Field(description="of the plan it finished on (its report's), else of its strategy")
    measured: Metrics | None = None
    report: RunReport | None = Field(default=None, description="the worker's RunReport")
    created_at: Timestamp
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None


class ResizeIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    devices: int = Field(gt=0, le=1_000_000, description="the new number of devices")
    memory_per_device: int | str | None = Field(
        default=None, description="bytes or a size such as '40GiB' the job may use per device (default: as before)")
    devices_per_node: int | None = Field(default=None, gt=0, le=1_000_000)


class ResizeOut(BaseModel):
    id: int
    job_id: int
    devices: int
    memory_per_device: int | None
    search_id: int
    status: Literal["pending", "ready", "no_fit", "failed"] = Field(
        description="pending: the search for the new resources is queued or running; ready: `strategy` is the plan "
                    "to move to; no_fit: no plan fits (least_memory_bytes says what the leanest needs)")
    error: str | None = None
    current_strategy_id: int | None = Field(default=None, description="the plan the job has now")
    strategy: StrategyOut | None = None
    least_memory_bytes: int | None = None
    frontier_url: str = Field(description="the frontier searched for the new resources (GET it)")
    run_id: int | None = Field(default=None, description="the running run it resizes (POST /api/runs/{id}/resize)")
    outcome: str | None = Field(default=None, description="a run's resize: what its worker did, once done")
    created_at: Timestamp


class ProfileIn(StrictNumbers):
    """A DeviceProfile as `paretoplan profile` writes it, under a name."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    profile: dict[str, Any] = Field(description="the DeviceProfile JSON (format paretoplan.profile/1)")


class ProfileOut(BaseModel):
    id: int
    name: str
    device: str = Field(description="the catalog device it was measured on")
    backend: str
    ops: int = Field(description="op signatures measured")
    collectives: int = Field(description="collective fits")
    created_at: Timestamp


class ProfileDetail(ProfileOut):
    profile: dict[str, Any]


class ModelOut(BaseModel):
    name: str
    family: str
    kind: str
    params: int
    default_seq_len: int | None
    description: str


class EventOut(BaseModel):
    id: int
    kind: str
    stage: str | None = None
    fraction: float | None = None
    message: str | None = None
    search_id: int | None = None
    job_id: int | None = None
    run_id: int | None = None
    created_at: Timestamp


# ---- the worker protocol ---------------------------------------------------------------------

class ClaimIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    worker: str = Field(min_length=1, max_length=200, description="the worker's name (host:pid)")
    kinds: list[TaskKind] = Field(default=["search", "run"], min_length=1, max_length=2)


class ResizeOrder(BaseModel):
    """A resize a running run's worker is to carry out at the next step boundary."""

    id: int = Field(description="the resize; answer it with resize_id in a heartbeat")
    devices: int
    plan: dict[str, Any] | None = Field(default=None, description="the plan to move to, when the frontier for "
                                                                  "`devices` is known; else the worker searches")
    strategy_id: int | None = None
    request: dict[str, Any] = Field(description="the job's SearchRequest for `devices` (the search it needs)")


class TaskOut(BaseModel):
    """A claimed task: the worker owns it until `lease_expires_at` unless it heartbeats."""

    kind: TaskKind
    id: int
    token: str = Field(description="send with every heartbeat, progress and result of this claim")
    attempt: int
    lease_seconds: float
    lease_expires_at: Timestamp
    request: dict[str, Any] | None = Field(default=None, description="search: the SearchRequest; run: the job's, "
                                                                     "to re-plan for another device count")
    plan: dict[str, Any] | None = Field(default=None, description="run: the Plan to execute")
    steps: int | None = None
    job_id: int | None = None
    strategy_id: int | None = None
    checkpoint: str | None = Field(default=None, description="run: its run directory, when an earlier claim saved "
                                                             "checkpoints there: resume from the latest")
    checkpoint_every: int | None = None


class HeartbeatIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=64)
    stage: str | None = Field(default=None, max_length=64)
    fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    message: str | None = Field(default=None, max_length=4000)
    step: int | None = Field(default=None, ge=0, le=2**31 - 1)
    checkpoint: str | None = Field(default=None, min_length=1, max_length=4000,
                                   description="run: the run directory a checkpoint was just saved to")
    devices: int | None = Field(default=None, gt=0, le=1_000_000, description="run: the devices it runs on now")
    segments: list[SegmentOut] | None = Field(default=None, max_length=10_000, description="run: its launches so far")
    resize_id: int | None = Field(default=None, gt=0, le=2**62, description="run: the resize order answered")
    resize_outcome: str | None = Field(default=None, max_length=4000)


class HeartbeatOut(BaseModel):
    lease_expires_at: Timestamp
    resize: ResizeOrder | None = Field(default=None, description="run: a resize to carry out at the next step boundary")


class Against(BaseModel):
    """A baseline's place against the frontier, as `search` writes it: indices into the frontier
    and ratios. Typed here because the report carries it as a free dict, and a worker's report is
    what the dashboard shows (a string where a point index belongs was markup on the page)."""

    model_config = ConfigDict(extra="allow", strict=True)
    faster_point: int | None = Field(default=None, ge=0, le=1_000_000)
    leaner_point: int | None = Field(default=None, ge=0, le=1_000_000)
    speedup: float | int | None = None
    memory_ratio: float | int | None = None


class SearchResultIn(BaseModel):
    """A search's result: a FrontierReport (its own validators check it can be stored), its
    baselines' places against the frontier typed."""

    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=64)
    report: FrontierReport

    @model_validator(mode="after")
    def _typed_baselines(self) -> SearchResultIn:
        n = len(self.report.frontier)
        for i, b in enumerate(self.report.baselines):
            a = Against.model_validate(b.against_frontier)
            for name in ("faster_point", "leaner_point"):
                point = getattr(a, name)
                if point is not None and point >= n:
                    raise ValueError(f"report.baselines.{i}.against_frontier.{name}: {point} is not a point of the "
                                     f"{n}-point frontier")
        return self


class RunResultIn(BaseModel):
    """A run's result: a RunReport, which must also answer the run it is posted to (service.queue)."""

    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=64)
    report: RunReport


class FailIn(StrictNumbers):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=64)
    error: str = Field(min_length=1, max_length=20000)
    input_error: bool = Field(default=False, description="the request itself is at fault: retrying cannot help")
    retry: bool = Field(default=False, description="put the task back in the queue (while attempts remain)")
    handback: bool = Field(default=False, description="the worker is stopping and hands the task back unharmed: "
                                                      "queued again, and the claim is not counted as an attempt")


class Ack(BaseModel):
    ok: bool = True
