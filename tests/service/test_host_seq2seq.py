"""The service says whether a pipeline of an HF model launches, before any worker refuses it: T5's,
BART's and the one-stack families' worker/hfstages.py runs do (worker/hfstages.py), another family's is refused with the
reason worker/analyze.py gives."""

from __future__ import annotations

from search.models.pipelines import decoder_refusal, seq2seq_refusal
from service.host import launch_blocker


def _plan(model: str, stages: int, config: dict | None = None, stacks: int = 2) -> dict:
    plan: dict = {"model": model, "num_devices": 2, "pipeline": {"stages": stages, "micro_batches": 2},
                  "predicted": {"memory_bytes": 1 << 20}}
    if config is not None:  # a plan of an HF config: its source, and its stacks' block plans
        plan |= {"source": {"kind": "hf_config", "name": "mine", "config": config, "params": 1000},
                 "blocks": [{}] * stacks}
    return plan


def test_t5_and_bart_pipelines_across_the_stacks_are_launchable() -> None:
    assert launch_blocker(_plan("t5-tiny", 2)) is None
    assert launch_blocker(_plan("bart-tiny", 2)) is None
    assert launch_blocker(_plan("hf:t5:mine", 2, {"model_type": "t5"})) is None
    assert launch_blocker(_plan("hf:mbart:mine", 2, {"model_type": "mbart"})) is None


def test_another_encoder_decoders_pipeline_is_refused_with_the_reason() -> None:
    reason = seq2seq_refusal("pegasus")
    assert reason and "'pegasus' encoder-decoder is priced but not launched" in reason
    assert launch_blocker(_plan("hf:pegasus:mine", 2, {"model_type": "pegasus"})) == reason
    assert launch_blocker(_plan("hf:pegasus:mine", 1, {"model_type": "pegasus"})) is None


def test_one_stack_pipelines_launch_for_the_checked_families_only() -> None:
    for model_type in ("mixtral", "gemma", "gpt2", "bloom", "vit", "whisper"):
        assert launch_blocker(_plan(f"hf:{model_type}:mine", 2, {"model_type": model_type}, stacks=1)) is None
    reason = decoder_refusal("persimmon")
    assert reason and "'persimmon' is priced but not launched" in reason
    assert launch_blocker(_plan("hf:persimmon:mine", 2, {"model_type": "persimmon"}, stacks=1)) == reason
