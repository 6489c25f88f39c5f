"""Which HuggingFace models' pipelines the executor launches, and why the others do not.

The worker's stages restate a model's forward stage by stage (worker/hfstages.py); this says for
which families they do, so the worker (worker/analyze.py) and the service (service/host.py, which
may not import the worker) refuse the same plans with the same reason. The zoo's own classes have
their own splits (worker/stages.py).
"""

from __future__ import annotations

# encoder-decoders: T5's and BART's stacks, cut anywhere across the encoder's and decoder's layers
SEQ2SEQ_PIPELINES = ("t5", "bart")

# Llama-style causal LMs: model type -> how its base model's forward masks its layers: one causal
# mask ("causal"), one that slides where config.sliding_window is set ("window", Mistral's), or
# each layer's mask by config.layer_types[i] ("layer_types", Qwen2's). Every one of these embeds,
# runs its layers with (mask, rotary tables, positions), then norm and lm_head, as LlamaModel does;
# families whose forward does more (Gemma's embedding scale, soft-capping, ...) are not listed.
DECODER_PIPELINES = {"llama": "causal", "mistral": "window", "mixtral": "window", "qwen3_moe": "window",
                     "qwen2": "layer_types", "qwen2_moe": "layer_types", "qwen3": "layer_types"}


def seq2seq_refusal(model_type: str) -> str | None:
    """Why a pipeline of this encoder-decoder model type does not launch, or None when it does."""
    if model_type in SEQ2SEQ_PIPELINES:
        return None
    return (f"a pipeline of the {model_type!r} encoder-decoder is priced but not launched: the executor's stages "
            f"restate the forward of {' and '.join(SEQ2SEQ_PIPELINES)} only (each stage passes its tensors, the "
            f"encoder's output among them, to the next, and runs its layers as the model's own stacks do)")


def decoder_refusal(model_type: str) -> str | None:
    """Why a pipeline of this (one-stack) HF model type does not launch, or None when it does."""
    if model_type in DECODER_PIPELINES:
        return None
    return (f"a pipeline of HF model type {model_type!r} is priced but not launched: the executor's stages restate "
            f"the forward of Llama-style causal LMs ({', '.join(DECODER_PIPELINES)}) and of the encoder-decoders "
            f"{' and '.join(SEQ2SEQ_PIPELINES)} only")
