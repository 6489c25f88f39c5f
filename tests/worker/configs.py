"""Tiny HuggingFace configs that several executor test modules build models from (2 layers,
width 64, vocabulary 256, no dropout), written once here."""

from __future__ import annotations

from typing import Any

T5: dict[str, Any] = {"model_type": "t5", "num_layers": 2, "d_model": 64, "d_ff": 128, "num_heads": 4,
                      "vocab_size": 256, "pad_token_id": 0, "dropout_rate": 0.0}
