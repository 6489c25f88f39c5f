"""The service says why an encoder-decoder pipeline does not launch, before any worker refuses it."""

from __future__ import annotations

from search.models.seq2seq import PIPELINE_REFUSAL
from service.host import launch_blocker


def _plan(model: str, stages: int) -> dict:
    return {"model": model, "num_devices": 2, "pipeline": {"stages": stages, "micro_batches": 2},
            "predicted": {"memory_bytes": 1 << 20}}


def test_a_pipeline_across_the_stacks_is_not_launchable() -> None:
    assert launch_blocker(_plan("t5-tiny", 2)) == PIPELINE_REFUSAL
    assert launch_blocker(_plan("bart-tiny", 2)) == PIPELINE_REFUSAL


def test_accumulation_and_other_models_pipelines_are_not_refused_for_it() -> None:
    assert launch_blocker(_plan("t5-tiny", 1)) != PIPELINE_REFUSAL
    assert launch_blocker(_plan("gpt2-tiny", 2)) != PIPELINE_REFUSAL
