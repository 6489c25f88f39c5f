"""Calibration: fit correction factors to measured runs and write a calibrated profile.

A RunReport (`search.RunReport`, what `paretoplan run --report` writes and a worker posts) holds
the Plan that ran, its prediction and what was measured. Each plan is re-costed with the profile,
and its predicted iteration time split into the parts the factors scale - compute per op kind (and
the optimizer step), communication per mesh axis - by pricing it with one factor at 1 and the
others at 0 (the cost model is linear in them). The factors then solve a least-squares problem on
the relative time error of every run, pulled gently towards the profile's current factors so that
a part no run exercises, or a single run, cannot swing them far; they stay within [1/50, 50]. The
memory overhead per rank is the median of measured minus predicted peak memory (the framework and
allocator the model does not see), never negative (`memory_overhead`). The errors before and
after are in-sample: the runs fitted are the runs scored.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from search import InputError, RunReport, read_json
from search.errors import invalid
from search.prices.profile import Calibration, DeviceProfile, ProfileLookup

FACTOR_MIN, FACTOR_MAX = 0.02, 50.0
PRIOR_WEIGHT = 0.01  # a factor 1.0 away from its prior costs what a 1% error on one run does
SHARED_FIXED = {"optimizer": 1.0, "dtensor": 1.0}  # not fitted under shared_compute
SYNC = "sync"  # under shared_compute: the sync cost per collective call, fitted in milliseconds
OPS = "ops"    # under shared_compute: the framework cost per op of a step, fitted in milliseconds


# ---- reading reports ---------------------------------------------------------------------------
def load_report(path: str | Path) -> RunReport:
    """The RunReport in a file (InputError when it is not one calibration can use)."""
    return check_report(read_json(path, "run report"), str(path))


def check_report(data: RunReport | Any, origin: str = "run report") -> RunReport:
    """`data` as a RunReport (validated by the model the service validates with), with the
    positive times and memory calibration divides by; InputError otherwise."""
    try:
        report = RunReport.model_validate(data)
    except ValidationError as e:
        raise invalid(e, f"{origin}: not a RunReport (is it from `paretoplan run --report`?)") from None
    for part, figures in (("predicted", report.predicted), ("measured", report.measured)):
        for key in ("time_s", "memory_bytes"):
            v = getattr(figures, key)
            if v is None or not v > 0:
                raise InputError(f"{origin}: {part}.{key} must be a positive number, got {v!r}")
    return report


# ---- re-costing a plan -------------------------------------------------------------------------
@dataclass
class PlanParts:
    """A plan's predicted time split into what each factor scales, and its memory."""

    base: float                 # seconds no factor scales
    compute: dict[str, float]   # seconds per op kind (and "optimizer") at factor 1
    comm: dict[str, float]      # seconds per mesh axis name at factor 1
    memory: float               # predicted peak bytes per device, without a calibrated overhead

    def time(self, compute: dict[str, float], comm: dict[str, float]) -> float:
        return (self.base + sum(compute.get(k, 1.0) * v for k, v in self.compute.items())
                + sum(comm.get(a, 1.0) * v for a, v in self.comm.items()))


def price_plan(plan: dict[str, Any], profile: DeviceProfile) -> tuple[float, float]:
    """A (non-pipelined) Plan's predicted iteration time and peak memory per device, priced
    with `profile` as it stands - its calibration included - whatever profile the plan was
    searched with."""
    parts = Recoster(profile, as_is=True).parts(plan)
    return parts.base, parts.memory


def plan_parts(plan: dict[str, Any], profile: DeviceProfile) -> PlanParts:
    """Re-cost a (non-pipelined) Plan with `profile`'s measurements, split by factor."""
    return Recoster(profile).parts(plan)


