"""T5's plans that the search offered and the executor accepted, but that failed at launch.

- T5's relative position bias (an Embedding of buckets x heads, made in layer 0's attention and
  read by every layer's) enters the fused attention as its mask. Capture left the mask out of the
  attention op, so nothing tied the bias's heads to the attention's: the search split the bias
  over the tensor axis where the attention replicated its heads (a tensor axis at "rep 100%"),
  pricing no conversion, and the scores (4 heads) met a bias of 2. Now the mask is an input of the
  attention op, its heads the attention's (search/models/capture.py), and a tensor read both
  inside its producer's enclosing module and in modules of its own leaves its module as made
  (search/prices/boundaries.py `read_elsewhere`).
- T5's stack dropout is one module called twice per stack (after the embedding, after the final
  norm), and the plan converts the calls differently (worker/parallelize.py PrepareFirstInput). A
  pipeline stage holding the encoder's last layer but not its embedding makes only the second
  call, which read the first call's layouts: the encoder output went to the decoder's
  cross-attention in a placement its row-parallel k and v did not expect (pp4 x tp2 on 8
  devices). Here on 4: pp2 x tp2 cut after the first encoder layer (worker/hfstages.py
  `held_calls`).
"""

from __future__ import annotations

import pytest

from search.plans.plan import Plan
from tests.worker.configs import T5
from tests.worker.families import pipeline_points, uneven
from tests.worker.parity import assert_trains_as_one_process
from tests.worker.shared import analyzed, share

STEPS = 3
TOL = 2e-5  # fp32, as every parity test of the executor
BIAS = "model.{}.block.0.layer.0.SelfAttention.relative_attention_bias"
ATTN = "model.{}.block.{}.layer.0.SelfAttention.q"


def _t5_frontier() -> list[Plan]:
    from search.plans.api import SearchRequest, run_search

    o = run_search(SearchRequest(hf_config=T5, name="t5", device="cpu", devices=4, devices_per_node=4, global_batch=8,
                                 seq_len=16, precision="fp32", baselines=False))
    return list(o.plans)


def _styles(plan: Plan) -> dict[str, str]:
    from worker.analyze import analyze

    return {st.module: st.style for st in analyze(plan).styles}


def _replicated_attention() -> Plan:
    """The fastest dp2 x tp2 plan of T5's frontier whose tensor axis replicates every attention
    (the bias was split there: "rep 100%")."""
    for plan in _t5_frontier():
        if not plan.summary.startswith("pp1 x dp2 x tp2"):
            continue
        st = _styles(plan)
        if all(st.get(ATTN.format(s, i)) is None for s in ("encoder", "decoder") for i in (0, 1)):
            return plan
    raise AssertionError("T5's frontier has no dp2 x tp2 plan replicating its attention on the tensor axis")


def _dropout_calls_apart() -> Plan:
    """The fastest pp2 x tp2 point converting the encoder dropout's two calls differently, cut after
    the first encoder layer: the second stage makes the second call only."""
    from worker.analyze import analyze

    for plan in pipeline_points(T5, "t5", 2):
        if not any(a.role == "tensor" and a.size == 2 for a in plan.mesh.axes):
            continue
        calls = next((st.call_layouts for st in analyze(plan).styles if st.module == "model.encoder.dropout"), [])
        if len(calls) == 2 and calls[0] != calls[1]:
            return uneven(plan, [[0, 1], [1, 4]])
    raise AssertionError("T5's pp2 x tp2 points convert the encoder dropout's calls alike")


PLANS = {"t5 dp2 x tp2 attention replicated": _replicated_attention,
         "t5 pp2 x tp2 cut inside the encoder": _dropout_calls_apart}

share(__name__, "runs", analyzed(PLANS), STEPS)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


def test_the_position_bias_is_split_only_with_the_heads_that_read_it():
    """Over T5's whole 4-device frontier: where the tensor axis splits a stack's position bias, it
    splits the heads of every attention reading it (no launch: the plans as analysed)."""
    for plan in _t5_frontier():
        st = _styles(plan)
        for stack in ("encoder", "decoder"):
            if st.get(BIAS.format(stack)) == "colwise":
                heads = [st.get(ATTN.format(stack, i)) for i in (0, 1)]
                assert heads == ["colwise", "colwise"], (plan.summary, stack, heads)


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_t5_plan_trains_as_one_process(name, runs):
    job, raw = runs[name]
    assert_trains_as_one_process(name, job, raw, STEPS, TOL)
