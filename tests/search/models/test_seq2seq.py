"""Encoder-decoder capture: T5 and BART as two block families, the encoder's output read by every
decoder layer's cross-attention (search/models/seq2seq.py)."""

from __future__ import annotations

import json

import pytest

from search.errors import InputError
from search.models.capture import capture_model
from search.models.seq2seq import is_encoder_decoder
from search.models.zoo import get_model, model_from_hf_config, spec_from_hf_config


def _graph(name: str, batch: int = 4):
    return capture_model(get_model(name), batch, None)


@pytest.mark.parametrize("name", ["t5-tiny", "bart-tiny"])
def test_two_block_families_encoder_first(name: str) -> None:
    g = _graph(name)
    assert is_encoder_decoder(g)
    enc, dec = g.blocks
    assert "encoder" in enc.prefix and "decoder" in dec.prefix
    assert len(enc.layers) == len(dec.layers) == 2
    # a decoder layer holds self-attention, cross-attention and the MLP: more ops than an encoder layer
    assert len(dec.layers[0]) > len(enc.layers[0])
    assert g.param_count() == get_model(name).param_count()


@pytest.mark.parametrize("name", ["t5-tiny", "bart-tiny"])
def test_cross_attention_edges_read_the_encoder_output(name: str) -> None:
    """Every decoder layer has an attention whose keys and values come from linears reading one
    op of the encoder side: the encoder's output, a side input of the whole decoder stack."""
    g = _graph(name)
    enc_ops = {op.name for op in g.ops if "encoder" in op.module.split(".")}
    _, dec = g.blocks
    sources = set()
    for layer in dec.layers:
        ops = [g.op(n) for n in layer]
        cross = [op for op in ops if op.kind == "linear" and any(t.source in enc_ops for t in op.inputs)]
        assert len(cross) == 2, [op.name for op in cross]  # keys and values
        sources |= {t.source for op in cross for t in op.inputs}
        attn = [op for op in ops if op.kind == "attention"]
        assert len(attn) == 2  # causal self-attention and cross-attention
    assert len(sources) == 1  # the same tensor for every layer


def test_t5_position_bias_is_outside_the_stack() -> None:
    """T5 computes its relative position bias in layer 0 only; every layer reads it, so the
    stack's layers hold the same ops and the bias lookup is an op before the stack."""
    g = _graph("t5-tiny")
    enc, _ = g.blocks
    members = {n for layer in enc.layers for n in layer}
    bias = [op for op in g.ops if op.kind == "embedding" and "relative_attention_bias" in op.name]
    assert len(bias) == 2 and not members & {op.name for op in bias}  # one per stack
    assert len({len(layer) for layer in enc.layers}) == 1


def test_hf_configs_build_encoder_decoders(tmp_path) -> None:
    t5 = tmp_path / "t5.json"
    t5.write_text(json.dumps({"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2,
                              "num_heads": 4, "vocab_size": 256}))
    spec = model_from_hf_config(t5)
    assert spec.kind == "seq2seq" and spec.stacks == ("model.encoder.block", "model.decoder.block")
    g = capture_model(spec, 2, 8)
    assert [len(b.layers) for b in g.blocks] == [2, 2]
    bart = spec_from_hf_config({"model_type": "bart", "d_model": 64, "encoder_layers": 3, "decoder_layers": 2,
                                "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                                "decoder_ffn_dim": 128, "vocab_size": 256, "max_position_embeddings": 32}, "bart")
    assert bart.kind == "seq2seq" and "3+2 layers" in bart.description
    g = capture_model(bart, 2, 8)
    assert [len(b.layers) for b in g.blocks] == [3, 2]
    with pytest.raises(InputError, match="positions"):
        bart.example_inputs(2, 64)
