"""RunReport: what a launched plan did, next to what its Plan predicted (pydantic, JSON).

The profiler's calibration reads these, so the field names are a contract: `predicted` and
`measured` with `time_s` and `memory_bytes`, `measured.per_rank`, `errors` as relative errors
((measured - predicted) / predicted).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

REPORT_VERSION = 1


class Predicted(BaseModel):
    time_s: float
    memory_bytes: int


class RankMeasure(BaseModel):
    rank: int
    coord: dict[str, int] = Field(default_factory=dict, description="this rank's coordinate on the runtime mesh")
    time_s: float = Field(description="median step time of this rank over the timed steps")
    memory_bytes: int | None = Field(description="peak memory of this rank during the memory step")


class Measured(BaseModel):
    time_s: float = Field(description="median over timed steps of the slowest rank's step time")
    time_spread: float = Field(description="interquartile range / median of those step times")
    memory_bytes: int | None = Field(description="peak memory, max over ranks")
    memory_method: str = Field(description="profiler (CPU allocator events), cuda_max_allocated, or memtracker")
    timed_steps: list[int] = Field(default_factory=list)
    step_times_s: list[float] = Field(default_factory=list, description="per step, the slowest rank's time")
    per_rank: list[RankMeasure] = Field(default_factory=list)


class Errors(BaseModel):
    time: float | None = Field(description="(measured - predicted) / predicted")
    memory: float | None


class RunReport(BaseModel):
    version: int = REPORT_VERSION
    model: str
    plan_summary: str
    num_devices: int
    device: str = Field(description="what ran it, e.g. 'cpu (4 processes)' or the CUDA device name")
    backend: str
    mesh: dict[str, int] = Field(default_factory=dict, description="runtime mesh dimensions (pp/dp/tp/rep)")
    steps: int
    seed: int
    losses: list[float] = Field(description="per step: the mean loss of the data shards (the single-process loss)")
    predicted: Predicted
    measured: Measured
    errors: Errors
    notes: list[str] = Field(default_factory=list, description="where execution knowingly differs from the plan")
    comm: dict[str, Any] = Field(default_factory=dict, description="CommDebugMode per-module counts of step 0, if recorded")
    plan: dict[str, Any]
    started: datetime
    finished: datetime


def rel_error(measured: float | None, predicted: float) -> float | None:
    if measured is None or not predicted:
        return None
    return (measured - predicted) / predicted
