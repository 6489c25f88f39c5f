"""Plans of a periodic stack (search/models/capture.py groups A, B, A, B, ... by period): the
Plan's recompute list and the executor's per-op configurations name the model's own layers, a
block layer standing for `period` of them (search.models.graph.block_layout)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from search.algorithm.ft import SearchOptions, search
from search.plans.plan import build_plans
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import Mesh, MeshAxis
from worker.analyze import op_configs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "search" / "algorithm"))
from test_periodic_exact import BATCH, _graph  # noqa: E402 - the tiny periodic model, shared


def test_periodic_plans_name_the_models_own_layers() -> None:
    g = _graph("ABABAB")
    cluster = make_cluster("h100-80gb", 4, devices_per_node=4)
    meshes = tuple(Mesh(pp=1, axes=(MeshAxis("dp", 4 // t, t, "data"), MeshAxis("tp", t, 1, "tensor")))
                   for t in (1, 2))
    res = search(g, cluster, TrainingJob(global_batch=BATCH, precision="bf16"),
                 SearchOptions(meshes=meshes, zero_stages=(0,), recompute=True))
    plans = build_plans(res)
    assert any(p.recompute for p in plans)
    for plan in plans:
        # a recomputed block layer is both of its module layers
        assert all(re.fullmatch(r"layers\.[0-5]", r) for r in plan.recompute)
        layers = {int(r.split(".")[1]) for r in plan.recompute}
        assert layers == {j for k in layers for j in (k // 2 * 2, k // 2 * 2 + 1)}
        configs = op_configs(plan, g)
        assert set(configs) == {op.name for op in g.ops}
        for name, codes in configs.items():
            # each code is a dimension of the op itself: layer k's configuration was written in
            # block layer 0's names and mapped to module layers 2k, 2k + 1
            # (a label from outside the stack, the input's, is left as it is)
            assert all(c in g.op(name).labels() for c in codes if c and c.startswith("layers.")), (name, codes)


# A periodic HF model the executor runs: Llama-4's layers alternate rotary and no-rotary attention
# (period 2 here, a dense MLP everywhere), 6 layers: 3 periods
PERIODIC_HF = {"model_type": "llama4_text", "num_hidden_layers": 6, "hidden_size": 64, "intermediate_size": 128,
               "intermediate_size_mlp": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "vocab_size": 256, "max_position_embeddings": 128, "moe_layers": [], "no_rope_layer_interval": 2,
               "attention_dropout": 0.0, "pad_token_id": 0}
HF_BATCH, HF_SEQ = 8, 32


def test_a_recomputed_period_holds_what_the_search_keeps() -> None:
    """The executor checkpoints each module layer of a recomputed period, so after the forward the
    input of every layer is alive; the search keeps, per recomputed period, the output of each of
    its module layers (`layer_outputs`): as many tensors, priced at the bytes the run holds (a layer's
    input is the previous one's output; HF's RMSNorm reads it through a cast, so no backward saves
    it: the checkpoint alone holds it)."""
    import gc
    import weakref

    import torch

    from search.algorithm.chain import layer_outputs
    from search.algorithm.evaluate import tables
    from search.models.capture import capture_model
    from search.models.zoo import spec_from_hf_config
    from search.plans.api import SearchRequest, run_search
    from search.prices.costmodel import CostModel
    from worker.analyze import analyze
    from worker.executor import build

    o = run_search(SearchRequest(hf_config=PERIODIC_HF, name="llama4p", device="cpu", devices=1, devices_per_node=1,
                                 global_batch=HF_BATCH, seq_len=HF_SEQ, precision="fp32", pipeline=False,
                                 grad_accumulation=False, baselines=False))
    plan = next(p for p in o.plans if len(p.recompute) == PERIODIC_HF["num_hidden_layers"])
    module, _, _ = build(analyze(plan), None, torch.device("cpu"), seed=0)
    inputs: list[weakref.ref] = []
    for layer in module.get_submodule("model.model.layers"):
        layer.register_forward_pre_hook(
            lambda _m, a, kw: inputs.append(weakref.ref(a[0] if a else kw["hidden_states"])), with_kwargs=True)
    tokens = torch.randint(0, 256, (HF_BATCH, HF_SEQ + 1), generator=torch.Generator().manual_seed(1))
    loss = module(tokens[:, :-1], tokens[:, 1:])
    gc.collect()
    held = sorted(float(t.numel() * t.element_size()) for r in inputs if (t := r()) is not None)
    loss.backward()
    assert len(held) == PERIODIC_HF["num_hidden_layers"]

    # what the price keeps of them when every period is recomputed, on this one device
    g = capture_model(spec_from_hf_config(PERIODIC_HF, "llama4p"), HF_BATCH, HF_SEQ)
    cm = CostModel(g, make_cluster("cpu", 1), TrainingJob(global_batch=HF_BATCH, seq_len=HF_SEQ, precision="fp32"))
    ops, _ = tables(g, cm, Mesh(pp=1, axes=(MeshAxis("dp", 1, 1, "data"),)))
    assert sorted(float(ops[name].parts_rc[0, 3]) for name in layer_outputs(g)) == held
