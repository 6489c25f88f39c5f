"""Baseline planners (DDP, FSDP, Megatron TP/SP, min-time@budget) are plans in the search's own
space, priced by its own cost model, and never beat the frontier."""

from __future__ import annotations

import functools

import pytest

from search.algorithm.chain import layer_index, recompute_var
from search.algorithm.ft import SearchOptions, search
from search.models.capture import capture_model
from search.models.zoo import get_model
from search.plans.baselines import as_result, baselines, column_label, row_label
from search.plans.plan import build_plans
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import mesh_candidates, op_configs

N = 8
GIB = 2**30


@functools.cache
def setup():
    graph = capture_model(get_model("gpt2"), 8, 128)  # 12 layers, 12 heads
    return graph, make_cluster("h100-80gb", N), TrainingJob(global_batch=8, seq_len=128)


@functools.cache
def planned():
    return {b.name: b for b in baselines(*setup(), pipelines=False)}


@functools.cache
def searched():
    return search(*setup())


def op_activation_bytes(b) -> float:
    """Activation bytes the ops themselves keep (edges' redistributed copies excluded)."""
    a = b.point.assignment
    return float(sum(oc.parts[a[name], 3] for name, oc in b.solution.op_costs.items()))


def test_every_planner_applies_and_uses_valid_configs():
    graph, cluster, _ = setup()
    bs = planned()
    # GPT-2's 12 heads do not divide over a node of 8: Megatron-LM's largest legal tp is 4
    assert set(bs) == {"data-parallel", "fsdp", "data-parallel+recompute", "fsdp+recompute",
                       "megatron-tp4-dp", "megatron-tp4-dp+recompute",
                       "megatron-tp4-sp-dp", "megatron-tp4-sp-dp+recompute"}
    meshes = mesh_candidates(cluster)
    n_layers = len(graph.blocks[0].layers)
    for i, b in enumerate(baselines(*setup(), pipelines=False)):
        assert b.solution.mesh in meshes and b.solution.mesh.num_devices == N
        assert b.point.mesh_index == i and b.point.row == 0
        # GPT-2's vocabulary (50257) splits over no tp: only its head and tied embedding replicate
        assert set(b.fallbacks) <= {"tok_emb:embedding", "lm_head:linear"}
        for op in graph.ops:
            idx = b.point.configs[op.name]
            assert idx.shape == (1,) and 0 <= int(idx[0]) < len(op_configs(op, b.solution.mesh))
        rc = {int(b.point.configs[recompute_var(k)][0]) for k in range(n_layers)}
        assert rc == ({1} if b.name.endswith("+recompute") else {0})
        assert b.time_s > 0 and b.memory_bytes > 0
        assert sum(b.breakdown.values()) == pytest.approx(b.memory_bytes, rel=1e-12)


def test_data_parallel_splits_the_batch_everywhere():
    graph, _, _ = setup()
    bs = planned()
    dp, fsdp = bs["data-parallel"], bs["fsdp"]
    assert dp.solution.mesh.axes[0].size == N and dp.solution.mesh.axes[1].size == 1
    assert (dp.zero, fsdp.zero) == (0, 3)
    assert fsdp.point.assignment == dp.point.assignment
    cfgs = dp.configs(graph)
    linears = [op for op in graph.ops if op.kind == "linear"]
    assert linears
    for op in graph.ops:
        want = graph.batch_label if graph.batch_label in op.splittable else None
        assert cfgs[op.name] == (want, None), op.name


def test_megatron_column_row_heads():
    graph, _, _ = setup()
    batch = graph.batch_label
    for name in ("megatron-tp4-dp", "megatron-tp4-sp-dp"):
        b = planned()[name]
        mesh = b.solution.mesh
        assert [(a.name, a.size) for a in mesh.axes] == [("dp", 2), ("tp", 4)] and b.zero == 0
        cfgs = b.configs(graph)
        seen = {"col": 0, "row": 0, "heads": 0, "gelu": 0}
        sp = "-sp-" in name
        for op in graph.ops:
            dp_lab, tp_lab = cfgs[op.name]
            assert dp_lab == (batch if batch in op.splittable else None), op.name
            if any(s in op.name for s in (".attn.q", ".attn.k", ".attn.v", ".mlp.fc1")):
                assert tp_lab == column_label(op, batch) and tp_lab != "hidden", op.name
                seen["col"] += 1
            elif any(s in op.name for s in (".attn.o", ".mlp.fc2")):
                assert tp_lab == row_label(op, batch) and tp_lab not in op.output.dims, op.name
                seen["row"] += 1
            elif op.kind == "attention":
                assert tp_lab == op.splittable[1] and tp_lab != batch
                seen["heads"] += 1
            elif op.name.endswith("mlp:gelu"):
                fc1 = graph.op(op.inputs[0].source)
                assert tp_lab == column_label(fc1, batch)
                seen["gelu"] += 1
            elif op.kind in ("norm", "elementwise") and "seq" in op.splittable:
                assert tp_lab == ("seq" if sp else None), op.name  # norms, residual adds, embedding sum
            else:
                assert tp_lab is None, op.name  # embeddings, lm head, loss
        assert seen == {"col": 48, "row": 24, "heads": 12, "gelu": 12}


