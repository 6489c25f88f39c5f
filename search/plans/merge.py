"""One RunReport from the reports of a run's nodes (a gang of workers, each reporting its own
ranks' figures): the service merges them when the last node has reported.

Every node trained the same steps and holds the same losses (they are all-reduced); what differs
is whose ranks each measured. The merged figures are those one launcher would have written:
per step the slowest rank's time over all nodes, the median of the timed steps, the peak memory
over all ranks.
"""

from __future__ import annotations

import statistics

from search.errors import InputError
from search.plans.reports import Errors, Measured, RunReport, rel_error


def _spread(xs: list[float]) -> float:
    """Interquartile range over median (as the worker measures a launch's spread)."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    m = statistics.median(xs)
    return (q[2] - q[0]) / m if m else 0.0


def merge_node_reports(parts: list[RunReport]) -> RunReport:
    """The run's RunReport from one report per node (InputError when they are not one run's
    nodes: other plans or steps, nodes missing or twice, ranks not each of the plan's once)."""
    if not parts:
        raise InputError("no node reports to merge")
    parts = sorted(parts, key=lambda p: min((n.node_rank for n in p.nodes), default=0))
    first = parts[0]
    for p in parts[1:]:
        if p.plan != first.plan or p.steps != first.steps or p.seed != first.seed:
            raise InputError("node reports of different runs (plan, steps or seed differ)")
    nodes = sorted((n for p in parts for n in p.nodes), key=lambda n: n.node_rank)
    if [n.node_rank for n in nodes] != list(range(len(nodes))):
        raise InputError(f"node reports from nodes {[n.node_rank for n in nodes]}, not 0 .. {len(nodes) - 1}")
    ranks = sorted(r for n in nodes for r in n.ranks)
    if ranks != list(range(first.num_devices)):
        raise InputError(f"the nodes ran ranks {ranks}, not each of the plan's {first.num_devices} once")
    ms = [p.measured for p in parts]
    steps = [max(ts) for ts in zip(*(m.step_times_s for m in ms), strict=True)] if all(m.step_times_s for m in ms) \
        else []
    timed = first.measured.timed_steps
    timed_times = [steps[s] for s in timed if s < len(steps)]
    mems = [m.memory_bytes for m in ms if m.memory_bytes is not None]
    measured = Measured(
        time_s=statistics.median(timed_times) if timed_times else max(m.time_s for m in ms),
        time_spread=_spread(timed_times) if timed_times else max(m.time_spread for m in ms),
        memory_bytes=max(mems) if mems else None, memory_method=first.measured.memory_method,
        timed_steps=timed, step_times_s=steps,
        per_rank=sorted((r for m in ms for r in m.per_rank), key=lambda r: r.rank))
    merged = first.model_copy(update={
        "measured": measured, "nodes": nodes,
        "errors": Errors(time=rel_error(measured.time_s, first.predicted.time_s),
                         memory=rel_error(measured.memory_bytes, first.predicted.memory_bytes)),
        "started": min(p.started for p in parts), "finished": max(p.finished for p in parts)})
    return RunReport.model_validate(merged.model_dump())  # checked as a whole
