"""Interleaved 1F1B in the search (search/algorithm/interleave.py): the shapes it offers, the stage
search exact against the exhaustive reference, and plans whose chunks re-cost to their points."""

from __future__ import annotations

import numpy as np
import pytest

from search.algorithm.evaluate import evaluate_pipeline, stage_ops
from search.algorithm.exhaustive import exhaustive_pipeline
from search.algorithm.interleave import chunk_layers, device_layers, rank_p2p, sends, to_model_order
from search.algorithm.pipeline import partitions, pipeline_shapes, search_pipelines, stage_band, virtual_stages
from search.plans.plan import build_plans
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from tests.search.algorithm.test_pipeline import same_frontier
from tests.search.graphs import stack

JOB = TrainingJob(global_batch=24, seq_len=None)


def test_chunks_of_a_split():
    """Device s holds chunks s, s + p, ...; each device's layers as v equal chunks."""
    assert chunk_layers((2, 2), 2) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert device_layers((2, 2), 2) == [[0, 2], [1, 3]]
    assert device_layers((4, 2), 2) == [[0, 1, 3, 4], [2, 5]]
    assert device_layers((3, 2), 1) == [[0, 1, 2], [3, 4]]  # v = 1: consecutive layers
    with pytest.raises(ValueError):
        chunk_layers((3, 3), 2)
    # each boundary crossed once forward and once back per micro-batch: 2 m (p v - 1) sends in all
    assert [sends(s, 2, 2) for s in (0, 1)] == [2, 1]
    for p, v, m in ((2, 1, 4), (2, 2, 4), (4, 3, 8)):
        assert sum(rank_p2p(p, v, m)) == 2 * m * (p * v - 1)


def test_shapes_offer_interleaving_where_the_layers_cut_into_chunks():
    """v > 1 only under 1F1B, with m a multiple of p and a split into stages of v equal chunks."""
    cl = make_cluster("h100-80gb", 4)
    shapes = pipeline_shapes(cl, JOB, 6, (0, 1), allow_async=True, interleave=True)
    assert not any(s.virtual_stages > 1 for s in pipeline_shapes(cl, JOB, 6, (0, 1)))  # asked for only
    inter = [s for s in shapes if s.virtual_stages > 1]
    assert {s.virtual_stages for s in inter} == {2, 3}  # 6 layers on 2 stages: chunks of 1 (v 3) or 1-2 (v 2)
    assert all(s.schedule == "1f1b" and s.micro_batches % s.stages == 0 for s in inter)
    assert virtual_stages(4, 2, 4) == [2] and virtual_stages(4, 2, 3) == [] and virtual_stages(5, 2, 4) == []
    assert list(stage_band(6, 2, 2)) == [2, 4] and sorted(partitions(6, 2, 2)) == [(2, 4), (4, 2)]


def _exact(g, cl, shape) -> None:
    sols = search_pipelines(g, cl, JOB, (0, 1), shapes=[shape])
    t, m = exhaustive_pipeline(g, cl, JOB, shape)
    assert sols, shape.describe()
    assert same_frontier(sols[0].root.t, sols[0].root.m, t, m), shape.describe()


@pytest.mark.parametrize(("layers", "devices"), [(4, 4), (6, 4), (8, 8)])
def test_interleaved_stage_search_equals_exhaustive(layers, devices):
    """Every v the shapes offer (2 and 4 stages; v 2, 3, 4; uneven splits of 6 layers; data and
    tensor sub-meshes): the stage search gives exactly the exhaustive frontier,
    which prices every device by the layers it holds (interleaved chunks)."""
    g = stack(layers, batch=JOB.global_batch)
    cl = make_cluster("h100-80gb", devices)
    picked = {}
    for sh in pipeline_shapes(cl, JOB, layers, (0, 1), interleave=True):
        # tensor-parallel sub-meshes on the 4-layer stack only: more layers enumerate past the limit
        if sh.virtual_stages > 1 and (layers == 4 or sh.mesh.axes[-1].size == 1):
            picked.setdefault((sh.stages, sh.virtual_stages, sh.zero, sh.mesh.axes), sh)
    assert {(s.stages, s.virtual_stages) for s in picked.values()} == {
        (4, 4): {(2, 2)}, (6, 4): {(2, 2), (2, 3)}, (8, 8): {(2, 2), (2, 4), (4, 2)}}[(layers, devices)]
    for sh in picked.values():
        _exact(g, cl, sh)


