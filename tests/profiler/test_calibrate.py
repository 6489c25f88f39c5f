"""Calibration (profiler/calibrate.py): re-costing a Plan from its JSON reproduces the search's
prediction, and factors fitted to runs remove the error a known distortion put there.

The runs here are RunReports of the search's own plans with "measured" figures made by a known
distortion of the cost model's parts (compute slower per op kind, collectives per axis, a fixed
memory overhead), which is what calibration has to undo.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paretoplan.cli import main
from profiler.calibrate import (
    FACTOR_MAX,
    FACTOR_MIN,
    PlanParts,
    Recoster,
    calibrate,
    check_report,
    fit_factors,
    memory_overhead,
    plan_parts,
)
from search import Errors, Measured, Predicted, RunReport, rel_error
from search.errors import InputError
from search.plans.api import SearchRequest, run_search
from search.prices.profile import load_profile
from tests.profiler.tiny import TINY

SLOWER = {"linear": 1.6, "attention": 2.2, "elementwise": 1.3, "optimizer": 1.2}
COMM = {"dp": 0.5, "tp": 1.8}
OVERHEAD = 64 << 20


@pytest.fixture(scope="module")
def plans(tiny_profile):
    prof, _ = tiny_profile
    o = run_search(SearchRequest(**TINY, profile=prof.model_dump(mode="json")))
    return prof, [p.model_dump() for p in o.plans] + [b.plan for b in o.report.baselines]


@pytest.fixture(scope="module")
def recoster(tiny_profile):
    return Recoster(tiny_profile[0])


def run_report(plan: dict[str, Any], time_s: float, memory_bytes: int) -> dict[str, Any]:
    """The RunReport (as JSON) of a one-step run of `plan` that measured these figures."""
    pred = Predicted(time_s=plan["predicted"]["time_s"], memory_bytes=plan["predicted"]["memory_bytes"])
    now = datetime.now(UTC)
    return RunReport(
        model=plan["model"], plan_summary=plan["summary"], num_devices=plan["num_devices"], device="cpu", backend="gloo",
        steps=1, seed=0, losses=[1.0], predicted=pred,
        measured=Measured(time_s=time_s, time_spread=0.0, memory_bytes=memory_bytes, memory_method="profiler"),
        errors=Errors(time=rel_error(time_s, pred.time_s), memory=rel_error(memory_bytes, pred.memory_bytes)),
        plan=plan, started=now, finished=now).model_dump(mode="json")


def reports(recoster, plans) -> list[dict]:
    out = []
    for plan in plans:
        parts = recoster.parts(plan)
        out.append(run_report(plan, parts.time(SLOWER, COMM), round(parts.memory) + OVERHEAD))
    return out


def test_recosting_a_plan_reproduces_its_prediction(plans, recoster) -> None:
    prof, ps = plans
    assert len(ps) >= 5
    assert plan_parts(ps[0], prof) == recoster.parts(ps[0])
    for plan in ps:
        parts = recoster.parts(plan)
        assert parts.time({}, {}) == pytest.approx(plan["predicted"]["time_s"], rel=1e-9)
        assert parts.memory == pytest.approx(plan["predicted"]["memory_bytes"], abs=1.0)
        assert parts.compute.get("linear", 0) > 0


def test_calibration_removes_the_error(plans, recoster) -> None:
    prof, ps = plans
    res = calibrate(reports(recoster, ps), prof)
    assert res.runs == len(ps) and not res.skipped
    assert res.time_error_before > 0.2
    assert res.time_error_after < 0.02
    assert res.memory_error_before > 0 and res.memory_error_after < 1e-6
    cal = res.profile.calibration
    assert cal.memory_overhead_bytes == OVERHEAD and cal.reports == len(ps)
    # the calibrated profile, used by a search, predicts the distorted "measurements"
    for r in reports(recoster, ps):
        pred = recoster.parts(r["plan"]).time(cal.compute, cal.comm)
        assert pred == pytest.approx(r["measured"]["time_s"], rel=0.03)
    assert "->" in res.line() and "in-sample" in res.line()


def test_a_model_that_overstates_memory_gets_no_negative_overhead(plans, recoster) -> None:
    """Runs that measure less than predicted (the model's sum is an upper bound of the peak)
    leave the overhead at zero: a negative constant would carry one model's slack to others."""
    prof, ps = plans
    lean = []
    for plan in ps:
        parts = recoster.parts(plan)
        lean.append(run_report(plan, parts.time({}, {}), round(parts.memory * 0.9)))
    cal = calibrate(lean, prof).profile.calibration
    assert cal is not None and cal.memory_overhead_bytes == 0
    assert memory_overhead([10.0, 20.0, 30.0], [14.0, 23.0, 35.0]) == 4.0
    assert memory_overhead([10.0, 20.0, 30.0], [9.0, 18.0, 35.0]) == 0.0


def test_fit_factors_recovers_known_factors() -> None:
    """With runs that exercise the parts in different proportions, the fit finds the factors
    that made their times (the pull towards the prior costs well under 1%)."""
    rng = np.random.default_rng(1)
    true_c, true_a = {"linear": 1.7, "attention": 0.6, "optimizer": 2.5}, {"dp": 0.4, "tp": 3.0}
    parts = [PlanParts(base=1e-4, compute={k: float(rng.uniform(1e-3, 1e-2)) for k in true_c},
                       comm={a: float(rng.uniform(1e-3, 1e-2)) for a in true_a}, memory=1e9) for _ in range(12)]
    measured = [p.time(true_c, true_a) for p in parts]
    c, a = fit_factors(parts, measured, {}, {})
    for k, v in true_c.items():
        assert c[k] == pytest.approx(v, rel=0.02), k
    for k, v in true_a.items():
        assert a[k] == pytest.approx(v, rel=0.02), k
    # a factor pushed below its bound is held at it, and the others refit around it
    c, _ = fit_factors(parts[:1], [parts[0].base * 1.0001], {}, {})
    assert all(FACTOR_MIN <= v <= FACTOR_MAX for v in c.values())


def test_unusable_reports_are_skipped_or_refused(plans, recoster) -> None:
    prof, ps = plans
    rs = reports(recoster, ps[:2])
    other = json.loads(json.dumps(rs[0]))
    other["plan"]["device"] = "h100-80gb"
    res = calibrate([rs[0], rs[1], other], prof, names=["a", "b", "c"])
    assert res.runs == 2 and "c" in res.skipped and "h100-80gb" in res.skipped["c"]
    with pytest.raises(InputError, match="no run report could be used"):
        calibrate([other], prof, names=["c"])
    with pytest.raises(InputError, match="measured.time_s must be a positive number"):
        check_report(run_report(ps[0], 0.0, 1), "r.json")
    with pytest.raises(InputError, match="r.json: not a RunReport .* at measured: Field required"):
        check_report({k: v for k, v in rs[0].items() if k != "measured"}, "r.json")


def test_cli_calibrate(plans, recoster, tmp_path: Path, capsys) -> None:
    prof, ps = plans
    paths = []
    for i, r in enumerate(reports(recoster, ps)):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    prof.dump(tmp_path / "p.json")
    rc = main(["profile", "--calibrate", *paths, "--profile", str(tmp_path / "p.json"), "--out",
               str(tmp_path / "cal.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "median time error" in out and "memory error" in out
    cal = load_profile(tmp_path / "cal.json")
    assert cal.calibration is not None and cal.calibration.reports == len(paths)
    assert cal.ops == prof.ops
