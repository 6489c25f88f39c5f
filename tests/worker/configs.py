"""Tiny HuggingFace configs that several executor test modules build models from (2 layers,
width 64, vocabulary 256, no dropout), written once here."""

from __future__ import annotations

from typing import Any

T5: dict[str, Any] = {"model_type": "t5", "num_layers": 2, "d_model": 64, "d_ff": 128, "num_heads": 4,
                      "vocab_size": 256, "pad_token_id": 0, "dropout_rate": 0.0}
GPT2: dict[str, Any] = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_inner": 128, "n_head": 4,
                        "vocab_size": 256, "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0,
                        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
BART: dict[str, Any] = {"model_type": "bart", "d_model": 64, "vocab_size": 256, "max_position_embeddings": 128,
                        "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "pad_token_id": 0, "dropout": 0.0,
                        "attention_dropout": 0.0, "activation_dropout": 0.0, "encoder_layerdrop": 0.0,
                        "decoder_layerdrop": 0.0}