def test_data_parallel_all_reduces_every_gradient_once():
    graph, _, _ = setup()
    b = planned()["data-parallel"]
    expected = 2 * (N - 1) / N * graph.param_count() * 2  # bf16 gradients
    assert b.comm_bytes["dp"] == pytest.approx(expected, rel=0.01)
    assert b.comm_bytes["tp"] == 0
    # exactly, per op: the owned parameters of every op that splits the batch (GPT-2's position
    # embedding has no batch dimension: its output gradient is all-reduced on the edge instead)
    a = b.point.assignment
    owned = sum(p.numel for op in graph.ops for p in op.params
                if p.owner and graph.batch_label in op.splittable)
    ops_comm = sum(oc.comm[a[name], 0] for name, oc in b.solution.op_costs.items())
    assert ops_comm == pytest.approx(2 * (N - 1) / N * owned * 2, rel=1e-9)


def test_sequence_parallel_moves_the_same_tp_volume():
    bs = planned()
    plain, sp = bs["megatron-tp4-dp"], bs["megatron-tp4-sp-dp"]
    # all-reduce = reduce-scatter + all-gather; SP adds only small gathers at the stack's ends
    assert sp.comm_bytes["tp"] == pytest.approx(plain.comm_bytes["tp"], rel=0.05)
    assert sp.comm_bytes["dp"] == pytest.approx(plain.comm_bytes["dp"], rel=1e-9)
    # the norms' and residual adds' activations are split over tp
    assert op_activation_bytes(sp) < op_activation_bytes(plain)


def test_sequence_parallel_needs_no_more_memory():
    """q, k and v read ln1's gathered output as one copy (search/prices/boundaries.py), so splitting the
    norms and residuals over tp saves activation memory (it once cost more: a copy per reader)."""
    bs = planned()
    assert bs["megatron-tp4-sp-dp"].memory_bytes <= bs["megatron-tp4-dp"].memory_bytes


def test_fsdp_and_recompute_trade_time_for_memory():
    bs = planned()
    assert bs["fsdp"].memory_bytes < bs["data-parallel"].memory_bytes
    # FSDP moves half as much again: reduce-scatter + all-gather in forward and in backward,
    # against DDP's all-reduce (= reduce-scatter + all-gather). Its time is not simply higher:
    # each rank's optimizer step updates an eighth of the parameters, and nothing here models
    # DDP's overlap of the all-reduce with backward.
    assert bs["fsdp"].comm_bytes["dp"] == pytest.approx(1.5 * bs["data-parallel"].comm_bytes["dp"], rel=0.01)
    for name in ("data-parallel", "fsdp", "megatron-tp4-dp", "megatron-tp4-sp-dp"):
        assert bs[name + "+recompute"].memory_bytes < bs[name].memory_bytes
        assert bs[name + "+recompute"].time_s > bs[name].time_s


@pytest.mark.slow  # against a full search of gpt2 on 8 devices (shared, ~3 s) and its baselines
def test_no_baseline_beats_the_frontier():
    r = searched()
    bs = baselines(*setup(), budget=0.5 * GIB, result=r)
    assert bs[-1].name == "min-time@budget"
    for b in bs:
        ok = [p for p in r.points
              if p.memory_bytes <= b.memory_bytes * (1 + 1e-9) and p.time_s <= b.time_s * (1 + 1e-9)]
        assert ok, f"{b.name}: {b.time_s:.6g} s, {b.memory_bytes:.6g} B is below-left of the frontier"


@pytest.mark.slow  # against a full search of gpt2 on 8 devices (shared, ~3 s) and its baselines
def test_min_time_at_budget_is_the_fastest_fitting_point():
    r = searched()
    budget = planned()["megatron-tp4-dp"].memory_bytes
    (b,) = [x for x in baselines(*setup(), budget=budget, frontier=r) if x.name == "min-time@budget"]
    fitting = [p for p in r.points if p.memory_bytes <= budget]
    assert b.time_s == min(p.time_s for p in fitting) and b.memory_bytes <= budget
    # every planner that fits the same budget is at most as fast
    assert all(x.time_s >= b.time_s for x in planned().values() if x.memory_bytes <= budget)
    assert not [x for x in baselines(*setup(), budget=1.0, result=r) if x.name == "min-time@budget"]
    with pytest.raises(ValueError):
        baselines(*setup(), budget=budget, frontier=r.points)


