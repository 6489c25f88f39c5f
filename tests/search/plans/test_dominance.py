"""The frontier beats or matches every baseline planner, on the issue's reference cases."""

from __future__ import annotations

import pytest

from search.algorithm.ft import SearchOptions, search
from search.models.capture import capture_model
from search.models.zoo import get_model
from search.plans.baselines import baselines
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob

CASES = [("gpt2-xl", 16, 32), ("llama-7b", 64, 256), ("bert-large", 8, 64)]


@pytest.mark.slow
@pytest.mark.parametrize("model,devices,batch", CASES)
def test_no_baseline_below_left_of_the_frontier(model, devices, batch):
    graph = capture_model(get_model(model), batch)
    cluster = make_cluster("h100-80gb", devices)
    job = TrainingJob(global_batch=batch)
    result = search(graph, cluster, job)
    bases = baselines(graph, cluster, job, pipelines=False)  # pipeline planners: test_baselines.py
    assert len(bases) >= 2  # data-parallel and fsdp apply everywhere
    for b in bases:
        # every planner's plan is one the executor runs as priced (search/prices/boundaries.py): a broken
        # rule would price it INFEASIBLE and make this test pass for the wrong reason
        assert b.time_s < 1e6 and b.memory_bytes < 1e15, b.name
        # at the baseline's memory the frontier is at least as fast ...
        fitting = [p for p in result.points if p.memory_bytes <= b.memory_bytes * (1 + 1e-9)]
        assert fitting, f"{b.name}: no frontier point within its {b.memory_bytes:.3g} bytes"
        assert min(p.time_s for p in fitting) <= b.time_s * (1 + 1e-9), b.name
        # ... and no frontier point is beaten in both objectives by it
        assert not any(b.time_s < p.time_s * (1 - 1e-9) and b.memory_bytes < p.memory_bytes * (1 - 1e-9)
                       for p in result.points), b.name


@pytest.mark.slow
@pytest.mark.parametrize(("model", "devices", "batch"), [("gpt2-xl", 16, 32), ("bert-large", 8, 64)])
def test_no_pipeline_planner_below_left_of_the_pipelined_frontier(model, devices, batch):
    """With pipelines (2BW admitted) in the search, Megatron 3-D's grid and PipeDream-2BW's own
    planner sit on or behind the frontier too (llama-7b@64 is left to bench/frontier_quality.py:
    its pipelined search takes minutes)."""
    graph = capture_model(get_model(model), batch)
    cluster = make_cluster("h100-80gb", devices)
    job = TrainingJob(global_batch=batch)
    result = search(graph, cluster, job, SearchOptions(pipeline=True, allow_async=True))
    piped = [b for b in baselines(graph, cluster, job, pipelines=True, allow_async=True) if b.point.stages is not None]
    assert {b.name for b in piped} == {"megatron-3d", "pipedream-2bw"}
    for b in piped:
        assert b.time_s < 1e6 and b.memory_bytes < 1e15, b.name
        fitting = [p for p in result.points if p.memory_bytes <= b.memory_bytes * (1 + 1e-9)]
        assert fitting and min(p.time_s for p in fitting) <= b.time_s * (1 + 1e-9), b.name
        assert not any(b.time_s < p.time_s * (1 - 1e-9) and b.memory_bytes < p.memory_bytes * (1 - 1e-9)
                       for p in result.points), b.name
