"""The typed reports every side exchanges: `FrontierReport` (what a search returns) and `RunReport`
(what a launched plan did, next to what its Plan predicted).

The search builds FrontierReports, the worker builds RunReports, the service validates both when a
worker posts them (a report that does not validate is refused, never stored) and the profiler's
calibration reads RunReports. So the field names are a contract: a RunReport's `predicted` and
`measured` with `time_s` and `memory_bytes`, `measured.per_rank`, `errors` as relative errors
((measured - predicted) / predicted).

Every figure is a finite, non-negative number (no NaN, no infinity: neither is JSON, and no column
holds them), and a report must agree with itself: a RunReport's plan, summary, device count and
prediction are those of the Plan it carries, it has one loss per step, and its errors are the ones
its figures give. What a report must agree with outside itself (the plan and steps of the run it
answers) is the service's to check.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator, model_validator

from search.errors import invalid
from search.plans.plan import Plan

REPORT_VERSION = 1
MAX_BYTES = 2**63 - 1  # what a BIGINT column holds

Seconds = Annotated[float, Field(ge=0.0)]
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]


def _a_plan(data: dict[str, Any]) -> dict[str, Any]:
    """A valid Plan, as its JSON object (reports keep plans as the documents they store and
    serve), normalised: defaults filled in, each value of its field's type."""
    try:
        return Plan.model_validate(data).model_dump(mode="json")
    except ValidationError as e:
        raise invalid(e, "not a valid Plan") from None  # an InputError is a ValueError: pydantic reports it


def _plan_json(value: object, handler: ValidatorFunctionWrapHandler) -> dict[str, Any]:
    """A Plan object (the search's, validated when it was built) is dumped once, not dumped,
    validated and dumped again: a frontier holds one per point. Anything else must be a valid
    Plan's JSON object."""
    if isinstance(value, Plan):
        return value.model_dump(mode="json")
    return _a_plan(handler(value))


PlanJSON = Annotated[dict[str, Any], WrapValidator(_plan_json)]


class _Report(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)


# ---- the frontier a search returns ---------------------------------------------------------------
class FrontierEntry(_Report):
    time_s: Seconds
    memory_bytes: Bytes
    mfu: float | None = Field(default=None, ge=0.0, description="the plan's predicted.mfu (model FLOPs utilisation)")
    plan: PlanJSON


class BaselineEntry(_Report):
    name: str
    description: str
    time_s: Seconds
    memory_bytes: Bytes
    mfu: float | None = Field(default=None, ge=0.0, description="the plan's predicted.mfu (model FLOPs utilisation)")
    against_frontier: dict[str, Any]
    plan: PlanJSON


class SearchSummary(_Report):
    """What was searched and how: the header of a frontier, wherever it is served."""

    model: str
    params: int
    cluster: str
    device: str
    num_devices: int
    memory_per_device: int
    job: dict[str, Any]
    memory_budget_bytes: int
    time_target_s: float | None = Field(default=None, description="the pick rule's time target: `picked` is the "
                                        "leanest plan within the budget and this time per iteration")
    search_seconds: float
    capture_seconds: float
    eps: float
    stats: dict[str, Any]


