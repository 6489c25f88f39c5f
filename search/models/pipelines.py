"""Which HuggingFace models' pipelines the executor launches, and why the others do not.

The worker's stages restate a model's forward stage by stage (worker/hfstages.py); this says for
which families they do, so the worker (worker/analyze.py) and the service (service/host.py, which
may not import the worker) refuse the same plans with the same reason. The zoo's own classes have
their own splits (worker/stages.py).
"""

from __future__ import annotations

# encoder-decoders: T5's, BART's and mBART's stacks, cut anywhere across the encoder's and decoder's
# layers (Whisper is not planned as one: the zoo builds its decoder alone, a causal LM below)
SEQ2SEQ_PIPELINES = ("t5", "bart", "mbart")

# one-stack models (causal LMs, masked LMs, an image classifier) whose pipelines launch: each stage
# runs the model's own forward over its layers (worker/hfstages.py ModelStage), which makes masks,
# positions, rotary tables, ALiBi biases and embedding scales from placeholders of the inputs'
# shape as it does for the whole model. That holds where what crosses a cut between two layers is
# the hidden states alone, which tests/worker/test_hf_pipelines.py checks family by family (the
# stages chained equal the model's loss); a family not checked so is refused.
DECODER_PIPELINES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
    "gemma", "gemma2", "gemma3_text", "phi", "phi3", "phimoe", "falcon", "falcon_h1", "falcon_mamba",
    "gpt_neox", "gptj", "gpt2", "gpt_bigcode", "gpt_oss", "opt", "bloom", "mpt", "cohere", "cohere2",
    "deepseek_v2", "deepseek_v3", "olmo", "olmo2", "olmoe", "granite", "granitemoe", "jamba", "mamba", "mamba2",
    "starcoder2", "stablelm", "glm4", "glm4_moe", "internlm3", "minimax", "llama4_text", "bert", "roberta", "vit",
    "whisper",  # as the zoo builds it (search/models/zoo.py _hf_kind): WhisperForCausalLM, the decoder alone
})


def seq2seq_refusal(model_type: str) -> str | None:
    """Why a pipeline of this encoder-decoder model type does not launch, or None when it does."""
    if model_type in SEQ2SEQ_PIPELINES:
        return None
    return (f"a pipeline of the {model_type!r} encoder-decoder is priced but not launched: the executor's stages "
            f"restate the forward of {', '.join(SEQ2SEQ_PIPELINES)} only (each stage passes its tensors, the "
            f"encoder's output among them, to the next, and runs its layers as the model's own stacks do)")


def decoder_refusal(model_type: str) -> str | None:
    """Why a pipeline of this (one-stack) HF model type does not launch, or None when it does."""
    if model_type in DECODER_PIPELINES:
        return None
    return (f"a pipeline of HF model type {model_type!r} is priced but not launched: the executor's stages run the "
            f"model's own forward over their layers, which is checked to pass nothing but the hidden states between "
            f"layers for {len(DECODER_PIPELINES)} families ({', '.join(sorted(DECODER_PIPELINES))}), and for the "
            f"encoder-decoders {', '.join(SEQ2SEQ_PIPELINES)}")
