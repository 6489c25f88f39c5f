"""FT equals the exhaustive frontier exactly, on random small graphs and on block stacks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search.algorithm.chain import layer_index
from search.algorithm.evaluate import evaluate, tables
from search.algorithm.exhaustive import exhaustive_search
from search.algorithm.frontier import RTOL
from search.algorithm.ft import SearchOptions, search
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.mesh import Mesh, MeshAxis
from tests.search.graphs import random_dag, stack

CLUSTER = make_cluster("h100-80gb", 4, devices_per_node=4)
JOB = TrainingJob(global_batch=8, precision="bf16")
MESH_2x2 = [Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("tp", 2, 1, "tensor")))]
MESH_4 = [Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))]


def same_frontier(a: list, b: list) -> None:
    assert len(a) == len(b), (len(a), len(b))
    for p, q in zip(a, b, strict=True):
        assert p.time_s == pytest.approx(q.time_s, rel=1e-7)
        assert p.memory_bytes == pytest.approx(q.memory_bytes, rel=1e-7)


def check_points(result) -> None:
    """Non-dominated, and each point's assignment re-costs to what FT reported."""
    pts = result.points
    for i, p in enumerate(pts):
        for j, q in enumerate(pts):
            if i != j:
                assert not (q.time_s <= p.time_s and q.memory_bytes <= p.memory_bytes * (1 - RTOL)), "dominated point"
        sol = result.solutions[p.mesh_index]
        ops, edges = tables(result.graph, CostModel(result.graph, result.cluster, result.job), sol.mesh, sol.zero)
        res = evaluate(ops, edges, sol.buffers, p.assignment, layer_index(result.graph))
        assert res["time"][0] == pytest.approx(p.time_s, rel=1e-9)
        assert res["memory"][0] == pytest.approx(p.memory_bytes, rel=1e-9)


dag_choices = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag_choices)
def test_ft_equals_exhaustive_on_random_dags_2x2(choices):
    g = random_dag(choices)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=tuple(MESH_2x2)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=MESH_2x2)
    same_frontier(ft.points, ex.points)
    check_points(ft)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=7))
def test_ft_equals_exhaustive_on_larger_dags_1d(choices):
    g = random_dag(choices)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=tuple(MESH_4)))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=MESH_4)
    same_frontier(ft.points, ex.points)


@pytest.mark.parametrize("layers,recompute", [(3, True), (4, False)])
def test_block_reuse_equals_exhaustive_over_the_same_space(layers, recompute):
    """Covers the ZeRO stages and, per layer, activation recomputation."""
    g = stack(layers)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=tuple(MESH_4), recompute=recompute))
    assert ft.stats["block_reuse"] and ft.stats["layers_solved_once"] == layers - 1
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=MESH_4, tie_blocks=True, recompute=recompute)
    same_frontier(ft.points, ex.points)
    check_points(ft)


def test_without_reuse_ft_equals_untied_exhaustive():
    g = stack(3)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=tuple(MESH_4), reuse_blocks=False, zero_stages=(0, 3), recompute=False))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=MESH_4, tie_blocks=False, zero_stages=(0, 3), recompute=False)
    same_frontier(ft.points, ex.points)
    # the tie only removes plans, so the untied frontier is at least as good everywhere
    tied = exhaustive_search(g, CLUSTER, JOB, meshes=MESH_4, tie_blocks=True, zero_stages=(0, 3), recompute=False)
    for p in tied.points:
        assert any(q.time_s <= p.time_s * (1 + 1e-9) and q.memory_bytes <= p.memory_bytes * (1 + 1e-9)
                   for q in ex.points)


def test_all_meshes_on_a_stack():
    g = stack(3)
    ft = search(g, CLUSTER, JOB)
    assert len(ft.stats["meshes"]) == 3  # tp in 1, 2, 4
    check_points(ft)
    times = np.array([p.time_s for p in ft.points])
    assert np.all(np.diff(times) > 0)


@pytest.mark.parametrize("layers", [7, 12])
def test_stack_pruning_keeps_the_frontier_exact(layers):
    """The bounds and boundary dominance only drop points that cannot win: with them on and off
    the frontier is the same, on every mesh of a long stack."""
    g = stack(layers)
    on = search(g, CLUSTER, JOB)
    off = search(g, CLUSTER, JOB, SearchOptions(prune=False))
    same_frontier(on.points, off.points)
    check_points(on)


@pytest.mark.slow  # searches gpt2 with and without stack pruning: ~2 s
def test_stack_pruning_on_a_real_model():
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    g = capture_model(get_model("gpt2"), 8, 64)
    on = search(g, CLUSTER, JOB)
    off = search(g, CLUSTER, JOB, SearchOptions(prune=False))
    assert len(on.points) > 10
    same_frontier(on.points, off.points)
