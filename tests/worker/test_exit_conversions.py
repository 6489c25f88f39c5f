"""A tensor converted where its producer's module ends reaches every reader converted, and a reader
entering a module of its own converts it again from there: such plans train as one process does,
with the collectives the plan prices.

BART's post-LN layer norm ends the attention block; its output is read by the residual add of the
layer's own forward and by fc1, entering its Linear. A plan computing the norm whole and splitting
it by sequence for the add (the norm's output hook, as the add reads it in the layer's forward)
hands fc1 the split tensor, which fc1's column-parallel style gathers back. The search priced fc1
from the norm's placement (nothing to gather) and the executor refused two such pp4 plans of its
8-device frontier; now that conversion is priced from the add's placement, on a pair between the
two readers (search/prices/boundaries.py `outer_reader`), and the executor converts it there
(worker/analyze.py `arrives`).
"""

from __future__ import annotations

from functools import cache

import pytest

from search.plans.plan import Plan
from tests.worker.configs import BART
from tests.worker.parity import assert_trains_as_one_process
from tests.worker.shared import analyzed, share
from worker.spec import ExecSpec

STEPS = 3
TOL = 2e-5  # fp32, as every parity test of the executor


def converted_twice(spec: ExecSpec) -> list[str]:
    """The layer norms whose output is converted where they end (for the residual add) and again
    where fc1 of their layer enters, from the converted placement."""
    out = []
    for st in spec.styles:
        if st.style != "prepare_output" or not st.module.endswith("_layer_norm"):
            continue
        fc1 = next((t for t in spec.styles if t.module == st.module.rpartition(".")[0] + ".fc1"), None)
        if fc1 is not None and fc1.input_layout == st.desired_output_layout != st.output_layout:
            out.append(st.module)
    return out


@cache
def _bart_points() -> tuple[Plan, ...]:
    """Every point of every shape BART's 4-device search solves (not only its frontier's), fastest
    first."""
    import numpy as np

    from search.algorithm.ft import SearchOptions, search
    from search.algorithm.results import FrontierPoint
    from search.plans.api import SearchRequest, request_source, resolve, with_source
    from search.plans.plan import build_plans

    req = SearchRequest(hf_config=BART, name="bart", device="cpu", devices=4, devices_per_node=4, global_batch=8,
                        seq_len=16, precision="fp32", baselines=False)
    graph, cluster, job, _ = resolve(req)
    r = search(graph, cluster, job, SearchOptions(pipeline=True))
    points = []
    for i, sol in enumerate(r.solutions):
        rows = np.arange(len(sol.root))
        configs, splits = sol.read_back(rows)
        points += [FrontierPoint(time_s=float(sol.root.t[j]), memory_bytes=float(sol.root.m[j]), mesh_index=i,
                                 configs=configs, row=int(j), stages=splits[j]) for j in rows]
    plans = with_source(build_plans(r, points), request_source(req, graph))
    return tuple(sorted(plans, key=lambda p: p.predicted.time_s))


def _fastest_converted_twice(prefix: str) -> Plan:
    from worker.analyze import Unsupported, analyze

    for plan in _bart_points():
        if not plan.summary.startswith(prefix):
            continue
        try:
            if converted_twice(analyze(plan)):
                return plan
        except Unsupported:
            continue
    raise AssertionError(f"BART's search has no {prefix} point converting a layer norm's output twice")


def _without_recompute(plan: Plan) -> Plan:
    """The plan with no layer recomputed (the search's such points recompute every layer): the
    collective counts the executor compares with the plan's do not count a recomputed forward's."""
    return plan.model_copy(update={"recompute": []})


PLANS = {"bart dp2 x tp2": lambda: _fastest_converted_twice("pp1 x dp2 x tp2"),
         "bart pp2 x tp2": lambda: _fastest_converted_twice("pp2 x dp1 x tp2"),
         "bart dp2 x tp2 counted": lambda: _without_recompute(_fastest_converted_twice("pp1 x dp2 x tp2"))}

share(__name__, "runs", analyzed(PLANS), STEPS, lambda name: name.endswith("counted"))


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


def test_the_entering_reader_is_priced_from_the_outer_readers_placement():
    """No launch: fc1 converts the norm's output from the placement the add takes it in, priced on
    an 'outer' pair between the two readers; the edge norm -> fc1 carries nothing."""
    from search.plans.api import SearchRequest, resolve
    from search.prices.boundaries import Boundaries

    graph, *_ = resolve(SearchRequest(hf_config=BART, name="bart", device="cpu", devices=4, devices_per_node=4,
                                      global_batch=8, seq_len=16, precision="fp32", baselines=False))
    b = Boundaries(graph)
    norm = "model.model.encoder.layers.0.self_attn_layer_norm:layer_norm"
    assert b.outer_reader_of(norm, "model.model.encoder.layers.0.fc1:linear") == "model.model.encoder.layers.0:add#1"
    assert any(p.kind == "outer" and p.tensor == norm for p in b.pairs)
    assert not b.pays(norm, "model.model.encoder.layers.0.fc1:linear")


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_a_tensor_converted_at_an_exit_and_again_at_an_entry_trains_as_one_process(name, runs):
    job, raw = runs[name]
    assert converted_twice(job.spec), job.spec.summary
    assert_trains_as_one_process(name, job, raw, STEPS, TOL)


@pytest.mark.processes
@pytest.mark.slow
def test_the_conversions_collectives_are_those_the_plan_expects(runs):
    """The gather fc1's entry performs (and the reduce-scatter of its gradient) is among the
    collectives the plan expects, under the layer the executor runs it in, and the counts of every
    (unit, phase, kind) naming a norm's conversions agree with what ran. (Other counts of this plan
    differ from its expectation where no conversion of a norm is involved: its sequence-parallel
    final layer norm's weight gradients are all-reduced under the model's unit rather than the
    layer's, and one gather and one reduce-scatter run outside every layer.)"""
    from worker.commcheck import mismatches

    job, raw = runs["bart dp2 x tp2 counted"]
    norms = converted_twice(job.spec)
    edges = [f"{n}:layer_norm -> {n.rpartition('.')[0]}.fc1:linear" for n in norms]
    assert any(e.source in edges for e in job.spec.expected_comms), edges
    assert raw["ranks"][0]["comm"], "CommDebugMode recorded nothing"
    bad = [line for line in mismatches(job.spec.expected_comms, raw["ranks"][0]["comm"])
           if any(f"{n}:layer_norm" in line for n in norms)]
    assert not bad, f"{job.spec.summary}: " + "; ".join(bad)
