"""Expert parallelism as the cost model prices it: an axis with role `expert` splits the routed
experts' GEMMs by expert and everything else by batch; the tokens cross it by all-to-all on the
way in (dispatch) and out (combine), forward and backward; the expert weights are held once per
axis and synchronise their gradients over the data axes only. Expected figures are worked out
from the cluster's links, not read back from the cost model."""

from __future__ import annotations

import math

import pytest

from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, TrainingJob, sync_unit_shares
from search.prices.mesh import (
    EXPERT,
    Mesh,
    MeshAxis,
    data_ways,
    expert_meshes,
    mesh_candidates,
    num_experts,
    op_configs,
    placeable_meshes,
)
from tests.search.graphs import moe_layer, stack

CLUSTER = make_cluster("h100-80gb", 4, devices_per_node=4)
JOB = TrainingJob(global_batch=8, precision="bf16")
EP4 = Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("ep", 4, 1, "expert")))
DP2_EP2 = Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("ep", 2, 1, "expert")))
DP4 = Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))


@pytest.fixture(scope="module")
def graph():
    return moe_layer()  # 8 x 4 tokens, 4 experts of 8 -> 8, top-2: buffers [4, 16, 8]


def by_kind(g, kind: str):
    return [op for op in g.ops if op.kind == kind]


def grouped(g):
    return [op for op in g.ops if op.kind == "linear" and any(len(p.shape) == 3 for p in op.params)]


def test_expert_axes_are_offered_only_with_experts(graph):
    assert num_experts(graph) == 4 and num_experts(stack(2)) == 0
    base = mesh_candidates(CLUSTER)
    assert expert_meshes(stack(2), base) == base
    shapes = {m.describe() for m in expert_meshes(graph, base)}
    # dp4 x tp1 factors as dp2 x ep2 and dp1 x ep4; dp2 x tp2 not at all (the executor's experts
    # exchange plain tensors, not tensor parallelism's DTensors); an ep of 3 never
    assert {"pp1 x dp2 x ep2 x tp1", "pp1 x dp1 x ep4 x tp1"} <= shapes
    assert len(shapes) == len(base) + 2
    for m in placeable_meshes(graph, base):  # the search's meshes: the expert variants included
        ep = [a for a in m.axes if a.role == EXPERT]
        assert not ep or 4 % ep[0].size == 0
        # the expert axis still splits the batch of every op that is not an expert's
        assert data_ways(m) == math.prod(a.size for a in m.axes if a.role != "tensor")
    assert len(placeable_meshes(graph, base)) == len(base) + 2


def test_an_expert_axis_splits_experts_in_the_grouped_gemms_and_the_batch_elsewhere(graph):
    for op in graph.ops:
        cfgs = op_configs(op, DP2_EP2, graph.batch_label)
        assert len(cfgs) == 1, op.name
        want = "expert" if "expert" in op.splittable else (graph.batch_label if graph.batch_label in op.splittable else None)
        assert cfgs[0][1] == want, op.name
    assert all(op_configs(op, DP2_EP2)[0] == ("batch", "expert") for op in grouped(graph))
    assert op_configs(by_kind(graph, "dispatch")[0], DP2_EP2)[0] == ("batch", "batch")


def test_dispatch_and_combine_pay_an_all_to_all_each_way(graph):
    cm = CostModel(graph, CLUSTER, JOB)
    dispatch, combine = by_kind(graph, "dispatch")[0], by_kind(graph, "combine")[0]
    first, second = grouped(graph)
    bw, lat = CLUSTER.link(4, 1)
    buffers = 4 * 16 * 8 * 2  # [experts, capacity, hidden] in bf16
    # all-to-all over 4 ranks: log2(4) latency steps; each rank sends 3/4 of its quarter
    a2a = 2 * lat + buffers * (3 / 4) / 4 / bw
    for prod, cons in ((dispatch, first), (second, combine)):
        pc, cc = op_configs(prod, EP4), op_configs(cons, EP4)
        e = cm.edge_costs(prod, cons, EP4, pc, cc)
        assert e.time[0, 0] == pytest.approx(2 * a2a, rel=1e-12)  # forward tokens, backward gradients
        assert e.comm[0, 0, 1] == pytest.approx(2 * buffers * (3 / 4) / 4, rel=1e-12)
    # on a plain data axis the same edges cost nothing: every rank runs all experts on its tokens
    for prod, cons in ((dispatch, first), (second, combine)):
        e = cm.edge_costs(prod, cons, DP4, op_configs(prod, DP4), op_configs(cons, DP4))
        assert e.time[0, 0] == 0.0


