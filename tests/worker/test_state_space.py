"""A state-space model (tiny Mamba, its scan captured as one op: search/models/scan.py) launches:
the frontier's fastest and leanest plans on 4 gloo processes train as one process does, running
transformers' own torch reference of the scan; a plan that splits the scan's channels over a
tensor axis, which the executor cannot run, is refused at launch."""

from __future__ import annotations

import functools

import pytest

from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from tests.worker.parity import assert_trains_as_one_process
from tests.worker.shared import share
from worker.analyze import Unsupported, analyze

STEPS = 3
TOL = 2e-5  # fp32: collectives reorder float sums, nothing more
MAMBA = {"model_type": "mamba", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
         "state_size": 16, "vocab_size": 256}


@functools.cache
def _frontier() -> tuple[Plan, ...]:
    o = run_search(SearchRequest(hf_config=MAMBA, name="mamba", device="cpu", devices=4, devices_per_node=4,
                                 global_batch=8, seq_len=32, precision="fp32", baselines=False))
    return tuple(o.plans)


@pytest.fixture(scope="module")
def frontier() -> list[Plan]:
    return list(_frontier())


def _specs():
    ends = {"fastest": min(_frontier(), key=lambda p: p.predicted.time_s),
            "leanest": min(_frontier(), key=lambda p: p.predicted.memory_bytes)}
    return {what: analyze(plan) for what, plan in ends.items()}


share(__name__, "runs", _specs, STEPS)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("end", ["fastest", "leanest"])
def test_mamba_trains_on_4_processes_as_one_process_does(end, runs):
    job, raw = runs[end]
    spec = job.spec
    assert spec.num_devices == 4
    assert_trains_as_one_process(f"mamba {end}", job, raw, STEPS, TOL)


@pytest.mark.slow
def test_a_plan_splitting_the_scan_over_a_tensor_axis_is_refused_at_launch(frontier):
    """The scan's channels are independent, but the layer's code is not shardable by any parallel
    style: a plan that splits them (written by hand: the search never offers it) is refused."""
    plan = next(p for p in frontier if any(ax.role == "tensor" and ax.size > 1 for ax in p.mesh.axes))
    t = next(a for a, ax in enumerate(plan.mesh.axes) if ax.role == "tensor" and ax.size > 1)
    bad = plan.model_copy(deep=True)
    for variant in bad.blocks[0].variants:
        for o in variant:
            if o.kind == "scan":
                o.config[t] = next(lab for lab in _scan_labels(o.op) if lab != "batch")
    with pytest.raises(Unsupported, match=r"a state-space scan\) splits .* not executed"):
        analyze(bad)


def _scan_labels(op_name: str) -> tuple[str, ...]:
    from search.models.capture import capture_model
    from search.models.zoo import spec_from_hf_config

    g = capture_model(spec_from_hf_config(MAMBA, "mamba"), 8, 32)
    return next(op.splittable for op in g.ops if op.name == op_name)
