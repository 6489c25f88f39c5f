"""Capture follows what transformers builds, family by family: the patterns that once kept a
model from planning, or priced it wrong, each on a tiny config (2 layers, width 64)."""

from __future__ import annotations

import pytest

from search.models.capture import capture_model
from search.models.zoo import spec_from_hf_config
from search.prices.cluster import make_cluster
from search.prices.mesh import mesh_candidates, placeable_meshes

NARROW = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "vocab_size": 256, "max_position_embeddings": 128}


def _graph(model_type: str, batch: int = 8, seq: int = 32, **extra):
    return capture_model(spec_from_hf_config({"model_type": model_type, **NARROW, **extra}, model_type), batch, seq)


@pytest.mark.parametrize("model_type", ["opt", "bert"])
def test_ids_broadcast_over_the_batch_do_not_block_data_parallelism(model_type):
    """OPT's positions and BERT's token types are looked up from ids made inside the model and
    broadcast over the batch: their lookup splits the batch as every other op does."""
    extra = {"ffn_dim": 128, "word_embed_proj_dim": 64} if model_type == "opt" else {}
    g = _graph(model_type, **extra)
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    meshes = placeable_meshes(g, mesh_candidates(cluster))
    assert any(m.axes[0].size == 4 and m.axes[0].role == "data" for m in meshes)
    assert all(g.batch_label in op.splittable for op in g.ops if g.batch_label in op.output.dims)


def test_a_table_read_at_positions_broadcast_over_the_batch_does_not_block_data_parallelism():
    """Whisper's decoder reads its positions table as `weight[position_ids]`, the ids one row
    expanded over the batch: an index op reading a parameter and constants only, whose leading
    dimension no operand carries. It splits as the batch does (its default config was refused:
    the op could not split its batch over the data-parallel ranks)."""
    cfg = {"model_type": "whisper", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 128,
           "decoder_ffn_dim": 128, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 256,
           "pad_token_id": 0}
    g = capture_model(spec_from_hf_config(cfg, "whisper"), 8, 32)
    lookup = next(op for op in g.ops if op.name.endswith("decoder.embed_positions:index"))
    assert not lookup.inputs and lookup.output.dims[0] == g.batch_label and g.batch_label in lookup.splittable
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    assert any(m.axes[0].size == 4 and m.axes[0].role == "data" for m in placeable_meshes(g, mesh_candidates(cluster)))


def test_a_weight_used_transposed_is_still_a_parameter_that_zero_shards():
    """Falcon computes `x @ self.weight.T`: the transposed weight is the parameter (a linear op
    owning it, whose batch-split gradient ZeRO shards), not an activation of its own."""
    g = _graph("falcon")
    owners = [op for op in g.ops if any(p.owner and p.name.endswith("query_key_value.weight") for p in op.params)]
    assert owners and all(op.kind == "linear" and g.batch_label in op.output.dims for op in owners)
    assert not [op for op in g.ops if "numpy_T" in op.name]


def test_an_interleaved_rotary_embedding_keeps_the_heads_apart_from_the_batch():
    """Cohere rotates interleaved pairs (stack on the last dimension, then flatten) and repeats
    its frequencies interleaved: with as many heads as samples, neither may merge the heads'
    dimension with the batch's (its data axis once replicated instead of splitting the batch)."""
    g = _graph("cohere", batch=8, seq=48, hidden_size=1024, num_attention_heads=8)
    q = next(op for op in g.ops if op.name.endswith("q_proj:linear"))
    assert q.output.dims[0] == g.batch_label and q.output.dims[-1] != g.batch_label
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    assert any(m.axes[0].size == 4 and m.axes[0].role == "data" for m in placeable_meshes(g, mesh_candidates(cluster)))