def test_expert_weights_are_held_once_per_expert_axis_and_synced_over_data_only(graph):
    cm = CostModel(graph, CLUSTER, JOB)
    router = next(op for op in graph.ops if op.module.endswith("router"))
    for op in grouped(graph):
        numel = op.params[0].numel
        on_ep4 = cm.op_costs(op, EP4, zero=0)
        # a quarter of the experts: fp32 and FSDP2's bf16 copy (MixedPrecisionPolicy)
        assert on_ep4.parts[0, 0] == pytest.approx(numel / 4 * (4 + 2))
        assert on_ep4.comm[0].sum() == 0.0  # no other rank holds these experts: nothing to sync
        on_dp = cm.op_costs(op, DP2_EP2, zero=0)
        assert on_dp.parts[0, 0] == pytest.approx(numel / 2 * (4 + 2))
        assert on_dp.comm[0, 1] == 0.0
        assert on_dp.comm[0, 0] == pytest.approx(2 * numel / 2 * 2 * (1 / 2))  # all-reduce over dp2
    # a weight the expert axis does not split is data-parallel there: all-reduced over it
    r = cm.op_costs(router, EP4, zero=0)
    assert r.comm[0, 1] == pytest.approx(2 * router.params[0].numel * 2 * 3 / 4)


def test_expert_gemms_compute_a_share_of_the_flops(graph):
    cm = CostModel(graph, CLUSTER, JOB)
    op = grouped(graph)[0]
    alone = cm.op_costs(op, Mesh(pp=1, axes=(MeshAxis("dp", 1, 1, "data"),)), zero=0)
    split = cm.op_costs(op, EP4, zero=0)
    assert split.time[0] < alone.time[0]


def test_the_dispatch_first_exchanges_its_token_counts(graph):
    """One all-to-all of the per-expert counts (int64) per dispatch and expert axis, forward only
    (the token all-to-all's split sizes), paid again when the layer's forward is recomputed."""
    cm = CostModel(graph, CLUSTER, JOB)
    dispatch = by_kind(graph, "dispatch")[0]
    bw, lat = CLUSTER.link(4, 1)
    counts = 2 * lat + (8 * 4 * 4) * (3 / 4) / 4 / bw  # 4 experts' counts from each of 4 ranks
    on_ep, on_dp = cm.op_costs(dispatch, EP4, zero=0), cm.op_costs(dispatch, DP4, zero=0)
    assert on_ep.time[0] - on_dp.time[0] == pytest.approx(counts, rel=1e-9)
    assert on_ep.time_rc[0] - on_dp.time_rc[0] == pytest.approx(2 * counts, rel=1e-9)
    assert on_ep.comm[0, 1] == pytest.approx(8 * 4 * 3 / 4)


def test_under_expert_parallelism_the_experts_are_an_fsdp_unit_of_their_own():
    """The executor wraps each layer's experts apart (they sync over dp only): their gradient
    collective is a call of its own, which their share of the latency says."""
    g = moe_layer(layers=2)
    plain, apart = sync_unit_shares(g), sync_unit_shares(g, experts_apart=True)
    experts = [p for op in grouped(g) for p in op.params]
    others = [p for op in g.ops for p in op.params if p.owner and "expert" not in p.dims and op.name in g.blocks[0].layers[0]]
    assert sum(apart[p.name] for p in experts) == pytest.approx(2.0)  # one whole unit per layer
    assert sum(plain[p.name] for p in experts) < 2.0
    assert sum(apart[p.name] for p in others) == pytest.approx(1.0)  # the layer's unit without them


def test_the_experts_stay_whole_on_a_tensor_axis(graph):
    """The executor runs the routed experts on plain tensors (worker/experts.py): no op of theirs
    splits on a tensor axis (no expert-tensor parallelism), the dispatch's batch aside."""
    from search.models.moe import EXPERT_LABEL
    from search.prices.mesh import TENSOR, MeshAxis, axis_choices

    tp = MeshAxis("tp", 2, 1, TENSOR)
    experts = [op for op in graph.ops if EXPERT_LABEL in op.labels() and op.kind != "dispatch"]
    assert experts
    assert all(axis_choices(op, tp, graph.batch_label) == [None] for op in experts)
