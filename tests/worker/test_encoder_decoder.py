"""Encoder-decoders as planned: the search's own plans for the zoo's T5 and BART test models
(batch on a data axis, FSDP, and BART's encoder and decoder Linears split on a tensor axis) run
on 4 gloo processes and reproduce the single-process losses step by step; the collectives of one
tensor-parallel step equal the plan's, module by module. Pipelines across the two stacks run in
tests/worker/test_hf_pipelines.py."""

from __future__ import annotations

import pytest

from search.plans.plan import Plan
from tests.worker.parity import assert_losses_match, frontier_on, mesh
from tests.worker.shared import analyzed, share
from worker.commcheck import mismatches
from worker.reference import reference_losses

pytestmark = [pytest.mark.processes, pytest.mark.slow]

STEPS = 3
FLAT = {"pipeline": False, "accumulate": False}  # one mesh, whole batches: the layouts under test
TOL = 2e-5  # fp32: collectives reorder float sums, nothing more
T5, BART = "t5-tiny", "bart-tiny"


def split_ops(plan: Plan) -> set[str]:
    ops = [o for o in plan.ops] + [o for b in plan.blocks for v in b.variants for o in v]
    return {o.op for o in ops if o.config[-1] != "R"}


def most_split(model: str, dp: int, tp: int) -> Plan:
    """Of the frontier's points on dp x tp that the executor runs as planned, the one that splits
    the most ops on the tensor axis (others split what no torch style expresses, and are refused
    before launch, as analyze.py says)."""
    from worker.analyze import Unsupported, analyze

    def runs(p: Plan) -> bool:
        try:
            analyze(p)
        except Unsupported:
            return False
        return True

    return max((p for p in frontier_on(model, mesh(dp, tp), 0, **FLAT) if runs(p)), key=lambda p: len(split_ops(p)))


# T5's tensor-parallel plans run in tests/worker/test_hf_models.py (its tiny HF config's leanest)
PLANS = {
    "t5 dp": lambda: frontier_on(T5, mesh(4, 1), 0, **FLAT)[0],
    "t5 fsdp": lambda: frontier_on(T5, mesh(4, 1), 3, **FLAT)[0],
    "bart dp x tp": lambda: most_split(BART, 2, 2),
    "bart tp": lambda: most_split(BART, 1, 4),
}
# the plan's expected collectives are the tensor axis's (worker/commcheck.py): a plan with a data
# axis also runs DDP's gradient all-reduce, which the check does not model
COMM = ("bart tp",)


share(__name__, "runs", analyzed(PLANS), STEPS, lambda name: name in COMM)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


@pytest.mark.parametrize("name", list(PLANS))
def test_loss_matches_single_process(name, runs):
    job, raw = runs[name]
    spec = job.spec
    ref = reference_losses(spec.model, STEPS, spec.global_batch, spec.seq_len, seed=job.settings.seed,
                           lr=job.settings.lr)
    assert_losses_match(f"{name} ({spec.summary})", raw["losses"], ref, STEPS, TOL)


def test_the_tensor_parallel_plans_split_both_stacks(runs):
    """Not vacuous: the tp plans run Linears of the encoder and of the decoder (its
    cross-attention among them) under parallel styles."""
    for name in ("bart tp", "bart dp x tp"):
        job, _ = runs[name]
        mods = [s.module for s in job.spec.styles if s.style in ("colwise", "rowwise")]
        assert any("encoder" in m for m in mods) and any("decoder" in m for m in mods), mods


@pytest.mark.parametrize("name", COMM)
def test_collectives_equal_the_plan(name, runs):
    job, raw = runs[name]
    assert raw["ranks"][0]["comm"], "CommDebugMode recorded nothing"
    bad = mismatches(job.spec.expected_comms, raw["ranks"][0]["comm"])
    assert not bad, f"{name} ({job.spec.summary}): " + "; ".join(bad)
