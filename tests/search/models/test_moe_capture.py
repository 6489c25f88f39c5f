"""Routed experts are captured as ops the search prices: router GEMM, dispatch, two grouped expert
GEMMs at a balanced load, combine; FLOPs equal to the analytic count for the zoo's MoE and for
transformers' Mixtral and Qwen2-MoE built from their configs."""

from __future__ import annotations

import functools

import pytest
import torch

from search.models.capture import capture_model
from search.models.graph import OpGraph
from search.models.moe import balanced_experts, capacity, expert_flops, is_experts
from search.models.zoo import ModelSpec, get_model, spec_from_hf_config

MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 64}
QWEN2_MOE = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 6,
             "num_experts_per_tok": 4, "norm_topk_prob": False, "vocab_size": 512, "max_position_embeddings": 64}


@functools.cache
def captured(source: str, batch: int, seq: int) -> tuple[ModelSpec, OpGraph]:
    if source == "moe-tiny":
        spec = get_model(source)
    else:
        spec = spec_from_hf_config(MIXTRAL if source == "mixtral" else QWEN2_MOE, source)
    return spec, capture_model(spec, batch, seq)


def layer_ops(g: OpGraph, layer: int) -> list:
    return [op for op in g.ops if f"layers.{layer}." in op.module]


# (source, batch, seq, hidden, expert intermediate, experts, top-k); Qwen2-MoE's 10 tokens x 4
# copies do not fill 6 equal buffers: each holds 40 / 6 rounded up to a multiple of the batch, 8
CASES = [("moe-tiny", 4, 64, 64, 64, 4, 2), ("mixtral", 2, 16, 64, 96, 4, 2), ("qwen2-moe", 2, 5, 64, 32, 6, 4)]


@pytest.mark.parametrize("source,batch,seq,hidden,inter,experts,top_k", CASES)
def test_expert_flops_match_the_analytic_count(source, batch, seq, hidden, inter, experts, top_k):
    """The router's GEMM and the two grouped expert GEMMs of a layer carry exactly the FLOPs of
    tokens x top_k SwiGLU experts at a balanced load, and nothing is left opaque."""
    _, g = captured(source, batch, seq)
    tokens = batch * seq
    ops = layer_ops(g, 1)
    router = [op for op in ops if op.kind == "linear" and op.output.shape == (tokens, experts)]
    grouped = [op for op in ops if op.kind == "linear" and any(len(p.shape) == 3 for p in op.params)]
    assert len(router) == 1 and len(grouped) == 2
    got = router[0].flops + sum(op.flops for op in grouped)
    assert got == expert_flops(tokens, top_k, hidden, inter, experts, multiple=batch)
    assert [op.kind for op in ops].count("dispatch") == 1 and [op.kind for op in ops].count("combine") == 1
    assert not [op for op in g.ops if op.kind == "opaque"]
    c = capacity(tokens, top_k, experts, multiple=batch)
    assert c == {"moe-tiny": 128, "mixtral": 16, "qwen2-moe": 8}[source]
    for op in grouped:
        assert op.inputs[0].shape[:2] == (experts, c) and op.inputs[0].dims[:2] == ("expert", g.batch_label)
        assert op.params[0].dims[0] == "expert" and "expert" in op.splittable


@pytest.mark.parametrize("source", ["moe-tiny", "mixtral", "qwen2-moe"])
def test_meta_states_the_experts_and_the_load(source):
    spec, g = captured(source, *{c[0]: c[1:3] for c in CASES}[source])
    experts, top_k = next((c[5], c[6]) for c in CASES if c[0] == source)
    assert g.meta["moe_experts"] == experts and g.meta["moe_top_k"] == top_k
    assert g.meta["moe_layers"] == len(g.blocks[0].layers)
    assert "balanced" in str(g.meta["moe_load"])
    assert g.param_count() == spec.param_count()  # the expert weights are each owned once