def test_a_recurrent_layer_capture_cannot_swap_is_refused_at_once_naming_its_layer():
    """LFM2's short convolution runs its own Python loop with no scan function capture swaps for an
    op (search/models/scan.py): exporting it would unroll the sequence; the refusal comes before
    the export and names the module."""
    from search.errors import InputError

    with pytest.raises(InputError, match=r"model\.model\.layers\.0\.conv \(Lfm2ShortConv\) is a recurrent.*not planned"):
        _graph("lfm2", seq=2048, num_key_value_heads=2, layer_types=["conv", "full_attention"])


def test_a_rotary_embedding_in_complex_numbers_is_captured():
    """DeepSeek-V2 (and Llama-4) rotate queries and keys as complex numbers: viewed as complex and
    back, the dimensions are new ones, priced at the complex dtype's size. Its default config leaves
    the experts per token unset: 6, as its released model, and the description says so."""
    spec = spec_from_hf_config({"model_type": "deepseek_v2", **NARROW, "num_key_value_heads": 4, "q_lora_rank": 32,
                                "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
                                "moe_intermediate_size": 32, "n_routed_experts": 8, "n_group": 1, "topk_group": 1,
                                "first_k_dense_replace": 1}, "dsv2")
    assert "num_experts_per_tok unset in the config: 6" in spec.description
    g = capture_model(spec, 8, 32)
    assert g.meta["moe_top_k"] == 6
    assert not [op for op in g.ops if "complex" in op.output.dtype]


def test_an_empty_part_of_a_concatenation_is_no_input():
    """Phi-3 concatenates each head's rotated part with the rest, empty when the rotary embedding
    spans the whole head: the empty slice is not an input (a tensor of size 0 is invalid), and the
    concatenation of one tensor is that tensor, not an op."""
    g = _graph("phi3", num_key_value_heads=2, pad_token_id=0)
    assert all(min(t.shape, default=1) > 0 for op in g.ops for t in (*op.inputs, op.output))
    assert not [op for op in g.ops if op.name.split(":")[-1].startswith("cat") and len(op.inputs) < 2]
    attention = [op for op in g.ops if op.kind == "attention"]
    assert len(attention) == 2 and all(g.batch_label in op.splittable for op in attention)


