"""Pipelines of HuggingFace models launch: encoder-decoders (T5, BART, mBART) cut across their two
stacks, and every one-stack family the search plans (causal LMs, masked LMs, ViT). An
encoder-decoder's stages restate the transformers forward of the modules they hold; a one-stack
model's run the model's own forward over their layers (worker/hfstages.py ModelStage). Chained in
one process they give the model's own loss for every cut, and the search's (or the zoo tests'
hand-made) pipeline plans train on 4 gloo processes as one process does, with the point-to-point
sends and receives the ExecSpec counts for the tuples that cross each cut."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from search.models.pipelines import DECODER_PIPELINES
from search.models.zoo import ModelSpec, get_model, spec_from_hf_config
from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from tests.worker.configs import T5
from tests.worker.families import pipeline_points, pipelined
from tests.worker.parity import assert_trains_as_one_process
from tests.worker.shared import analyzed, share
from worker.stages import pipe_of

STEPS = 3
TOL = 2e-5  # fp32: the pipeline reorders nothing but the micro-batches' gradient sums
BART = {"model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 64, "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
_NARROW = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
               max_position_embeddings=128)
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, **_NARROW}


def _chained(spec: ModelSpec, cuts: list[int]) -> tuple[float, float]:
    """The model's loss on one batch, and the loss of its stages over these cuts run in a chain."""
    torch.manual_seed(0)
    model = spec.build()
    x, y = spec.example_inputs(4, 16, device="cpu", seed=1)
    pipe = pipe_of(model, spec)
    bounds = [0, *cuts, pipe.units]
    xs = pipe.first_args(x, y)
    with torch.no_grad():
        whole = float(model(x, y))
        for i in range(len(bounds) - 1):
            out = pipe.stage(bounds[i], bounds[i + 1], i == 0, i == len(bounds) - 2)(*xs)
            xs = out if isinstance(out, tuple) else (out,)
        return whole, float(pipe.loss(xs[0], y))


@pytest.mark.parametrize(("model", "cuts"), [
    ("t5-tiny", [1]), ("t5-tiny", [2]), ("t5-tiny", [3]), ("t5-tiny", [1, 2, 3]),
    ("bart-tiny", [1]), ("bart-tiny", [2]), ("bart-tiny", [1, 2, 3]),
])
def test_encoder_decoder_stages_compute_the_model(model, cuts):
    """Cuts inside the encoder (its hidden states, T5's position bias and the decoder's ids
    cross), at the stacks' seam (the encoder's output and the ids), inside the decoder (the
    encoder's output, the decoder's hidden states and T5's decoder bias)."""
    whole, chained = _chained(get_model(model), cuts)
    assert chained == pytest.approx(whole, abs=1e-6)


@pytest.mark.parametrize("cuts", [[1], [2], [3], [1, 2, 3]])
def test_mbart_stages_compute_the_model(cuts):
    """mBART: BART's stages with the layer norm that ends each stack, on the stage of the
    encoder's last layer and on the last stage."""
    spec = spec_from_hf_config({**BART, "model_type": "mbart"}, "mbart")
    whole, chained = _chained(spec, cuts)
    assert chained == pytest.approx(whole, abs=1e-6)


@pytest.mark.parametrize(("config", "cuts"), [
    (LLAMA, [1]),
    ({"model_type": "mixtral", "num_hidden_layers": 4, **_NARROW, "num_local_experts": 4, "num_experts_per_tok": 2},
     [1, 3]),
    # sliding windows on the layers past max_window_layers: each layer's mask by its type
    ({"model_type": "qwen2", "num_hidden_layers": 4, **_NARROW, "use_sliding_window": True, "sliding_window": 4,
      "max_window_layers": 2}, [1, 3]),
    # Gemma 2's alternating sliding layers and soft-caps; Gemma 3's window over 4 of 6 layers
    ({"model_type": "gemma2", "num_hidden_layers": 4, **_NARROW, "head_dim": 16, "sliding_window": 4}, [1, 2, 3]),
    ({"model_type": "gemma3_text", "num_hidden_layers": 6, **_NARROW, "head_dim": 16, "sliding_window": 4}, [2, 5]),
])
def test_decoder_stages_compute_the_model(config, cuts):
    whole, chained = _chained(spec_from_hf_config(config, config["model_type"]), cuts)
    assert chained == pytest.approx(whole, abs=1e-6)


