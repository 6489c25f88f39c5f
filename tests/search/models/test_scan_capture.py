"""State-space and linear-recurrence layers captured as one scan op each (search/models/scan.py):
the projections around the scan stay ordinary ops, the scan's FLOPs follow its arithmetic, and
the batch splits over data-parallel ranks while tensor axes leave the scan whole."""

from __future__ import annotations

import pytest

from search.models.capture import capture_model
from search.models.zoo import spec_from_hf_config
from search.prices.cluster import make_cluster
from search.prices.mesh import MeshAxis, axis_choices, mesh_candidates, op_configs, placeable_meshes

# 2 layers, width 64: Mamba's inner width is 2 x 64 = 128, its state 16, its dt rank ceil(64 / 16) = 4
MAMBA = {"model_type": "mamba", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
         "state_size": 16, "vocab_size": 256}
JAMBA = {"model_type": "jamba", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "num_experts": 4,
         "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_expand": 2, "attn_layer_period": 2,
         "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1}
MINIMAX = {"model_type": "minimax", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
           "num_local_experts": 4, "num_experts_per_tok": 2, "block_size": 256,
           "layer_types": ["linear_attention", "full_attention"]}
B, L = 8, 32


def _graph(config: dict, batch: int = B, seq: int = L):
    return capture_model(spec_from_hf_config(config, config["model_type"]), batch, seq)


def _scans(g):
    return [op for op in g.ops if op.kind == "scan"]


def test_mamba_is_captured_with_one_scan_op_per_layer_and_its_projections_as_linears():
    g = _graph(MAMBA)
    scans = _scans(g)
    assert [op.name for op in scans] == [f"model.backbone.layers.{i}.mixer:selective_scan" for i in range(2)]
    assert len(g.ops) < 100  # no loop over the 32 steps unrolled
    assert g.blocks and len(g.blocks[0].layers) == 2  # identical layers: solved once
    linears = {op.module.rsplit(".", 1)[-1]: op for op in g.ops if op.kind == "linear" and ".layers.0." in op.name}
    assert set(linears) == {"in_proj", "x_proj", "out_proj"}
    # in_proj: 64 -> 2 x 128 for each of the 8 x 32 tokens
    assert linears["in_proj"].flops == 2 * B * L * 64 * 256
    # dt_proj's weight multiplies the low-rank dt (weight @ activation): its GEMM's FLOPs, 128 x 4 per token
    dt = next(op for op in g.ops if op.module.endswith("layers.0.mixer") and op.target.endswith("matmul.default"))
    assert dt.flops == 2 * B * 128 * L * 4


def test_the_selective_scan_costs_its_arithmetic_by_hand():
    """Per channel, step and state element: exp(A dt) 2, dt B 1, times u 1, the state update 2,
    the read-out against C 2; per channel and step: dt's bias and softplus 3, D's skip 2, the SiLU
    gate 5. Autograd keeps exp(A dt), dt B and every step's state: 3 x 16 per output element."""
    scan = _scans(_graph(MAMBA))[0]
    per_state, per_step = 2 + 1 + 1 + 2 + 2, 3 + 2 + 5
    assert scan.flops == B * 128 * L * (16 * per_state + per_step)
    assert scan.workspace == 3 * 16
    assert scan.output.shape == (B, 128, L)
    assert scan.splittable == (g_batch := "batch", scan.output.dims[1]) and g_batch in scan.output.dims


def test_lightning_attention_costs_its_arithmetic_by_hand():
    """One block of 32 tokens per head (block 256 > 32: not padded), head dim 16: Q K^T and the
    product with V 4 s^2 d, the decay mask s^2, the state read and write 4 s d^2, the decays 2 s d,
    the state update 2 d^2."""
    g = _graph(MINIMAX)
    (scan,) = _scans(g)
    s, d = L, 16
    assert scan.name == "model.model.layers.0.self_attn:lightning_attention"
    assert scan.flops == B * 4 * (4 * s * s * d + s * s + 4 * s * d * d + 2 * s * d + 2 * d * d)
    # its projections stay Linear ops
    mods = {op.module.rsplit(".", 1)[-1] for op in g.ops if op.kind == "linear" and "layers.0.self_attn" in op.module}
    assert mods == {"qkv_proj", "output_gate", "out_proj"}


def test_jamba_captures_its_hybrid_stack():
    """Jamba interleaves Mamba layers, attention and routed experts: each is captured as itself."""
    g = _graph(JAMBA)
    kinds = {op.kind for op in g.ops}
    assert {"scan", "attention", "dispatch", "combine"} <= kinds
    (scan,) = _scans(g)
    assert scan.module == "model.model.layers.0.mamba"
    assert g.meta["moe_experts"] == 4


@pytest.mark.parametrize("config", [MAMBA, JAMBA], ids=["mamba", "jamba"])
def test_the_scan_splits_the_batch_and_stays_whole_on_a_tensor_axis(config):
    g = _graph(config)
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    meshes = placeable_meshes(g, mesh_candidates(cluster))
    data4 = next(m for m in meshes if m.axes[0].size == 4 and m.axes[0].role == "data")
    for scan in _scans(g):
        cfgs = op_configs(scan, data4, g.batch_label)
        assert cfgs and all(c[0] == g.batch_label for c in cfgs)
        tensor = MeshAxis(name="tp", size=2, stride=1, role="tensor")
        # its heads are independent, but transformers' layer code cannot run on a shard of them
        assert scan.output.dims[1] in scan.splittable
        assert axis_choices(scan, tensor, g.batch_label) == [None]


def test_every_state_space_family_captures_without_unrolling():
    """Mamba-2 and Falcon-H1 (the SSD chunked scan), Falcon-Mamba and Qwen3-Next (the gated delta
    rule): one scan op per recurrent layer."""
    narrow = {"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 256}
    cases = {
        "mamba2": {**narrow, "num_heads": 8, "head_dim": 16, "n_groups": 1, "state_size": 16, "chunk_size": 16},
        "falcon_mamba": {**narrow, "intermediate_size": 128, "state_size": 16},
        "falcon_h1": {**narrow, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "head_dim": 16, "mamba_d_ssm": 128, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16,
                      "mamba_chunk_size": 16, "mamba_n_groups": 1},
        "qwen3_next": {**narrow, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "head_dim": 16, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                       "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4,
                       "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "shared_expert_intermediate_size": 64, "layer_types": ["linear_attention", "full_attention"]},
    }
    for family, cfg in cases.items():
        g = _graph({"model_type": family, **cfg})
        scans = _scans(g)
        assert scans, family
        assert all(g.batch_label in op.splittable and op.flops > 0 and op.workspace > 0 for op in scans), family
        assert len(g.ops) < 400, family