def test_multi_latent_attention_with_grouped_key_value_heads_is_refused_naming_the_field():
    """DeepSeek's keys and values are one per query head, expanded from the latent: a config with
    fewer key/value heads failed deep in torch.export ("Attempting to broadcast a dimension"); it is
    refused up front, naming the field."""
    from search.errors import InputError

    with pytest.raises(InputError, match=r"num_key_value_heads \(2\) must equal num_attention_heads \(4\) under "
                                         r"multi-latent attention"):
        spec_from_hf_config({"model_type": "deepseek_v3", **NARROW, "num_key_value_heads": 2, "kv_lora_rank": 16,
                             "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16}, "ds")


def test_experts_that_run_every_token_split_by_batch():
    """Llama-4's MoE runs every expert on every token, flattened (`tokens.repeat(E, 1)`): the
    tokens then were the inner part of one [E T, H] dimension that no batch split can follow, and
    no mesh could split the batch. Captured unflattened, [E, T, H], the experts' GEMMs split the
    batch, with the FLOPs of every expert on every token."""
    g = _graph("llama4_text", num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
               intermediate_size_mlp=128, pad_token_id=0)
    gemms = [op for op in g.ops if op.module.endswith("feed_forward") and op.kind in ("linear", "matmul")
             and len(op.output.shape) == 3]
    assert len(gemms) == 4  # two per layer
    assert all(g.batch_label in op.splittable for op in gemms)
    tokens = 8 * 32
    assert sum(op.flops for op in gemms[:2]) == 2.0 * 4 * tokens * 64 * (2 * 128) + 2.0 * 4 * tokens * 128 * 64
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    assert any(m.axes[0].size == 4 and m.axes[0].role == "data" for m in placeable_meshes(g, mesh_candidates(cluster)))


def test_a_stack_alike_after_its_first_layers_is_captured_as_a_whole_export_is():
    """DeepSeek-V3's first layers are dense and the rest MoE: the stack is not uniform, so it was
    exported whole (70 s for the 61 layers of its default config). The layers before the uniform run
    and two of the run are exported, the rest copied: the graph equals the whole export's."""
    import torch

    from search.models.capture import _INPUT_LABELS, capture_module

    cfg = {"model_type": "deepseek_v3", **NARROW, "num_hidden_layers": 5, "first_k_dense_replace": 2,
           "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
           "qk_nope_head_dim": 8, "v_head_dim": 16, "moe_intermediate_size": 32, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1}
    spec = spec_from_hf_config(cfg, "ds3")
    g = capture_model(spec, 4, 16)
    with torch.device("meta"):
        module = spec.build()
    whole = capture_module(module, spec.example_inputs(4, 16, device="meta"), spec.name, _INPUT_LABELS["lm"])
    assert [op.name for op in g.ops] == [op.name for op in whole.ops]
    assert [(op.kind, op.flops, op.output.shape) for op in g.ops] == [(op.kind, op.flops, op.output.shape)
                                                                       for op in whole.ops]
    assert sum(1 for op in g.ops if op.kind == "combine") == 3


JAMBA_PERIODIC = {"model_type": "jamba", **NARROW, "num_hidden_layers": 6, "num_key_value_heads": 2,
                  "num_experts": 4, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_expand": 2,
                  "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1}
QWEN3_NEXT_PERIODIC = {"model_type": "qwen3_next", **NARROW, "num_hidden_layers": 6, "num_key_value_heads": 2,
                       "head_dim": 16, "full_attention_interval": 2, "linear_num_key_heads": 2,
                       "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                       "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "shared_expert_intermediate_size": 64}


@pytest.mark.parametrize("cfg", [JAMBA_PERIODIC, QWEN3_NEXT_PERIODIC], ids=["jamba", "qwen3_next"])
def test_a_periodic_stack_is_captured_from_two_periods_as_a_whole_export_is(cfg):
    """Jamba's Mamba and attention layers (and Qwen3-Next's linear and full attention) alternate:
    the stack is periodic, not uniform, so it was exported whole (35-40 s for the 32 and 48 layers
    of their default configs). Two periods are exported and the second copied for the rest: the
    graph equals the whole export's, op by op, wiring and block-stack layers included."""
    import torch

    from search.models.capture import _INPUT_LABELS, _annotate_blocks, _replicate, _set_attr, _stack, capture_module

    spec = spec_from_hf_config(cfg, cfg["model_type"])
    g = capture_model(spec, 4, 16)
    with torch.device("meta"):
        module = spec.build()
    whole = _annotate_blocks(capture_module(module, spec.example_inputs(4, 16, device="meta"), spec.name,
                                            _INPUT_LABELS["lm"]), spec.blocks_attr or "", 6, 2)

    def outline(graph):
        return [(op.name, op.kind, op.module, op.flops, op.output.shape, tuple(t.source for t in op.inputs),
                 tuple(t.shape for t in op.inputs), tuple((p.name, p.shape) for p in op.params), op.saves,
                 op.workspace) for op in graph.ops]

    assert outline(g) == outline(whole)
    assert len(g.blocks) == 1 and len(g.blocks[0].layers) == 3  # one block-stack layer per period
    # and the copy is what capture made: two periods exported replicate (no fallback to the whole)
    layers = _stack(module, spec.blocks_attr or "")
    _set_attr(module, spec.blocks_attr or "", torch.nn.ModuleList(list(layers)[:4]))
    two = capture_module(module, spec.example_inputs(4, 16, device="meta"), spec.name, _INPUT_LABELS["lm"])
    copied = _replicate(two, spec.blocks_attr or "", 6, 0, 2)
    assert copied is not None and outline(copied) == outline(g)
    assert g.blocks == whole.blocks
    assert {k: g.meta.get(k) for k in whole.meta} == whole.meta  # the routed experts' counts
