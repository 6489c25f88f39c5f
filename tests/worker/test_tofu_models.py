"""Tofu's models as planned: the search's own plans for the zoo's LSTM language model (batch on a
data axis; the gate GEMMs, embedding and head split on a tensor axis) and wide ResNet (batch on a
data axis) run on 4 gloo processes and reproduce the single-process losses step by step; the
collectives of one tensor-parallel step equal the plan's, module by module."""

from __future__ import annotations

import pytest

from search.models.zoo import get_model
from search.plans.plan import Plan
from tests.worker.parity import assert_losses_match, frontier_on, mesh
from tests.worker.shared import analyzed, share
from worker.commcheck import mismatches
from worker.reference import reference_losses

STEPS = 3
TOL = 2e-5  # fp32: collectives reorder float sums, nothing more
LSTM, WRN = "lstm-tiny", "wrn-tiny"


def split_ops(plan: Plan) -> set[str]:
    """The ops the plan splits on its tensor axis (every layer's variant included)."""
    ops = [o for o in plan.ops] + [o for b in plan.blocks for v in b.variants for o in v]
    return {o.op for o in ops if o.config[-1] != "R"}


def lstm_tp(dp: int, tp: int) -> Plan:
    """The frontier point on dp x tp that splits the most ops: an LSTM layer's input-gate GEMM
    beside the embedding and the head."""
    return max(frontier_on(LSTM, mesh(dp, tp), 0), key=lambda p: len(split_ops(p)))


PLANS = {
    "lstm dp": lambda: frontier_on(LSTM, mesh(4, 1), 0)[0],
    "lstm fsdp": lambda: frontier_on(LSTM, mesh(4, 1), 3)[0],
    "lstm tp": lambda: lstm_tp(1, 4),
    "lstm dp x tp": lambda: lstm_tp(2, 2),
    "wrn dp": lambda: frontier_on(WRN, mesh(4, 1), 0)[0],
    "wrn fsdp": lambda: frontier_on(WRN, mesh(4, 1), 3)[0],
}
COMM = ("lstm tp",)  # the plan's expected collectives are the tensor axis's (worker/commcheck.py)


share(__name__, "runs", analyzed(PLANS), STEPS, lambda name: name in COMM)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


@pytest.mark.parametrize("name", list(PLANS))
def test_loss_matches_single_process(name, runs):
    job, raw = runs[name]
    spec = job.spec
    # per-shard BatchNorm under data parallelism: the reference accumulates over the same shards
    shards = spec.size("data") if any("BatchNorm" in n for n in spec.notes) else 1
    ref = reference_losses(spec.model, STEPS, spec.global_batch, spec.seq_len, seed=job.settings.seed,
                           lr=job.settings.lr, shards=shards)
    got = raw["losses"]
    assert_losses_match(f"{name} ({spec.summary})", got, ref, STEPS, TOL)


def test_the_tensor_parallel_plans_split_the_lstm_gates(runs):
    """Not a vacuous check: the tp plans run an LSTM gate GEMM under a parallel style, and on tp4
    the recurrent GEMM itself, one style serving its call at every time step."""
    for name in ("lstm tp", "lstm dp x tp"):
        job, _ = runs[name]
        assert any(s.style in ("colwise", "rowwise") and s.module.startswith("layers.")
                   for s in job.spec.styles), job.spec.styles
    job, _ = runs["lstm tp"]
    steps = get_model(LSTM).default_seq_len
    assert steps is not None
    hh = [s for s in job.spec.styles if s.module == "layers.0.hh"]
    assert len(hh) == 1 and hh[0].style in ("colwise", "rowwise") and len(hh[0].ops) == steps - 1, hh
    assert sum(e.module == "layers.0.hh" and e.phase == "forward" for e in job.spec.expected_comms) == steps - 1


@pytest.mark.parametrize("name", COMM)
def test_collectives_equal_the_plan(name, runs):
    job, raw = runs[name]
    assert raw["ranks"][0]["comm"], "CommDebugMode recorded nothing"
    bad = mismatches(job.spec.expected_comms, raw["ranks"][0]["comm"])
    assert not bad, f"{name} ({job.spec.summary}): " + "; ".join(bad)
