"""`--hf-config` searches of Mixtral and Qwen2-MoE configs (small shapes, the same code path as
bench/hf/mixtral-8x7b.json and qwen1.5-moe-a2.7b.json) give frontiers with expert-parallel points."""

from __future__ import annotations

import pytest

from search.plans.api import SearchRequest, run_search
from tests.search.models.test_moe_capture import MIXTRAL, QWEN2_MOE


@pytest.mark.parametrize("config", [MIXTRAL, QWEN2_MOE], ids=["mixtral", "qwen2-moe"])
def test_hf_moe_configs_give_frontiers_with_expert_parallel_points(config):
    out = run_search(SearchRequest(hf_config=config, name="moe", devices=8, devices_per_node=8, global_batch=8,
                                   seq_len=32, zero_stages=[0, 3], baselines=False))
    plans = [e.plan for e in out.report.frontier]
    assert len(plans) >= 2
    expert = [p for p in plans if any(a["role"] == "expert" and a["size"] > 1 for a in p["mesh"]["axes"])]
    assert expert, [p["summary"] for p in plans]
    for p in expert:
        assert "split over ep, all-to-all dispatch and combine" in p["summary"]
    assert all("load balanced" in p["summary"] for p in plans)
    # every expert axis divides the experts: 4 for the Mixtral config, 6 for the Qwen2-MoE one
    experts = config.get("num_local_experts", config.get("num_experts"))
    assert all(experts % a["size"] == 0 for p in expert for a in p["mesh"]["axes"] if a["role"] == "expert")