class Recoster:
    """Re-costs Plans with a profile's raw measurements (its calibration set aside). Plans of
    one model, cluster and job share the captured graph, and those on one mesh and ZeRO stage
    share the cost tables, which are built once per factor setting."""

    def __init__(self, profile: DeviceProfile, shared_compute: bool = False, as_is: bool = False) -> None:
        # as_is: price with the profile's calibration, all of it in `base` (see price_plan)
        self.as_is = as_is
        self.profile = profile if as_is else profile.model_copy(update={"calibration": None})
        # shared: one compute factor ('*') for every op kind; the framework overheads the profile
        # measured apart (the optimizer step per tensor, DTensor dispatch) are taken as measured
        self.shared_compute = shared_compute
        self.fixed: dict[str, float] = dict(SHARED_FIXED) if shared_compute else {}
        self._resolved: dict[tuple, tuple] = {}
        self._tables: dict[tuple, tuple] = {}

    def _resolve(self, plan: dict[str, Any]):
        from search import SearchRequest, resolve

        try:
            key = (plan["model"], plan["device"], plan["num_devices"], plan.get("devices_per_node"),
                   plan["global_batch"], plan.get("seq_len"), plan.get("precision", "bf16"))
        except KeyError as e:
            raise InputError(f"the report's plan is incomplete: no {e}") from None
        if key not in self._resolved:
            try:
                req = SearchRequest(model=key[0], device=key[1], devices=key[2], devices_per_node=key[3],
                                    global_batch=key[4], seq_len=key[5], precision=key[6])
            except ValueError as e:
                raise InputError(f"the report's plan is not a valid request: {str(e).splitlines()[0]}") from None
            graph, cluster, job, _ = resolve(req)
            self._resolved[key] = (graph, cluster, job, ProfileLookup(self.profile, job.precision))
        return key, self._resolved[key]

    def _price(self, key, resolved, mesh, zero: int, setting: tuple[str, str], kinds, axes):
        """Cost tables with every factor at 0 but the one `setting` names (("", "") : none)."""
        from search.algorithm.evaluate import tables
        from search.prices.costmodel import CostModel

        tkey = (key, mesh, zero, setting)
        if tkey not in self._tables:
            graph, cluster, job, lookup = resolved
            if self.as_is:
                cm = CostModel(graph, cluster, job, profile=lookup)
                ops, edges = tables(graph, cm, mesh, zero)
                self._tables[tkey] = (ops, edges, cm.buffers(mesh, zero=zero))
                return self._tables[tkey]
            lookup.compute_factors = {**self.fixed, **{k: float(setting == ("c", k)) for k in kinds}}
            if self.shared_compute:  # the collective fits as measured, plus a sync cost per call and a
                # framework cost per op (both in ms)
                lookup.comm_factors = {a: 1.0 for a in axes}
                lookup.sync = 1e-3 * float(setting == ("a", SYNC))
                lookup.op_overhead = 1e-3 * float(setting == ("a", OPS))
            else:
                lookup.comm_factors = {a: float(setting == ("a", a)) for a in axes}
                lookup.sync = lookup.op_overhead = 0.0
            lookup.memory_overhead = 0.0
            cm = CostModel(graph, cluster, job, profile=lookup)
            ops, edges = tables(graph, cm, mesh, zero)
            self._tables[tkey] = (ops, edges, cm.buffers(mesh, zero=zero))
        return self._tables[tkey]

    def parts(self, plan: dict[str, Any]) -> PlanParts:
        from search.algorithm.chain import layer_index, recompute_var
        from search.algorithm.evaluate import evaluate
        from search.plans.plan import MeshSpec
        from search.prices.mesh import Mesh, MeshAxis, op_configs

        try:  # an axis without a role takes its name's (dp data, tp tensor)
            mesh_spec = MeshSpec.model_validate(plan.get("mesh") or {})
        except ValidationError as e:
            raise invalid(e, "the report's plan has no valid mesh") from None
        if mesh_spec.pp > 1:
            raise InputError("pipelined plans (pp > 1) cannot be re-costed for calibration yet")
        key, resolved = self._resolve(plan)
        graph = resolved[0]
        mesh = Mesh(pp=1, axes=tuple(MeshAxis(a.name, a.size, a.stride, a.role) for a in mesh_spec.axes))
        assignment = _assignment(plan, graph, mesh, op_configs)
        layer_of = layer_index(graph)
        for i in set(layer_of.values()):
            assignment[recompute_var(i)] = np.array([0])
        for name in plan.get("recompute", []):
            assignment[recompute_var(int(name.rsplit(".", 1)[1]))] = np.array([1])
        zero = int(plan.get("zero_stage", 0))
        kinds = ("*",) if self.shared_compute else tuple(sorted({op.kind for op in graph.ops})) + ("optimizer",)
        axes = tuple(ax.name for ax in mesh.axes if ax.size > 1)

        def run(setting: tuple[str, str]) -> dict[str, np.ndarray]:
            ops, edges, buffers = self._price(key, resolved, mesh, zero, setting, kinds, axes)
            return evaluate(ops, edges, buffers, assignment, layer_of)

        none = run(("", ""))
        base = float(none["time"][0])
        if self.as_is:
            return PlanParts(base=base, compute={}, comm={}, memory=float(none["memory"][0]))
        compute = {k: float(run(("c", k))["time"][0]) - base for k in kinds}
        fitted_axes = (((SYNC,) if axes else ()) + (OPS,)) if self.shared_compute else axes
        comm = {a: float(run(("a", a))["time"][0]) - base for a in fitted_axes}
        return PlanParts(base=base, compute={k: v for k, v in compute.items() if v > 0},
                         comm={a: v for a, v in comm.items() if v > 0}, memory=float(none["memory"][0]))


