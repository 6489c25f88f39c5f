"""Pipeline schedules: what a schedule costs in time and memory, given per-stage costs.

The search will split the block stack into p stages of consecutive layers (a DP over layers
whose values are frontiers of (max stage time, max stage memory), docs/design.md, Pipelines); this
module is the schedule model that DP prices stages with:

- GPipe: all m micro-batches forward, then all backward, then a flush. The pipeline fills and
  drains once per iteration: (m + p - 1) micro-batch slots, of which p - 1 are bubble, so the
  bubble fraction is (p - 1) / (m + p - 1). Every stage keeps the activations of all m
  micro-batches until their backward.
- 1F1B (PipeDream-Flush): the same slots and bubble, but after warm-up each stage alternates one
  forward and one backward, so stage s (0-based) holds at most min(p - s, m) micro-batches'
  activations: the first stage p, the last one.
- PipeDream-2BW: no flush; weights are double-buffered (each stage keeps two versions, 2 |W| / p
  per device for a stage of |W| / p), updates are applied every m micro-batches with 1-stale
  weights, and in steady state the bubble is amortised away. In-flight activations as 1F1B.
  Its updates are asynchronous (1-stale), so a plan using it must be asked for explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from search.errors import InputError

ScheduleName = Literal["gpipe", "1f1b", "2bw"]
SCHEDULES: tuple[ScheduleName, ...] = ("gpipe", "1f1b", "2bw")


@dataclass(frozen=True)
class StageCosts:
    """One stage's costs for ONE micro-batch (compute, communication inside the stage) and per
    iteration (gradient synchronisation, optimizer step), and its memory parts per device."""

    forward_s: float
    backward_s: float
    p2p_s: float                # sending its boundary activation (and receiving the gradient back)
    sync_s: float               # gradient synchronisation, once per iteration
    optimizer_s: float          # optimizer step, once per iteration
    weights_bytes: float        # parameters held by one device of this stage
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float    # activations kept for ONE micro-batch


def check_schedule(schedule: str, allow_async: bool = False) -> ScheduleName:
    if schedule not in SCHEDULES:
        raise InputError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if schedule == "2bw" and not allow_async:
        raise InputError("PipeDream-2BW applies 1-stale weight updates; pass --allow-async-pipeline to consider it")
    return schedule


def bubble_fraction(stages: int, micro_batches: int, schedule: ScheduleName) -> float:
    """Share of the pipeline's slots in which a stage idles."""
    if stages < 1 or micro_batches < 1:
        raise ValueError("stages and micro-batches must be >= 1")
    if schedule == "2bw":
        return 0.0  # no flush: the fill and drain are amortised over the training run
    return (stages - 1) / (micro_batches + stages - 1)


def in_flight(stage: int, stages: int, micro_batches: int, schedule: ScheduleName) -> int:
    """Micro-batches whose activations stage `stage` (0-based) holds at its peak."""
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} outside 0..{stages - 1}")
    if schedule == "gpipe":
        return micro_batches
    return min(stages - stage, micro_batches)


def weight_copies(schedule: ScheduleName) -> int:
    """Versions of the stage's weights a device keeps (2BW double-buffers them)."""
    return 2 if schedule == "2bw" else 1


def iteration_time(stages: list[StageCosts], micro_batches: int, schedule: ScheduleName) -> float:
    """Seconds per iteration: the slowest stage sets the pace of every slot."""
    p = len(stages)
    slot = max(s.forward_s + s.backward_s + 2 * s.p2p_s for s in stages)
    slots = micro_batches if schedule == "2bw" else micro_batches + p - 1
    return slots * slot + max(s.sync_s + s.optimizer_s for s in stages)


def stage_memory(stage: int, costs: StageCosts, stages: int, micro_batches: int, schedule: ScheduleName) -> float:
    """Peak bytes per device of stage `stage` under the schedule."""
    return (costs.weights_bytes * weight_copies(schedule) + costs.grads_bytes + costs.optimizer_bytes
            + costs.activations_bytes * in_flight(stage, stages, micro_batches, schedule))


def peak_memory(stages: list[StageCosts], micro_batches: int, schedule: ScheduleName) -> float:
    p = len(stages)
    return max(stage_memory(i, s, p, micro_batches, schedule) for i, s in enumerate(stages))
