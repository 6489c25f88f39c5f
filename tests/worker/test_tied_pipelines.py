"""A parameter tied across pipeline stages and split over the tensor axis trains as one process does.

T5's shared embedding (the encoder's and the decoder's embed_tokens and the LM head, tied) sits on
the first stage (the encoder's embedding) and on the stage holding the decoder's embedding and the
head; GPT's token embedding on the first and its head on the last. Each stage holding it keeps a
copy, split over the tensor axis as the plan places it, whose gradients the executor sums across
the stages (worker/executor.py Runner._sum_tied_grads). These layouts were refused before launch
while that exchange all-reduced the copies' local gradients as autograd left them: a
vocabulary-parallel embedding's gradient is Replicate() (the whole table) where the head's is
Shard(0), a collective of the wrong size."""

from __future__ import annotations

import pytest

from search.plans.plan import Plan
from tests.worker.configs import T5
from tests.worker.families import baseline, pipeline_points, pipelined
from tests.worker.parity import assert_trains_as_one_process
from tests.worker.shared import analyzed, share
from worker.spec import ExecSpec

STEPS = 3
TOL = 2e-5  # fp32: the pipeline reorders nothing but the micro-batches' gradient sums
SPLIT = ("colwise", "rowwise")


def _tied_styles(spec: ExecSpec) -> dict[str, str]:
    """Module -> its tensor-parallel style, for every module holding a tied parameter that has one."""
    holders = {name.rpartition(".")[0] for group in spec.ties for name in group}
    return {st.module: st.style for st in spec.styles if st.module in holders}


def _t5_split_tie() -> Plan:
    """The fastest pp2 x tp2 point of T5's search whose tied embedding is split over the tensor axis
    by all three modules that read it (the encoder's embedding on stage 0, the decoder's and the
    head on stage 1)."""
    from worker.analyze import analyze

    for plan in pipeline_points(T5, "t5", 2):
        if not any(a.role == "tensor" and a.size == 2 for a in plan.mesh.axes):
            continue
        styles = _tied_styles(analyze(plan))
        if len(styles) == 3 and all(s in SPLIT for s in styles.values()):
            return plan
    raise AssertionError("T5's search has no pp2 x tp2 point splitting its tied embedding")


PLANS = {
    "t5 pp2 x tp2": _t5_split_tie,
    # the zoo's GPT: a row-parallel (vocabulary) embedding on stage 0, a column-parallel head on stage 1
    "gpt2-tiny pp2 x tp2": lambda: pipelined(baseline("gpt2-tiny", "megatron-tp2-dp", 2), 2, "1f1b", 2),
}

share(__name__, "runs", analyzed(PLANS), STEPS)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_a_tied_parameter_split_over_tp_across_stages_trains_as_one_process(name, runs):
    job, raw = runs[name]
    spec = job.spec
    styles = _tied_styles(spec)
    assert spec.pipeline.stages == 2 and styles and all(s in SPLIT for s in styles.values()), styles
    assert_trains_as_one_process(name, job, raw, STEPS, TOL)