def _assignment(plan: dict[str, Any], graph, mesh, op_configs) -> dict[str, np.ndarray | int]:
    """Configuration index per op from the Plan's per-op labels (layers of a block stack carry
    layer 0's labels in their variant; indices are positional, so they transfer); the layers'
    recomputation choices are added by the caller."""
    out: dict[str, np.ndarray | int] = {}

    def index(op_name: str, config: list[str]) -> int:
        op = graph.op(op_name)
        cfg = tuple(None if c == "R" else c for c in config)
        cfgs = op_configs(op, mesh, graph.batch_label)
        if cfg not in cfgs:
            raise InputError(f"the report's plan gives op {op_name!r} configuration {config}, which this "
                             f"model and mesh do not offer")
        return cfgs.index(cfg)

    try:
        for o in plan.get("ops", []):
            out[o["op"]] = np.array([index(o["op"], o["config"])])
        blocks = {b.prefix: b for b in graph.blocks}
        for bp in plan.get("blocks", []):
            b = blocks[bp["prefix"]]
            for k, v in enumerate(bp["layer_variant"]):
                for j, o in enumerate(bp["variants"][v]):
                    out[b.layers[k][j]] = np.array([index(o["op"], o["config"])])
    except KeyError as e:
        raise InputError(f"the report's plan does not match the model: no {e}") from None
    missing = [op.name for op in graph.ops if op.name not in out]
    if missing:
        raise InputError(f"the report's plan names no configuration for {len(missing)} ops (e.g. {missing[0]!r})")
    return out


# ---- fitting -----------------------------------------------------------------------------------
@dataclass
class CalibrationResult:
    profile: DeviceProfile
    runs: int
    skipped: dict[str, str]
    time_error_before: float
    time_error_after: float
    memory_error_before: float
    memory_error_after: float

    def line(self) -> str:
        skipped = f"; {len(self.skipped)} skipped" if self.skipped else ""
        return (f"calibrated from {self.runs} run{'s' if self.runs != 1 else ''}{skipped}: median time error "
                f"{100 * self.time_error_before:.1f}% -> {100 * self.time_error_after:.1f}%, memory error "
                f"{100 * self.memory_error_before:.1f}% -> {100 * self.memory_error_after:.1f}% (in-sample)")


