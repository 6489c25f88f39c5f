"""FT stays exact with expert parallelism: on small MoE graphs its frontier equals the exhaustive
reference's over the same meshes (expert axes included), and every point re-costs to itself."""

from __future__ import annotations

import pytest

from search.algorithm.exhaustive import exhaustive_search
from search.algorithm.ft import SearchOptions, search
from search.plans.plan import build_plans, summarize
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import EXPERT, Mesh, MeshAxis, op_configs
from tests.search.algorithm.test_ft_exact import check_points, same_frontier
from tests.search.graphs import moe_layer

CLUSTER = make_cluster("h100-80gb", 4, devices_per_node=4)
JOB = TrainingJob(global_batch=8, precision="bf16")
DP4 = Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))
DP2_TP2 = Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("tp", 2, 1, "tensor")))


@pytest.mark.parametrize("mesh", [DP4, DP2_TP2], ids=["dp4", "dp2xtp2"])
def test_ft_equals_exhaustive_on_a_moe_layer(mesh):
    """dp4 is searched with its expert variants dp2 x ep2 and ep4 (no ZeRO-1 beside them); dp2 x tp2
    alone, its experts whole on the tensor axis (what the executor runs: no expert axis beside a
    tensor axis, no expert-tensor parallelism)."""
    g = moe_layer()
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(mesh,)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=[mesh])
    same_frontier(ft.points, ex.points)
    check_points(ft)
    expert = [s for s in ft.solutions if any(a.role == EXPERT and a.size > 1 for a in s.mesh.axes)]
    assert bool(expert) == (mesh is DP4) and all(s.zero != 1 for s in expert)


def test_block_reuse_is_exact_on_a_stack_of_moe_layers():
    g = moe_layer(layers=3)
    assert g.blocks and len(g.blocks[0].layers) == 3
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(DP4,)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=[DP4], tie_blocks=True)
    same_frontier(ft.points, ex.points)
    check_points(ft)


@pytest.mark.parametrize("ep,held", [(1, 4), (2, 2), (4, 1)])
def test_the_summary_says_how_many_experts_each_rank_holds(ep, held):
    g = moe_layer()
    axes = (MeshAxis("dp", 4 // ep, ep, "data"), MeshAxis("ep", ep, 1, "expert"))
    mesh = Mesh(pp=1, axes=axes)
    configs = {op.name: op_configs(op, mesh, g.batch_label)[0] for op in g.ops}  # one each on dp x ep
    summary = summarize(g, mesh, configs)
    over = " (split over ep, all-to-all dispatch and combine)" if ep > 1 else ""
    assert f"experts: {held} of 4 per rank{over}, top-2, load balanced (each expert gets" in summary


def test_plans_of_expert_parallel_points_carry_the_expert_role():
    g = moe_layer()
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(DP4,), zero_stages=(0,), recompute=False))
    plans = build_plans(ft, [p for p in ft.points])
    assert plans
    for plan in plans:
        roles = {a.name: a.role for a in plan.mesh.axes}
        assert "experts:" in plan.summary and "load balanced" in plan.summary
        if "ep" in roles:
            assert roles["ep"] == "expert"
            assert type(plan).model_validate_json(plan.model_dump_json()) == plan  # the role survives JSON
