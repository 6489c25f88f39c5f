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