def memory_overhead(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """The framework and allocator memory per rank the model does not see: the median of
    measured minus predicted peak, and never below zero. The model's sum counts gradients
    beside every kept activation, an upper bound of the step's timeline peak (before backward
    starts no gradient exists; at the end of backward most activations are gone), so a model
    can be over-stated by up to its gradients; a negative constant fitted on one model's runs
    would carry that model's slack onto every other (on the held-out check: gpt2-tiny's slack
    made llama-tiny's recomputed plans 12-19% under-stated, an OOM for whoever trusts them)."""
    return max(0.0, float(statistics.median(m - p for p, m in zip(predicted, measured, strict=True))))


def fit_factors(parts: list[PlanParts], measured: list[float], prior_compute: dict[str, float],
                prior_comm: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Factors minimising the runs' squared relative time errors plus a pull towards the prior,
    each kept within [FACTOR_MIN, FACTOR_MAX]."""
    names = sorted({("c", k) for p in parts for k in p.compute} | {("a", a) for p in parts for a in p.comm})
    if not names:
        return dict(prior_compute), dict(prior_comm)
    prior = np.array([(prior_compute if t == "c" else prior_comm).get(n, 1.0) for t, n in names])
    X = np.array([[(p.compute if t == "c" else p.comm).get(n, 0.0) for t, n in names] for p in parts])
    y = np.array(measured, dtype=float)
    base = np.array([p.base for p in parts])
    A = np.vstack([X / y[:, None], PRIOR_WEIGHT * np.eye(len(names))])
    b = np.concatenate([(y - base) / y, PRIOR_WEIGHT * prior])
    fixed: dict[int, float] = {}
    theta = prior.copy()
    for _ in range(len(names) + 1):  # active set: clamp out-of-bounds factors, solve for the rest
        free = [j for j in range(len(names)) if j not in fixed]
        if not free:
            break
        rhs = b - (A[:, list(fixed)] @ np.array(list(fixed.values())) if fixed else 0.0)
        sol, *_ = np.linalg.lstsq(A[:, free], rhs, rcond=None)
        theta[free] = sol
        out = [j for j in free if not FACTOR_MIN <= theta[j] <= FACTOR_MAX]
        if not out:
            break
        for j in out:
            fixed[j] = float(np.clip(theta[j], FACTOR_MIN, FACTOR_MAX))
    for j, v in fixed.items():
        theta[j] = v
    compute, comm = dict(prior_compute), dict(prior_comm)
    for (t, n), v in zip(names, theta, strict=True):
        (compute if t == "c" else comm)[n] = float(v)
    return compute, comm


def _median_rel(pred: list[float], meas: list[float]) -> float:
    return float(statistics.median(abs(p - m) / m for p, m in zip(pred, meas, strict=True))) if meas else 0.0


def calibrate(reports: Sequence[RunReport | dict[str, Any]], profile: DeviceProfile, names: list[str] | None = None,
              shared_compute: bool = False) -> CalibrationResult:
    """A calibrated copy of `profile` from measured runs (RunReports, or their JSON objects).
    `shared_compute`: fit one compute factor for every op kind ('*') instead of one per kind and
    the optimizer, a sync cost per collective call and a framework cost per op instead of a factor
    per mesh axis, and take the profile's measured overheads (optimizer step per tensor, DTensor
    dispatch, checkpointing) and collective fits as they are - a few physical quantities, for runs
    of one model that are to predict another's."""
    names = names or [f"report {i + 1}" for i in range(len(reports))]
    cal0 = profile.calibration
    c0 = dict(cal0.compute) if cal0 else {}
    a0 = dict(cal0.comm) if cal0 else {}
    o0 = float(cal0.memory_overhead_bytes) if cal0 else 0.0
    recoster = Recoster(profile, shared_compute)
    parts: list[PlanParts] = []
    t_meas: list[float] = []
    m_meas: list[float] = []
    skipped: dict[str, str] = {}
    for name, data in zip(names, reports, strict=True):
        r = check_report(data, name)
        if r.plan["device"] != profile.device:
            skipped[name] = f"ran on {r.plan['device']!r}, the profile is of {profile.device!r}"
            continue
        try:
            parts.append(recoster.parts(r.plan))
        except InputError as e:
            skipped[name] = str(e)
            continue
        t_meas.append(r.measured.time_s)
        m_meas.append(float(r.measured.memory_bytes or 0))  # check_report: positive
    if not parts:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise InputError(f"no run report could be used for calibration ({why})")
    if shared_compute:  # comm factors stay as they are; the per-call and per-op costs are fitted (in ms)
        a0 = {SYNC: 1e3 * (cal0.sync_s if cal0 else 0.0), OPS: 1e3 * (cal0.op_s if cal0 else 0.0)}
        c0 = {"*": c0.get("*", 1.0)}
    compute, comm = fit_factors(parts, t_meas, c0, a0)
    compute.update(recoster.fixed)
    overhead = memory_overhead([p.memory for p in parts], m_meas)
    before_t = _median_rel([p.time(c0, a0) for p in parts], t_meas)
    after_t = _median_rel([p.time(compute, comm) for p in parts], t_meas)
    sync_s = 1e-3 * comm.pop(SYNC, 0.0) if shared_compute else (cal0.sync_s if cal0 else 0.0)
    op_s = 1e-3 * comm.pop(OPS, 0.0) if shared_compute else (cal0.op_s if cal0 else 0.0)
    before_m = _median_rel([p.memory + o0 for p in parts], m_meas)
    after_m = _median_rel([p.memory + overhead for p in parts], m_meas)
    cal = Calibration(compute={k: round(v, 6) for k, v in compute.items()}, comm={k: round(v, 6) for k, v in comm.items()},
                      memory_overhead_bytes=int(round(overhead)), sync_s=sync_s, op_s=op_s, reports=len(parts),
                      time_error_before=before_t,
                      time_error_after=after_t, memory_error_before=before_m, memory_error_after=after_m)
    out = profile.model_copy(update={"calibration": cal}, deep=True)
    return CalibrationResult(profile=out, runs=len(parts), skipped=skipped, time_error_before=before_t,
                             time_error_after=after_t, memory_error_before=before_m, memory_error_after=after_m)
