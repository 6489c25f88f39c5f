"""Plans of a periodic stack (search/models/capture.py groups A, B, A, B, ... by period): the
Plan's recompute list and the executor's per-op configurations name the model's own layers, a
block layer standing for `period` of them (search.models.graph.block_layout)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from search.algorithm.ft import SearchOptions, search
from search.plans.plan import Plan, build_plans
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


def _plans(devices: int, zero: int) -> list[Plan]:
    """The periodic HF model's frontier on `devices` CPU processes at one ZeRO stage."""
    from search.plans.api import SearchRequest, run_search

    o = run_search(SearchRequest(hf_config=PERIODIC_HF, name="llama4p", device="cpu", devices=devices,
                                 devices_per_node=devices, global_batch=HF_BATCH, seq_len=HF_SEQ, precision="fp32",
                                 pipeline=False, grad_accumulation=False, zero_stages=[zero], baselines=False))
    return o.plans


def _every_period(plan: Plan) -> bool:
    return len(plan.recompute) == PERIODIC_HF["num_hidden_layers"]


def test_the_executor_holds_a_recomputed_periods_input_alone() -> None:
    """The search prices a recomputed period as holding its input; the executor checkpoints the
    period as one unit (worker.periods), so after the forward only the inputs of each period's
    first layer are alive, not those of all its layers; the gradients are those of no recomputation."""
    import gc
    import weakref

    import torch

    from worker.analyze import Unsupported, analyze
    from worker.executor import build

    plans = [p for p in _plans(1, 0) if _every_period(p)]
    assert plans, "the search offers no plan recomputing every period"
    spec = analyze(plans[0])
    assert spec.recompute_period == 2
    assert spec.recompute == [f"model.model.layers.{i}" for i in range(6)]
    with pytest.raises(Unsupported, match="one whole period"):  # half a period has no checkpoint of its own
        analyze(plans[0].model_copy(update={"recompute": spec.recompute[:3]}))

    def forward_backward(recompute: bool) -> tuple[list[int], list[torch.Tensor]]:
        run = spec if recompute else spec.model_copy(update={"recompute": [], "recompute_period": 1})
        module, _, _ = build(run, None, torch.device("cpu"), seed=0)
        inputs: list[weakref.ref] = []
        for layer in module.get_submodule("model.model.layers"):
            layer.register_forward_pre_hook(
                lambda _m, a, kw: inputs.append(weakref.ref(a[0] if a else kw["hidden_states"])), with_kwargs=True)
        gen = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, 256, (HF_BATCH, HF_SEQ + 1), generator=gen)
        loss = module(tokens[:, :-1], tokens[:, 1:])
        gc.collect()
        alive = [i for i, r in enumerate(inputs) if r() is not None]
        loss.backward()
        return alive, [p.grad for p in module.parameters()]

    alive, grads = forward_backward(True)
    assert alive == [0, 2, 4], f"layer inputs held after the forward: {alive} (a period holds its first layer's)"
    alive_plain, plain = forward_backward(False)
    assert alive_plain == list(range(6))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, plain, strict=True))


@pytest.mark.processes
@pytest.mark.slow
def test_a_plan_recomputing_periods_trains_as_one_process_does() -> None:
    """Each recomputed period is one checkpoint and one data-parallel unit (FSDP2's grouped
    fully_shard, or replicate): the backward's replay of a period finds all its layers' parameters
    gathered. Four gloo processes, data parallel over all four: the search's ZeRO-3 plan recomputing
    every period (parameters gathered again in the backward), and its ZeRO-0 plan with every
    period recomputed by hand (replicate; at this size the search's lean ZeRO-0 plans are tensor
    parallel)."""
    from tests.worker.parity import assert_losses_match, launch
    from worker.analyze import analyze
    from worker.reference import reference_losses

    zero3 = next(p for p in _plans(4, 3) if _every_period(p) and p.mesh.axes[0].size == 4)
    zero0 = next(p for p in _plans(4, 0) if p.mesh.axes[0].size == 4)
    zero0 = zero0.model_copy(update={"recompute": list(zero3.recompute)})
    specs = {"zero3": analyze(zero3), "zero0": analyze(zero0)}
    assert [s.data_parallel for s in specs.values()] == ["fsdp", "ddp"]
    assert all(s.recompute_period == 2 for s in specs.values())
    steps = 3
    for name, (job, raw) in launch(specs, steps).items():
        spec = job.spec
        ref = reference_losses(spec.model, steps, spec.global_batch, spec.seq_len, seed=job.settings.seed,
                               lr=job.settings.lr, source=spec.source)
        assert_losses_match(f"{name} ({spec.summary})", raw["losses"], ref, steps, 2e-5)
