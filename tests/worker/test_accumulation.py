"""Gradient accumulation as planned: a one-stage plan that runs each rank's batch as micro-batches
(the default space prices such plans) reproduces the single-process losses on 4 gloo processes,
under replicate and DDP (one all-reduce after the last micro-batch), FSDP (ZeRO-3, sharded
gradients every micro-batch) and tensor parallelism beside data parallelism."""

from __future__ import annotations

import pytest

from search.plans.estimate import EstimateRequest, estimate
from tests.worker.parity import assert_losses_match
from tests.worker.shared import share
from worker.reference import reference_losses

MODEL, BATCH, SEQ, STEPS = "llama-tiny", 16, 32, 3
TOL = 2e-5  # fp32: micro-batches only reorder the sums of gradients
PLANS = {  # name: (tp, samples per micro-batch per data rank, ZeRO stage) on 4 devices, 2 micro-batches
    "dp4 replicate m2": (1, 2, 0),
    "dp4 zero1 m2": (1, 2, 1),  # classic DDP: no_sync before the last micro-batch
    "dp4 zero3 m2": (1, 2, 3),
    "dp2 x tp2 m2": (2, 4, 0),
}


def accumulated(tp: int, micro_batch: int, zero: int):
    est = estimate(EstimateRequest(model=MODEL, device="cpu", devices=4, devices_per_node=4, global_batch=BATCH,
                                   seq_len=SEQ, precision="fp32", tp=tp, micro_batch=micro_batch, zero=zero))
    assert est.plan.pipeline is not None and est.plan.pipeline.micro_batches == 2, est.plan.summary
    return est


def _specs():
    from worker.analyze import analyze

    return {name: analyze(accumulated(*p).plan) for name, p in PLANS.items()}


share(__name__, "runs", _specs, STEPS)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


@pytest.fixture(scope="module")
def reference():
    return reference_losses(MODEL, STEPS, BATCH, SEQ, seed=0, lr=1e-3)


def test_accumulation_plans_are_launchable() -> None:
    for p in PLANS.values():
        est = accumulated(*p)
        assert est.launchable, est.not_launchable_reason


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_loss_matches_single_process(name, runs, reference) -> None:
    job, raw = runs[name]
    assert job.spec.pipeline.micro_batches == 2 and job.spec.pipeline.stages == 1
    got = raw["losses"]
    assert_losses_match(f"{name} ({job.spec.summary})", got, reference, STEPS, TOL)