class FrontierReport(SearchSummary):
    picked: int | None = Field(ge=0, description="index of the plan the job runs: the fastest that fits the budget "
                                     "(or, with `time_target_s`, the leanest within it)")
    frontier: list[FrontierEntry]
    baselines: list[BaselineEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _picked_is_a_point(self) -> FrontierReport:
        if self.picked is not None and self.picked >= len(self.frontier):
            raise ValueError(f"picked {self.picked} is not an index of its {len(self.frontier)} frontier points")
        return self


# ---- what a launched plan did --------------------------------------------------------------------
class Predicted(_Report):
    time_s: Seconds
    memory_bytes: Bytes


class RankMeasure(_Report):
    rank: int = Field(ge=0)
    coord: dict[str, int] = Field(default_factory=dict, description="this rank's coordinate on the runtime mesh")
    time_s: Seconds = Field(description="median step time of this rank over the timed steps")
    memory_bytes: Bytes | None = Field(description="peak memory of this rank during the memory step")


class Measured(_Report):
    time_s: Seconds = Field(description="median over timed steps of the slowest rank's step time")
    time_spread: float = Field(ge=0.0, description="interquartile range / median of those step times")
    memory_bytes: Bytes | None = Field(description="peak memory, max over ranks")
    memory_method: str = Field(description="profiler (CPU allocator events), cuda_max_allocated, or memtracker")
    timed_steps: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    step_times_s: list[Seconds] = Field(default_factory=list, description="per step, the slowest rank's time")
    per_rank: list[RankMeasure] = Field(default_factory=list)


class Errors(_Report):
    time: float | None = Field(description="(measured - predicted) / predicted")
    memory: float | None


class ResizeTimes(_Report):
    """What moving a run onto a new layout took, in four parts."""

    save_s: Seconds = Field(description="saving the checkpoint at the step boundary (0 after a failure: the last "
                                        "periodic checkpoint is used)")
    replan_s: Seconds = Field(description="picking the new plan: from a stored frontier, or searching one")
    restart_s: Seconds = Field(description="stopping the old processes, starting the new ones and building the model")
    load_s: Seconds = Field(description="loading the checkpoint resharded into the new layout")

    @property
    def total_s(self) -> float:
        return self.save_s + self.replan_s + self.restart_s + self.load_s


class Segment(_Report):
    """One launch of a run: steps [from_step, to_step) on `devices` processes under `plan`."""

    from_step: int = Field(ge=0)
    to_step: int = Field(ge=0, description="the steps it contributed end here (a failed launch: at its last checkpoint)")
    devices: int = Field(gt=0)
    plan_summary: str
    plan: PlanJSON
    cause: Literal["launch", "resize", "restart"] = Field(
        description="launch: the run's start; resize: a new device count; restart: after a failure or a stop")
    ended: Literal["finished", "resize", "stopped", "failed", "running"] = "finished"
    error: str | None = Field(default=None, description="why a failed launch ended")
    resize_s: ResizeTimes | None = Field(default=None, description="what starting this segment took (not for a launch)")
    predicted: Predicted
    time_s: Seconds | None = Field(default=None, description="measured: median timed step of the slowest rank")
    memory_bytes: Bytes | None = Field(default=None, description="measured: peak memory, max over ranks")

    @model_validator(mode="after")
    def _consistent(self) -> Segment:
        if self.to_step < self.from_step:
            raise ValueError(f"segment ends at step {self.to_step} before it starts ({self.from_step})")
        if self.devices != self.plan["num_devices"]:
            raise ValueError(f"segment on {self.devices} devices runs a plan for {self.plan['num_devices']}")
        return self


class NodeRecord(_Report):
    """One machine of a run that spans several: torchrun's node (group) rank, the host, and the
    global ranks it ran (the plan's devices node_rank * K ... node_rank * K + K - 1)."""

    node_rank: int = Field(ge=0)
    host: str
    ranks: list[Annotated[int, Field(ge=0)]]


class RunReport(_Report):
    version: int = REPORT_VERSION
    model: str
    plan_summary: str
    num_devices: int = Field(gt=0)
    device: str = Field(description="what ran it, e.g. 'cpu (4 processes)' or the CUDA device name")
    backend: str
    mesh: dict[str, int] = Field(default_factory=dict, description="runtime mesh dimensions (pp/dp/tp/rep)")
    steps: int = Field(gt=0)
    seed: int
    losses: list[float] = Field(description="per step: the mean loss of the data shards (the single-process loss)")
    predicted: Predicted
    measured: Measured
    errors: Errors
    notes: list[str] = Field(default_factory=list, description="where execution knowingly differs from the plan")
    comm: dict[str, Any] = Field(default_factory=dict, description="CommDebugMode per-module counts of step 0, if recorded")
    plan: PlanJSON
    started: datetime
    finished: datetime
    segments: list[Segment] = Field(
        default_factory=list, description="each launch in step order; the report's plan and measured figures are the "
                                          "last segment's, its losses every step's")
    restarts: int = Field(default=0, ge=0, description="launches that resumed after a failure or a stop")
    nodes: list[NodeRecord] = Field(default_factory=list, description="the machines (torchrun nodes) of the last "
                                    "launch and the ranks each ran; empty when it ran on one")

    @model_validator(mode="after")
    def _consistent(self) -> RunReport:
        """What the worker copies from the Plan, and what follows from its own figures, must agree."""
        plan, pred = self.plan, self.plan["predicted"]
        for field, mine, planned in (("model", self.model, plan["model"]),
                                     ("plan_summary", self.plan_summary, plan["summary"]),
                                     ("num_devices", self.num_devices, plan["num_devices"]),
                                     ("predicted.time_s", self.predicted.time_s, pred["time_s"]),
                                     ("predicted.memory_bytes", self.predicted.memory_bytes, pred["memory_bytes"])):
            if mine != planned:
                raise ValueError(f"{field} {mine!r} is not its plan's ({planned!r})")
        if len(self.losses) != self.steps:
            raise ValueError(f"{len(self.losses)} losses for {self.steps} steps")
        m = self.measured
        if m.step_times_s and len(m.step_times_s) != self.steps:
            raise ValueError(f"measured.step_times_s has {len(m.step_times_s)} times for {self.steps} steps")
        if any(s >= self.steps for s in m.timed_steps):
            raise ValueError(f"measured.timed_steps {m.timed_steps} name steps beyond its {self.steps}")
        ranks = [r.rank for r in m.per_rank]
        if len(set(ranks)) != len(ranks) or any(r >= self.num_devices for r in ranks):
            raise ValueError(f"measured.per_rank names ranks {ranks}: not distinct ranks of {self.num_devices} devices")
        for field, got, want in (("time", self.errors.time, rel_error(m.time_s, self.predicted.time_s)),
                                 ("memory", self.errors.memory, rel_error(m.memory_bytes, self.predicted.memory_bytes))):
            if (got is None) != (want is None) or (got is not None and want is not None
                                                   and not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)):
                raise ValueError(f"errors.{field} {got!r} is not what measured and predicted give ({want!r})")
        if self.finished < self.started:
            raise ValueError("finished before it started")
        self._segments_consistent()
        self._nodes_consistent()
        return self

    def _nodes_consistent(self) -> None:
        """Nodes are distinct, hold distinct ranks, and the measured ranks are theirs. (One node's
        share of a gang's run reports only that node; `merge_node_reports` checks the whole.)"""
        if not self.nodes:
            return
        numbers = [n.node_rank for n in self.nodes]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"nodes {numbers} are not distinct")
        ranks = [r for n in self.nodes for r in n.ranks]
        if len(set(ranks)) != len(ranks) or any(r >= self.num_devices for r in ranks):
            raise ValueError(f"the nodes' ranks {sorted(ranks)} are not distinct ranks of {self.num_devices} devices")
        measured = {r.rank for r in self.measured.per_rank}
        if measured and not measured <= set(ranks):
            raise ValueError(f"measured.per_rank names ranks {sorted(measured - set(ranks))} of no node")

    def _segments_consistent(self) -> None:
        """Segments tile the steps in order, the last runs the report's plan, and every restart is one."""
        if not self.segments:
            if self.restarts:
                raise ValueError(f"{self.restarts} restarts but no segments")
            return
        at = 0
        for i, seg in enumerate(self.segments):
            if seg.from_step != at:
                raise ValueError(f"segment {i} starts at step {seg.from_step}, the one before ended at {at}")
            at = seg.to_step
        if at != self.steps:
            raise ValueError(f"the segments end at step {at}, the run has {self.steps}")
        last = self.segments[-1]
        if last.plan != self.plan or last.ended != "finished":
            raise ValueError("the last segment must be the finished run of the report's plan")
        restarts = sum(seg.cause == "restart" for seg in self.segments)
        if restarts != self.restarts:
            raise ValueError(f"restarts {self.restarts}, but {restarts} segments are restarts")


def rel_error(measured: float | None, predicted: float) -> float | None:
    if measured is None or not predicted:
        return None
    return (measured - predicted) / predicted
