"""Plans read back from FT describe what was costed, in each op's own names."""

from __future__ import annotations

import functools

import pytest

from search.algorithm.ft import search
from search.models.capture import capture_model
from search.models.zoo import get_model
from search.plans.plan import Plan, build_plans, pick
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob


@functools.cache
def result():
    graph = capture_model(get_model("gpt2"), 8, 128)  # 12 layers: the stack is solved once
    return search(graph, make_cluster("h100-80gb", 4, devices_per_node=4), TrainingJob(global_batch=8, seq_len=128))


def test_plans_match_their_points():
    r = result()
    assert r.stats["block_reuse"]
    plans = build_plans(r)
    assert len(plans) == len(r.points) > 1
    for point, plan in zip(r.points, plans, strict=True):
        assert plan.predicted.time_s == pytest.approx(point.time_s, rel=1e-9)
        assert abs(plan.predicted.memory_bytes - point.memory_bytes) <= 2
        assert abs(plan.predicted.breakdown.total - plan.predicted.memory_bytes) <= 8
        assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_plan_configs_use_each_ops_own_labels():
    r = result()
    graph = r.graph
    for plan in build_plans(r):
        ops = list(plan.ops) + [op for b in plan.blocks for v in b.variants for op in v]
        for op_plan in ops:
            op = graph.op(op_plan.op)
            for label in op_plan.config:
                assert label == "R" or label in op.splittable, (op.name, label)
            for name, placements in op_plan.params.items():
                rank = len(next(p for p in op.params if p.name == name).shape)
                for pl in placements:
                    if pl.startswith("Shard("):
                        assert int(pl[6:-1]) < rank
        assert sum(len(b.layer_variant) for b in plan.blocks) == 12


def test_pick_fastest_fitting():
    pts = result().points
    mid = sorted(p.memory_bytes for p in pts)[len(pts) // 2]
    best = pick(pts, mid)
    assert best is not None and best.memory_bytes <= mid
    assert all(p.time_s >= best.time_s for p in pts if p.memory_bytes <= mid)
    assert pick(pts, min(p.memory_bytes for p in pts) - 1) is None


def test_pick_with_a_time_target_takes_the_leanest_in_time():
    pts = result().points
    times = sorted(p.time_s for p in pts)
    target = times[len(times) // 2]
    lean = pick(pts, float("inf"), target)
    assert lean is not None and lean.time_s <= target
    assert all(p.memory_bytes >= lean.memory_bytes for p in pts if p.time_s <= target)
    assert lean.memory_bytes < pick(pts, float("inf")).memory_bytes  # not the fastest: a leaner one is in time
    assert pick(pts, float("inf"), times[0] * 0.99) is None
    assert pick(pts, lean.memory_bytes - 1, target) is None  # the budget still holds


def test_every_plan_carries_model_flops_and_mfu():
    """Model FLOPs: 3 x the forward FLOPs of every op of every layer (block reuse solves the stack
    once but the graph keeps all 12 layers); MFU = model FLOPs / (time x devices x peak)."""
    from search.plans.flops import model_flops

    r = result()
    graph = r.graph
    layers = graph.blocks[0].layers
    assert len(layers) == 12
    per_layer = [sum(graph.op(n).flops for n in layer) for layer in layers]
    assert per_layer == [per_layer[0]] * 12 and per_layer[0] > 0
    outside = sum(op.flops for op in graph.ops if not any(op.name in layer for layer in layers))
    assert model_flops(graph) == pytest.approx(3 * (12 * per_layer[0] + outside), rel=1e-12)
    peak = r.cluster.device.peak("bf16")
    for plan in build_plans(r):
        pred = plan.predicted
        assert pred.model_flops == model_flops(graph)
        assert pred.mfu == pytest.approx(pred.model_flops / (pred.time_s * r.cluster.num_devices * peak), rel=1e-12)
        assert 0 < pred.mfu < 1
        assert pred.priced_from == "catalog"


def test_plans_stored_before_mfu_and_priced_from_still_validate():
    plan = build_plans(result())[0].model_dump(mode="json")
    for key in ("mfu", "model_flops", "priced_from"):
        del plan["predicted"][key]
    old = Plan.model_validate(plan)
    assert old.predicted.mfu is None and old.predicted.priced_from == "catalog"
    plan["predicted"]["estimated"] = False  # every cost measured: a profile priced it
    assert Plan.model_validate(plan).predicted.priced_from == "profile"
