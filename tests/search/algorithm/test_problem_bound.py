"""FT leaves unbuilt the (mesh, ZeRO stage) problems whose op tables prove known plans beat them
(ft._bounded_problems): the bound holds every plan of a problem, and leaving them unbuilt changes
no frontier point, plan by plan."""

from __future__ import annotations

import numpy as np
import pytest

from search.algorithm import ft
from search.algorithm.chain import find_chain
from search.algorithm.evaluate import mesh_costs
from search.algorithm.factor_graph import prepare_mesh
from search.algorithm.ft import SearchOptions, search
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.mesh import mesh_candidates
from tests.search.graphs import stack

CLUSTER = make_cluster("h100-80gb", 8, devices_per_node=8)
JOB = TrainingJob(global_batch=8, precision="bf16")


def _plans(result) -> list[tuple]:
    return [(p.time_s, p.memory_bytes, result.solutions[p.mesh_index].describe(), p.stages,
             sorted(p.assignment.items())) for p in result.points]


@pytest.mark.parametrize("layers", [5, 12])
def test_bound_holds_every_plan_of_a_problem(layers: int) -> None:
    """Every point of a problem's unpruned frontier lies in its region, at any slopes."""
    g = stack(layers)
    cm = CostModel(g, CLUSTER, JOB)
    chain = find_chain(g, solo=True)
    assert chain is not None
    lams = np.array([0.0, 1e-12, 1e-10, 1e-8])
    for mesh in mesh_candidates(CLUSTER):
        for zero in (0, 3):
            costs = mesh_costs(g, cm, mesh, zero, chain)
            region = ft._ProblemBound(g, cm, chain, mesh, zero, costs).region(lams)
            root = ft.finish_mesh(prepare_mesh(g, cm, mesh, zero=zero, op_costs=costs), prune=False).root
            slack = 1.0 - 1e-12  # the same sums in another order
            assert np.all(root.t >= region.t * slack) and np.all(root.m >= region.m * slack)
            assert np.all(root.t[:, None] + lams[None, :] * root.m[:, None] >= region.b[None, :] * slack)


@pytest.mark.parametrize("pipeline", [False, True])
def test_unbuilt_problems_change_no_point(pipeline: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same frontier, plan by plan, with every problem built (the bound never covered)."""
    g = stack(12)
    options = SearchOptions(pipeline=pipeline, accumulate=pipeline)
    unbuilt: list[str] = []
    real = ft._Beaten.solution
    monkeypatch.setattr(ft._Beaten, "solution", lambda self: unbuilt.append(self.mesh.describe()) or real(self))
    fast = search(g, CLUSTER, JOB, options)
    assert unbuilt
    monkeypatch.setattr(ft._ProblemBound, "covered", lambda self, envelope: False)
    slow = search(g, CLUSTER, JOB, options)
    assert _plans(fast) == _plans(slow)
    assert fast.stats["meshes"] == slow.stats["meshes"]


def test_layer_least_bounds_the_end_stages_least(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cheap end-stage minima are no higher than the full min-sum's, for every shape,
    boundary configuration and column: the op tables' alone (`_op_least`) no higher than the
    layer's by min-sum with the other ops at their cheapest (`_layer_least`), and that no higher
    than the full min-sum's (`_end_least`)."""
    from search.algorithm import pipeline

    seen: list[pipeline.EndLeast] = []

    def spy(tables, weights, least, envelope, known=None) -> bool:
        seen.append(least(pipeline.envelope_slopes(envelope)))
        return False  # every shape asks all three

    monkeypatch.setattr(pipeline, "_ends_beaten", spy)
    search(stack(12), CLUSTER, JOB, SearchOptions(pipeline=True, accumulate=True))
    assert len(seen) >= 3 and len(seen) % 3 == 0
    for ops, layer, full in zip(seen[::3], seen[1::3], seen[2::3], strict=True):
        for lower, higher in ((ops, layer), (layer, full)):
            for x, y in zip(lower, higher, strict=True):
                assert x.shape == y.shape
                assert np.all(x <= y + 1e-12 * np.abs(y))


def test_pipelines_without_the_layer_test_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """The frontier with pipelines, plan by plan, when the cheap end-stage tests rule out nothing."""
    from search.algorithm import pipeline

    g = stack(12)
    options = SearchOptions(pipeline=True, accumulate=True)
    fast = search(g, CLUSTER, JOB, options)

    def zeros(tables, lams) -> pipeline.EndLeast:
        zero = np.zeros((len(tables.op_costs[tables.chain.boundary].configs), 2 + 2 * len(lams)))
        return pipeline.EndLeast(zero, zero, zero, zero)  # no plan is beaten at cost 0

    monkeypatch.setattr(pipeline, "_op_least", lambda graph, tables, first, last, lams: zeros(tables, lams))
    monkeypatch.setattr(pipeline, "_layer_least",
                        lambda graph, tables, first, last, lams, units=None: zeros(tables, lams))
    slow = search(g, CLUSTER, JOB, options)
    assert _plans(fast) == _plans(slow)