@pytest.mark.slow  # against a full search of gpt2 on 8 devices (shared, ~3 s) and its baselines
def test_plans_reproduce_the_baselines():
    graph, cluster, job = setup()
    r = searched()
    bs = baselines(graph, cluster, job, budget=0.5 * GIB, result=r)
    plans = build_plans(as_result(graph, cluster, job, bs))
    layers = layer_index(graph)
    assert layers
    for b, plan in zip(bs, plans, strict=True):
        assert plan.predicted.time_s == pytest.approx(b.time_s, rel=1e-9)
        assert abs(plan.predicted.memory_bytes - b.memory_bytes) <= 2
        assert plan.zero_stage == b.zero
        assert len(plan.recompute) == len(b.recomputed_layers())
        if b.comm_bytes:  # the planners' own pricing (min-time@budget comes from the search)
            assert plan.predicted.comm_bytes == pytest.approx(b.comm_bytes, rel=1e-9)


@pytest.mark.slow  # a pipeline search of gpt2 on 8 devices: ~7 s
def test_pipeline_planners_price_their_grid_choice_and_lose_to_the_frontier():
    """Megatron 3-D and PipeDream-2BW: pipeline plans with equal layers per stage, re-costed stage
    by stage to the same numbers, and never below-left of a frontier that searches pipelines."""
    from search.algorithm.evaluate import evaluate_pipeline

    graph, cluster, job = setup()
    bs = {b.name: b for b in baselines(graph, cluster, job, budget=8 * GIB, allow_async=True)}
    assert {"megatron-3d", "pipedream-2bw"} <= set(bs)
    for name, schedule in (("megatron-3d", "1f1b"), ("pipedream-2bw", "2bw")):
        b = bs[name]
        sol = b.solution
        assert sol.shape.schedule == schedule and sol.mesh.pp > 1
        assert max(b.point.stages) - min(b.point.stages) <= 1 and sum(b.point.stages) == 12
        r = evaluate_pipeline(sol, b.point.configs, b.point.stages)
        assert r["time"][0] == pytest.approx(b.time_s, rel=1e-12)
        assert r["memory"][0] == pytest.approx(b.memory_bytes, rel=1e-12)
        assert b.memory_bytes <= 8 * GIB
    assert bs["pipedream-2bw"].solution.mesh.axes[1].size == 1  # equi-replicated stages, no TP
    plans = build_plans(as_result(graph, cluster, job, [bs["megatron-3d"], bs["pipedream-2bw"]]))
    assert [p.pipeline.schedule for p in plans] == ["1f1b", "2bw"] and plans[1].pipeline.async_weights
    result = search(graph, cluster, job, SearchOptions(pipeline=True, allow_async=True))
    for b in (bs["megatron-3d"], bs["pipedream-2bw"]):
        fitting = [p for p in result.points if p.memory_bytes <= b.memory_bytes * (1 + 1e-9)]
        assert fitting and min(p.time_s for p in fitting) <= b.time_s * (1 + 1e-9), b.name


def test_megatron_3d_on_a_cluster_whose_flat_data_parallel_size_does_not_split_the_batch():
    """Megatron 3-D asks which tp sizes Megatron's split allows independently of data parallelism:
    with 16 devices and a batch of 4, the flat meshes dp8 x tp2 and dp4 x tp4 cannot place the batch,
    yet tp 2 and 4 are Megatron sizes on a pipeline (it used to end in a KeyError)."""
    graph = capture_model(get_model("gpt2-tiny"), 4, 64)
    cluster, job = make_cluster("h100-80gb", 16), TrainingJob(global_batch=4, seq_len=64)
    out = baselines(graph, cluster, job, pipelines=True)
    names = {b.name for b in out}
    assert "megatron-tp4-dp" in names and "data-parallel" not in names  # 4 samples do not split 16 ways
    for b in out:
        assert 0 < b.time_s < 1 and 0 < b.memory_bytes < GIB, b.name  # priced, not an infeasible sentinel


def test_a_baseline_whose_layout_breaks_a_placement_rule_is_named_infeasible_not_priced():
    """HF GPTBigCode's fused query-key-value projection (one key and value head): Megatron's column
    split of it changes placements where the executor cannot, so those baselines cost INFEASIBLE;
    the search reports them by name with the reason, and every baseline in the report has a real
    price (the report refused 1e30 bytes). (GPT-2's Conv1D layers were the case once; the search
    no longer splits them on a tensor axis at all, so its Megatron baselines replicate them.)"""
    from search import SearchRequest, run_search

    hf = {"model_type": "gpt_bigcode", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512,
          "n_positions": 128}
    out = run_search(SearchRequest(hf_config=hf, devices=8, seq_len=64))
    infeasible = out.result.stats["infeasible_baselines"]
    assert infeasible and all(b["name"].startswith("megatron") and b["reason"] for b in infeasible)
    assert {b.name for b in out.baselines}.isdisjoint(b["name"] for b in infeasible)
    assert all(b.feasible for b in out.baselines) and out.report.baselines
    assert out.report.stats["infeasible_baselines"] == infeasible