def _tiny(model_type: str) -> dict:
    """A 4-layer variant of width 64 of the family, dropout and router noise off."""
    return {"model_type": model_type, "num_hidden_layers": 4, **_NARROW, **TINY.get(model_type, {})}


_GPT_DROP = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
_BERT_DROP = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
TINY: dict[str, dict] = {
    "gpt2": _GPT_DROP, "gpt_bigcode": _GPT_DROP, "gptj": {**_GPT_DROP, "rotary_dim": 8},
    "opt": {"dropout": 0.0, "attention_dropout": 0.0}, "bert": _BERT_DROP, "roberta": _BERT_DROP,
    "phimoe": {"router_jitter_noise": 0.0, "input_jitter_noise": 0.0}, "phi3": {"pad_token_id": 0},
    "glm4": {"pad_token_id": 0}, "mamba2": {"num_heads": 8, "head_dim": 16},
    # a Mamba-2 mixer of the tiny width (the default's 1024 channels take most of the test's time)
    "falcon_h1": {"mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_state": 16, "mamba_chunk_size": 8},
    # multi-latent attention: a key and value per query head; expert widths grouped_mm can stride
    "deepseek_v2": {"num_key_value_heads": 4, "moe_intermediate_size": 32},
    "deepseek_v3": {"num_key_value_heads": 4, "moe_intermediate_size": 32},
    # the zoo plans Whisper as WhisperForCausalLM (search/models/zoo.py _hf_kind): its decoder alone
    "whisper": {"d_model": 64, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 4,
                "decoder_attention_heads": 4, "pad_token_id": 0, "dropout": 0.0, "attention_dropout": 0.0,
                "activation_dropout": 0.0, "architectures": ["WhisperForConditionalGeneration"]},
}


@pytest.mark.parametrize("model_type", sorted(set(DECODER_PIPELINES) - {"llama", "mixtral", "qwen2"}))
def test_every_family_s_stages_compute_the_model(model_type):
    """Each family's own forward on every stage (worker/hfstages.py ModelStage): learned
    positions (GPT-2, OPT), ALiBi (BLOOM, MPT), embedding scales and soft-caps (Gemma), parallel
    attention and MLP (GPT-J, Falcon), Mamba and linear-attention layers (Jamba, Qwen3-Next),
    masked LMs and an image classifier: a first, a middle and a last stage chained."""
    whole, chained = _chained(spec_from_hf_config(_tiny(model_type), model_type), [1, 3])
    assert chained == pytest.approx(whole, abs=1e-6)


def test_a_family_not_checked_is_refused_with_the_reason():
    from worker.hfstages import NoPipeline

    spec = spec_from_hf_config({"model_type": "persimmon", "num_hidden_layers": 2, **_NARROW,
                                "num_key_value_heads": 4}, "persimmon")
    with torch.device("meta"):
        model = spec.build()
    with pytest.raises(NoPipeline, match="'persimmon' is priced but not launched"):
        pipe_of(model, spec)


@cache
def _frontier(name: str) -> list[Plan]:
    config = {"t5": T5, "bart": BART}[name]
    o = run_search(SearchRequest(hf_config=config, name=name, device="cpu", devices=4, devices_per_node=4,
                                 global_batch=8, seq_len=16, precision="fp32", baselines=False))
    return o.plans


def _piped(name: str, stages: int) -> Plan:
    """The search's fastest pipeline of `stages` stages across the two stacks."""
    return next(p for p in _frontier(name) if p.pipeline.stages == stages)


def _pp2_tp2(config: dict, name: str) -> Plan:
    """Of the pp2 x tp2 points the executor runs, the one splitting the most modules on the tensor
    axis inside each stage."""
    from worker.analyze import Unsupported, analyze

    def split(p: Plan) -> int:
        if not any(a.role == "tensor" and a.size > 1 for a in p.mesh.axes):
            return 0
        try:
            spec = analyze(p)
        except Unsupported:
            return 0
        return sum(st.style in ("colwise", "rowwise") for st in spec.styles)

    return max(pipeline_points(config, name, 2), key=split)