def test_interleaved_points_recost_with_each_devices_own_layers():
    """The search cuts the layers into runs per device; its plans put each device's choices on
    the layers it holds (chunks s, s + p, ...), and re-costing them there gives the point."""
    g = stack(8, batch=32)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=32, seq_len=None)
    shapes = [s for s in pipeline_shapes(cl, job, 8, (0,), interleave=True) if s.virtual_stages == 2 and s.stages == 4][:2]
    sols = search_pipelines(g, cl, job, (0,), shapes=shapes)
    assert sols
    for sol in sols:
        for i, split in enumerate(sol.partitions):
            r = evaluate_pipeline(sol, {k: v[i:i + 1] for k, v in sol.assigns.items()}, split)
            assert r["time"][0] == pytest.approx(sol.root.t[i], rel=1e-9)
            assert r["memory"][0] == pytest.approx(sol.root.m[i], rel=1e-9)


def test_slot_choices_move_to_the_layers_each_device_holds():
    """Device 0's second slot layer is model layer 2 under (2, 2) x v 2: its choices move there."""
    g = stack(4)
    from search.algorithm.chain import find_chain, recompute_var

    chain = find_chain(g)
    assert chain is not None
    names = [n for layer in chain.layers for n in layer]
    assigns = {n: np.array([i]) for i, n in enumerate(names)}
    assigns.update({recompute_var(i): np.array([i % 2]) for i in range(4)})
    moved = to_model_order(assigns, chain, [(2, 2)], 2)
    assert moved[chain.layers[2][1]][0] == assigns[chain.layers[1][1]][0]  # slot 1 (device 0) -> layer 2
    assert moved[chain.layers[1][1]][0] == assigns[chain.layers[2][1]][0]  # slot 2 (device 1) -> layer 1
    assert moved[recompute_var(2)][0] == 1 and moved[recompute_var(1)][0] == 0
    assert moved[chain.layers[0][0]][0] == assigns[chain.layers[0][0]][0]  # layer 0 stays with the head
    held = stage_ops(g, chain, (2, 2), 2)
    assert set(chain.layers[2]) <= held[0] and set(chain.layers[1]) <= held[1]


def test_interleaving_reaches_the_frontier_when_the_bubble_dominates():
    """Few micro-batches per stage: interleaving divides the bubble by v for v x the transfers,
    and on fast links that wins; its Plans list the chunks, and re-cost to the point."""
    from search.algorithm.ft import SearchOptions, search

    g = stack(8, batch=8)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=8, seq_len=None)
    res = search(g, cl, job, SearchOptions(pipeline=True, interleave=True))
    inter = [p for p in res.points if p.stages is not None
             and getattr(res.solutions[p.mesh_index].pipeline, "virtual_stages", 1) > 1]
    assert inter, "no interleaved plan on the frontier"
    for point, plan in zip(inter, build_plans(res, inter), strict=True):
        spec = plan.pipeline
        v, p = spec.virtual_stages, spec.stages
        assert len(spec.stage_layers) == p * v and spec.stage_layers[0][0] == 0 and spec.stage_layers[-1][1] == 8
        assert all(a[1] == b[0] for a, b in zip(spec.stage_layers, spec.stage_layers[1:], strict=False))
        assert f"interleaved v{v}" in plan.summary
        assert plan.predicted.time_s == pytest.approx(point.time_s, rel=1e-9)
