"""Plans of models searched from HuggingFace configs launch: each plan carries its config, the
worker rebuilds the model with transformers (random weights under the run's seed, nothing
downloaded) and the 4-process run reproduces the single-process one step by step. One launch
runs every family (the suite pays the process start-up once)."""

from __future__ import annotations

import pytest

from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from tests.worker.parity import assert_losses_match
from tests.worker.shared import share
from worker.reference import reference_losses

STEPS = 3
TOL = 2e-5  # fp32: collectives reorder float sums, nothing more
_NARROW = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=256,
               max_position_embeddings=128)
# family -> (its tiny config: 2 layers, width 64; the baseline plan it runs), the plans covering
# DDP, FSDP and tensor parallelism (transformers' attention takes its input by keyword)
CASES: dict[str, tuple[dict, str]] = {
    "llama": ({"model_type": "llama", **_NARROW, "num_key_value_heads": 2}, "megatron-tp2-dp"),
    "qwen2_moe": ({"model_type": "qwen2_moe", **_NARROW, "num_key_value_heads": 2, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2}, "fsdp"),
    "gpt_neox": ({"model_type": "gpt_neox", **_NARROW}, "data-parallel"),
    "phi": ({"model_type": "phi", **_NARROW}, "fsdp"),
    "gemma3_text": ({"model_type": "gemma3_text", **_NARROW, "num_key_value_heads": 2, "head_dim": 16},
                    "data-parallel"),  # non-persistent buffers (its embedding scale) rebuilt on every rank
}


def _plan(family: str) -> Plan:
    config, baseline = CASES[family]
    o = run_search(SearchRequest(hf_config=config, name=family, device="cpu", devices=4, devices_per_node=4,
                                 global_batch=8, seq_len=32, precision="fp32", pipeline=False))
    return Plan.model_validate(next(b.plan for b in o.report.baselines if b.name == baseline))


def _specs():
    from worker.analyze import analyze

    return {family: analyze(_plan(family)) for family in CASES}


VIT = {"model_type": "vit", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
       "num_attention_heads": 4, "image_size": 32, "patch_size": 8, "hidden_dropout_prob": 0.0,
       "attention_probs_dropout_prob": 0.0}


def _vit_leanest():
    from worker.analyze import analyze

    o = run_search(SearchRequest(hf_config=VIT, name="vit", device="cpu", devices=4, devices_per_node=4,
                                 global_batch=8, precision="fp32", baselines=False))
    return {"leanest": analyze(min(o.plans, key=lambda p: p.predicted.memory_bytes))}


share(__name__, "hf_runs", _specs, STEPS)
share(__name__, "vit_run", _vit_leanest, STEPS)


@pytest.fixture(scope="module")
def hf_runs(shared_launch):
    return shared_launch[(__name__, "hf_runs")]


@pytest.fixture(scope="module")
def vit_run(shared_launch):
    return shared_launch[(__name__, "vit_run")]["leanest"]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("family", list(CASES))
def test_a_plan_of_an_hf_config_trains_as_one_process_does(family, hf_runs):
    job, raw = hf_runs[family]
    spec = job.spec
    assert spec.source is not None and spec.source.kind == "hf_config" and spec.model == f"hf:{family}:{family}"
    ref = reference_losses(spec.model, STEPS, spec.global_batch, spec.seq_len, seed=job.settings.seed,
                           lr=job.settings.lr, source=spec.source)
    assert_losses_match(f"{family} ({spec.summary})", raw["losses"], ref, STEPS, TOL)


@pytest.mark.processes
@pytest.mark.slow
def test_vit_leanest_plan_trains_as_one_process_does(vit_run):
    """Tiny ViT's leanest plan (dp2 x tp2, FSDP over tensor-parallel shards) once could not run:
    its one dropout module, called after the attention and again after the MLP, converts each
    call's input (analyze refused two conversions at one module), and its classifier's 2 rows,
    split over tp2 and then FSDP's dp2, are loaded without torch's padded scatter (which asserted)."""
    job, raw = vit_run
    spec = job.spec
    ref = reference_losses(spec.model, STEPS, spec.global_batch, spec.seq_len, seed=job.settings.seed,
                           lr=job.settings.lr, source=spec.source)
    assert_losses_match(f"vit leanest ({spec.summary})", raw["losses"], ref, STEPS, TOL)