def _hand_pp2(config: dict, name: str) -> Plan:
    """The data-parallel baseline on 2 devices, pipelined over 2 stages (as the zoo's pp families)."""
    o = run_search(SearchRequest(hf_config=config, name=name, device="cpu", devices=2, devices_per_node=2,
                                 global_batch=8, seq_len=16, precision="fp32", pipeline=False))
    dp = Plan.model_validate(next(b.plan for b in o.report.baselines if b.name == "data-parallel"))
    return pipelined(dp, 2, "1f1b", 2)


def _llama_interleaved() -> Plan:
    """4 layers over pp2 x 2 virtual stages (one layer a chunk, chunk c on pp rank c % 2), 4
    micro-batches: interleaved 1F1B of an HF model."""
    config = {**LLAMA, "num_hidden_layers": 4}
    plan = _hand_pp2(config, "llama4")
    pipe = plan.pipeline.model_copy(update={"virtual_stages": 2, "micro_batches": 4, "micro_batch_size": 1,
                                            "stage_layers": [[0, 1], [1, 2], [2, 3], [3, 4]]})
    return plan.model_copy(update={"pipeline": pipe, "summary": f"{plan.summary} | interleaved v2 m4"})


MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 2, **_NARROW, "num_local_experts": 4, "num_experts_per_tok": 2}
# the search's own pipelines on 4 CPU devices: BART pp2 x dp2 (FSDP, both stacks recomputed), T5
# pp4 (one layer a stage: the decoder's embedding, tied to the encoder's and the head, on stage 2),
# T5 pp2 x tp2; Llama's (also interleaved) and Mixtral's (no pipeline on their tiny frontiers)
# pipelined by hand
PLANS = {
    "bart pp2 x dp2": lambda: _piped("bart", 2),
    "t5 pp4": lambda: _piped("t5", 4),
    "t5 pp2 x tp2": lambda: _pp2_tp2(T5, "t5"),
    "llama pp2 x dp2": lambda: _hand_pp2(LLAMA, "llama"),
    "mixtral pp2 x dp2": lambda: _hand_pp2(MIXTRAL, "mixtral"),
    "llama pp2 interleaved": _llama_interleaved,
    # the model's own forward on each stage (ModelStage): GPT-2's learned positions stood in for on
    # the last stage, its embedding tied to the head across the cut; ViT's pixels as placeholders
    "gpt2 pp2 x dp2": lambda: _hand_pp2({**_tiny("gpt2"), "num_hidden_layers": 2}, "gpt2"),
    "vit pp2 x dp2": lambda: _hand_pp2({**_tiny("vit"), "num_hidden_layers": 2}, "vit"),
    "bloom pp2 x tp2": lambda: _pp2_tp2({**_tiny("bloom"), "num_hidden_layers": 8}, "bloom"),
}

share(__name__, "runs", analyzed(PLANS), STEPS, lambda name: True)


@pytest.fixture(scope="module")
def runs(shared_launch):
    return shared_launch[(__name__, "runs")]


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_hf_pipeline_trains_as_one_process_does(name, runs):
    job, raw = runs[name]
    spec = job.spec
    assert spec.pipeline.stages > 1 and spec.source is not None and spec.source.kind == "hf_config"
    assert_trains_as_one_process(name, job, raw, STEPS, TOL)


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_hf_pipeline_sends_equal_the_spec(name, runs):
    """Per pp rank, one step's sends and receives: every tensor of a cut's tuple forward per
    micro-batch, the gradient of each float one back (the decoder's ids have none)."""
    job, raw = runs[name]
    pipe = job.spec.pipeline
    for r in raw["ranks"]:
        s = r["coord"]["pp"]
        want = {"send": pipe.p2p[s], "recv": (pipe.p2p_recv or pipe.p2p)[s]}
        assert r["p2p"] == want, f"{name} rank {r['rank']}"


def test_another_encoder_decoders_pipeline_is_refused_with_the_reason():
    """Pegasus' stacks embed positions by sinusoids BART's stages do not make: its pipelines are
    priced, and refused with the reason the service shows too."""
    from search.models.pipelines import seq2seq_refusal
    from worker.hfstages import NoPipeline

    spec = spec_from_hf_config({**BART, "model_type": "pegasus", "pad_token_id": 0}, "pegasus")
    assert spec.kind == "seq2seq"
    with torch.device("meta"):
        model = spec.build()
    with pytest.raises(NoPipeline) as e:
        pipe_of(model, spec)
    assert str(e.value) == seq2seq_refusal("pegasus")
