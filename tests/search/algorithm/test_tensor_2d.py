"""2-D tensor parallelism in the search: meshes with two tensor axes (search/prices/mesh.py
tensor_2d_meshes), each op splitting a different dimension on each, FT exact against the
exhaustive reference on them."""

from __future__ import annotations

from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search.algorithm.exhaustive import exhaustive_search
from search.algorithm.ft import SearchOptions, search
from search.models.capture import capture_model
from search.models.zoo import get_model
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from search.prices.mesh import Mesh, MeshAxis, mesh_candidates, op_configs, tensor_2d_meshes
from tests.search.algorithm.test_ft_exact import CLUSTER, JOB, check_points, same_frontier
from tests.search.graphs import random_dag, stack

gpt2_tiny = cache(lambda: capture_model(get_model("gpt2-tiny"), 8, 64))
MESH_TP_2x2 = [Mesh(pp=1, axes=(MeshAxis("tpa", 2, 2, "tensor"), MeshAxis("tpb", 2, 1, "tensor")))]


def test_two_tensor_axes_are_asked_for():
    cl = make_cluster("h100-80gb", 16, devices_per_node=8)
    plain = mesh_candidates(cl)
    assert all(sum(a.role == "tensor" for a in m.axes) == 1 for m in plain)
    two = mesh_candidates(cl, tensor_2d=True)
    extra = [m for m in two if m not in plain]
    assert extra == tensor_2d_meshes(cl)
    # tpa x tpb inside a node of 8, each at least 2; tpb innermost
    assert sorted((m.axes[1].size, m.axes[2].size) for m in extra) == [(2, 2), (2, 4), (4, 2)]
    assert all(m.axes[2].stride == 1 and m.axes[1].stride == m.axes[2].size for m in extra)


def test_no_op_splits_one_dimension_on_both_tensor_axes():
    """DTensor nests two shardings of one dimension in mesh order, and moving a tensor in or out
    of that nesting costs gathers the per-axis prices do not count: not in the space."""
    g = gpt2_tiny()
    mesh = Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), *MESH_TP_2x2[0].axes))
    for op in g.ops:
        for cfg in op_configs(op, mesh, g.batch_label):
            assert cfg[1] is None or cfg[1] != cfg[2], (op.name, cfg)
    # while one tensor axis alone may split any dimension the op offers
    q = g.op("blocks.0.attn.q:linear")
    assert len(op_configs(q, mesh, g.batch_label)) > len(op_configs(q, Mesh(pp=1, axes=mesh.axes[:2]), g.batch_label))


dag_choices = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_choices)
def test_ft_equals_exhaustive_on_two_tensor_axes(choices):
    g = random_dag(choices)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=tuple(MESH_TP_2x2)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=MESH_TP_2x2)
    same_frontier(ft.points, ex.points)
    check_points(ft)


def test_block_reuse_on_two_tensor_axes_equals_exhaustive():
    g = stack(2)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=tuple(MESH_TP_2x2), recompute=False, zero_stages=(0,)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=MESH_TP_2x2, recompute=False, zero_stages=(0,))
    same_frontier(ft.points, ex.points)
    check_points(ft)


def test_a_2d_search_of_a_real_model():
    """gpt2-tiny on 4 devices with --tensor-2d: the 2-D mesh is searched and its plans use both axes."""
    from search.plans.plan import build_plans

    g = gpt2_tiny()
    cl = make_cluster("cpu", 4, devices_per_node=4)
    res = search(g, cl, TrainingJob(global_batch=8, seq_len=64, precision="fp32"),
                 SearchOptions(tensor_2d=True, zero_stages=(0,), recompute=False))
    assert "pp1 x dp1 x tpa2 x tpb2" in res.stats["meshes"]
    two = [p for p in res.solutions if len(p.mesh.axes) == 3]
    assert two and len(two[0].root) > 0
    plans = build_plans(res, [p for p in res.points if len(res.solutions[p.mesh_index].mesh.axes) == 3] or None)
    assert plans