def test_combine_prices_each_routed_copy():
    _, g = captured("moe-tiny", 4, 64)
    combine = next(op for op in g.ops if op.kind == "combine")
    y, w = combine.inputs
    assert combine.flops == 2.0 * 4 * 64 * 2 * 64  # a multiply and an add per copy and feature
    assert w.shape == (4 * 64, 2) and y.shape == (4, 128, 64)
    assert combine.output.dims == (g.batch_label, "hidden")


def test_buffers_split_over_every_data_parallel_size_the_batch_does():
    """Qwen1.5-MoE's 60 experts and top-4 leave 64 x 4096 x 4 / 60 = 17476.3 tokens per expert: the
    buffers hold 17536 (a multiple of the batch, 0.3% more), which 2, 4, ..., 64 ranks split."""
    assert capacity(64 * 4096, 4, 60, multiple=64) == 17536
    assert capacity(64 * 4096, 2, 8, multiple=64) == 64 * 4096 * 2 // 8  # Mixtral: exact


def test_capture_leaves_the_model_as_it_was():
    """The balanced stand-in is for capture only: afterwards the experts route for real again."""
    spec = get_model("moe-tiny")
    torch.manual_seed(0)
    model = spec.build()
    experts = [m for m in model.modules() if is_experts(m)]
    assert len(experts) == 2
    ids, tgt = spec.example_inputs(2, 8, device="cpu", seed=0)
    before = model(ids, tgt)
    with balanced_experts(model) as found:
        assert [n for n, _ in found] == ["layers.0.ffn.experts", "layers.1.ffn.experts"]
    assert torch.equal(model(ids, tgt), before)
    assert all("forward" not in vars(m) for m in experts)


GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
           "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 128, "layer_types": None}


def test_gpt_oss_experts_with_biases_and_transposed_weights_are_captured_as_routed_experts():
    """gpt-oss stores its experts input-major ([E, H, 2I]) with biases and a clamped, interleaved
    SwiGLU; transformers runs them by indexing the weights per routed copy (a [T k, H, 2I] gather the
    batch cannot split). Captured as the other MoEs are: dispatch, two expert GEMMs with the
    analytic FLOPs, combine."""
    spec = spec_from_hf_config(GPT_OSS, "gpt-oss")
    batch, seq = 2, 16
    g = capture_model(spec, batch, seq)
    assert g.meta["moe_experts"] == 4 and g.meta["moe_top_k"] == 2 and g.meta["moe_layers"] == 2
    assert not [op for op in g.ops if op.name.endswith(":index")]
    ops = layer_ops(g, 0)
    gemms = [op for op in ops if op.kind == "linear" and len(op.output.shape) == 3 and "experts" in op.module]
    assert len(gemms) == 2 and all("expert" in op.output.dims for op in gemms)
    copies = 4 * capacity(batch * seq, 2, 4, batch)
    assert sum(op.flops for op in gemms) == 2.0 * copies * 64 * 2 * 32 + 2.0 * copies * 32 * 64
    owned = {p.name.rsplit(".", 1)[-1] for op in ops for p in op.params if p.owner and "experts" in p.name}
    assert owned == {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"}


def test_expert_ffn_computes_what_the_gpt_oss_experts_compute():
    """Expert parallelism runs each expert through expert_ffn: on gpt-oss's own experts module
    (biases, transposed weights, its clamped gate) it must equal the module's forward."""
    from transformers import AutoConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from search.models.moe import expert_ffn, experts_layout

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gpt_oss", **{k: v for k, v in GPT_OSS.items() if k != "model_type"})
    cfg._experts_implementation = "eager"
    experts = GptOssExperts(cfg)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.5)
    layout = experts_layout(experts)
    assert layout is not None and layout.transposed and layout.bias and layout.gated
    tokens = torch.randn(6, 64)
    index = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3]])
    weights = torch.rand(6, 2)
    want = experts(tokens, index, weights)
    got = torch.zeros_like(tokens)
    for t in range(6):
        for j in range(2):
            e = int(index[t, j])
            w = [experts.get_parameter(n)[e] for n in layout.names()]
            got[t] += weights[t, j] * expert_ffn(experts, layout, tokens[t:t + 1], *w)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
