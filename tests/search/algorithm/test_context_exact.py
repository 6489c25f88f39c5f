"""FT stays exact with context parallelism: on small attention language models its frontier
equals the exhaustive reference's over the same meshes (context axes included), every point
re-costs to itself, and the ring's exchange is priced as the cost model says."""

from __future__ import annotations

import pytest

from search.algorithm.exhaustive import exhaustive_search
from search.algorithm.ft import SearchOptions, search
from search.plans.plan import build_plans
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, TrainingJob
from search.prices.mesh import (
    CONTEXT,
    SEQ_LABEL,
    Mesh,
    MeshAxis,
    context_blocker,
    context_meshes,
    op_configs,
    placeable_meshes,
)
from tests.search.algorithm.test_ft_exact import check_points, same_frontier
from tests.search.graphs import attention_lm

CLUSTER = make_cluster("h100-80gb", 4, devices_per_node=4)
JOB = TrainingJob(global_batch=2, precision="bf16")
DP4 = Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))
CP2_TP2 = Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("cp", 2, 2, "context"),
                           MeshAxis("tp", 2, 1, "tensor")))
DP2_CP2 = Mesh(pp=1, axes=(MeshAxis("dp", 2, 2, "data"), MeshAxis("cp", 2, 1, "context"),
                           MeshAxis("tp", 1, 1, "tensor")))
CP4 = Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"), MeshAxis("cp", 4, 1, "context"), MeshAxis("tp", 1, 1, "tensor")))


@pytest.mark.parametrize("mesh", [CP4, DP2_CP2, CP2_TP2], ids=["cp4", "dp2xcp2", "cp2xtp2"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_ft_equals_exhaustive_on_context_meshes(mesh, causal):
    g = attention_lm(causal=causal)
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(mesh,), pipeline=False, accumulate=False))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=[mesh])
    assert ft.points
    same_frontier(ft.points, ex.points)
    check_points(ft)


def test_block_reuse_is_exact_on_a_stack_of_attention_layers():
    g = attention_lm(layers=3)
    assert g.blocks and len(g.blocks[0].layers) == 3
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(DP2_CP2,), pipeline=False, accumulate=False))
    ex = exhaustive_search(g, CLUSTER, JOB, meshes=[DP2_CP2], tie_blocks=True)
    same_frontier(ft.points, ex.points)
    check_points(ft)


def test_every_op_splits_the_sequence_on_a_context_axis():
    """The role of the axis: each op carrying the sequence splits it (attention too, as ring
    attention), the loss and its cast split the flattened tokens, nothing replicates."""
    g = attention_lm()
    for op in g.ops:
        on_cp = {c[1] for c in op_configs(op, CP2_TP2, g.batch_label)}
        want = SEQ_LABEL if any(SEQ_LABEL in t.dims for t in (*op.inputs, op.output)) else g.batch_label
        assert on_cp == {want}, (op.name, on_cp)


def test_context_axes_are_offered_for_long_sequences_only():
    long, short = attention_lm(batch=4, seq=16), attention_lm(batch=4, seq=4)
    offered = context_meshes(long, [DP4], min_seq=16)
    assert [m.describe() for m in offered] == ["pp1 x dp4 x tp1", "pp1 x dp2 x cp2 x tp1", "pp1 x dp1 x cp4 x tp1"]
    assert all(a.stride == 1 for m in offered[1:] for a in m.axes if a.role == CONTEXT)  # next to tp
    assert context_meshes(short, [DP4], min_seq=16) == [DP4]
    assert [m.describe() for m in placeable_meshes(long, [DP4])] == ["pp1 x dp4 x tp1"]  # below CONTEXT_MIN_SEQ


def test_a_graph_pooling_over_the_sequence_gets_no_context_axis():
    """A tensor with the batch but not the tokens (a pooled classifier input) depends on the whole
    sequence, which no context rank holds: such meshes are dropped with the reason."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from search.models.capture import capture_module

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.qkv = nn.Linear(8, 24)
            self.cls = nn.Linear(8, 3)

        def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            b, t = ids.shape
            q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, 1, 8).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v)
            return F.cross_entropy(self.cls(a.mean(dim=2).squeeze(1)), labels)

    with torch.device("meta"):
        g = capture_module(Pooled(), (torch.zeros(4, 8, dtype=torch.long, device="meta"),
                                      torch.zeros(4, dtype=torch.long, device="meta")),
                           "pooled", [["batch", "seq"], ["batch"]])
    assert context_blocker(g) is not None
    assert placeable_meshes(g, [DP4, CP4]) == [DP4]


def test_ring_attention_is_priced_as_documented():
    """The attention op on cp n: (n - 1) sends of its local K and V forward, (n - 1) of K, V and
    their gradients backward and a last hop of the gradients, each but the last hidden behind 1/n
    of its compute as far as the device overlaps; on a device that overlaps nothing the whole
    transfer is exposed."""
    g = attention_lm(seq=4096, dim=512, heads=4, batch=1)
    job = TrainingJob(global_batch=1, precision="bf16")
    att = next(op for op in g.ops if op.kind == "attention")
    for dev, overlap in (("h100-80gb", None), ("cpu", 0.0)):
        cluster = make_cluster(dev, 4, devices_per_node=4)
        cm = CostModel(g, cluster, job)
        costs = cm.op_costs(att, CP4)
        (ci,) = [i for i, c in enumerate(costs.configs) if c[1] == SEQ_LABEL and c[2] is None]
        kv = 2 * att.inputs[1].numel / 4 * 2  # K and V, bf16, a quarter each
        assert costs.comm[ci, 1] == pytest.approx((3 + 3 * 2 + 1) * kv)
        alpha, beta = cm.ring_coefficients(CP4, 1)
        no_ring = CostModel(g, cluster, job).op_costs(att, Mesh(pp=1, axes=(MeshAxis("dp", 1, 4, "data"),
                                                                            MeshAxis("tp", 4, 1, "tensor"))))
        heads = [i for i, c in enumerate(no_ring.configs) if c[1] is not None][0]  # 1/4 of the work, no ring
        compute = no_ring.time[heads]
        hide = cluster.device.comm_overlap if overlap is None else overlap
        fb = compute  # forward + backward of a quarter of the attention
        exposed = costs.time[ci] - fb
        assert exposed >= 0
        everything = 4 * (alpha + beta * kv) + 3 * (alpha + beta * 2 * kv)
        if hide == 0.0:
            assert exposed == pytest.approx(everything, rel=1e-6)
        else:
            assert alpha + beta * kv <= exposed < everything


def test_plans_of_context_parallel_points_carry_the_context_role():
    g = attention_lm()
    ft = search(g, CLUSTER, JOB, SearchOptions(meshes=(CP2_TP2,), zero_stages=(0,), recompute=False,
                                               pipeline=False, accumulate=False))
    plans = build_plans(ft, list(ft.points))
    assert plans
    for plan in plans:
        roles = {a.name: a.role for a in plan.mesh.axes}
        assert roles["cp"] == "context"
        assert "cp: seq 100%" in plan.summary
        assert type(plan).model_validate_json(plan.model_dump_json()) == plan  # the role survives JSON


def test_accumulation_is_offered_on_context_meshes():
    """With one sequence per device, dp x cp holds as many tokens per device as dp: only running the
    per-rank batch as micro-batches makes the context axis pay, so the stage search gets those shapes."""
    from search.algorithm.context import context_accumulation_shapes

    g = attention_lm(batch=4, seq=8192, layers=2)
    shapes = context_accumulation_shapes(g, CLUSTER, TrainingJob(global_batch=4), (0, 3))
    got = {(s.mesh.describe(), s.zero, s.micro_batches) for s in shapes}
    # m divides the per-rank batch (4 / dp); dp1 x tp4 has no data axis to take a context axis from,
    # and dp2 x tp2 none either: the executor runs ring attention beside data parallelism only
    want = {("pp1 x dp2 x cp2 x tp1", 2), ("pp1 x dp1 x cp4 x tp1", 2), ("pp1 x dp1 x cp4 x tp1", 4)}
    assert got == {(mesh, z, m) for mesh, m in want for z in (0, 3)}
    # nor ZeRO-1, which would average the gradients over the data axis alone
    assert all(s.zero != 1 for s in context_accumulation_shapes(g, CLUSTER, TrainingJob(global_batch=4), (0, 1, 2, 3)))
    assert context_accumulation_shapes(attention_lm(batch=4, seq=16, layers=2), CLUSTER, TrainingJob(global_batch=4),
                                       (0,)) == []  # short sequences get no context axis


@pytest.mark.slow  # capture and search of Llama 7B at 32k tokens on 64 devices: ~25 s
def test_a_32k_token_llama_search_returns_context_parallel_plans():
    """Issue 17's check: at 32k tokens activations dominate, and the fastest plan that fits 80 GiB
    splits the sequence (dp x cp with accumulation), faster than the best plan without a context axis."""
    from search import SearchRequest, run_search

    report = run_search(SearchRequest(model="llama-7b", seq_len=32768, devices=64, device="h100-80gb",
                                      global_batch=64, baselines=False)).report
    with_cp = [p for p in report.frontier if any(a["role"] == "context" for a in p.plan["mesh"]["axes"])]
    assert len(with_cp) >= len(report.frontier) // 2
    best = report.frontier[report.picked]
    assert any(a["role"] == "context" and a["size"] > 1 for a in best.plan["mesh"]["axes"]), best.plan["summary"]


def test_a_profile_counts_the_measured_local_block_once_per_ring_step():
    """The profile times the attention at its local signature (the rank's queries against its own
    keys); ring attention runs that block once per rank of the ring."""
    from search.prices.profile import DeviceProfile, OpEntry, ProfileLookup, Stat

    g = attention_lm(seq=4096, dim=512, heads=4, batch=1)
    job = TrainingJob(global_batch=1, precision="bf16")
    cluster = make_cluster("cpu", 4, devices_per_node=4)
    att = next(op for op in g.ops if op.kind == "attention")
    cfgs = op_configs(att, CP4, g.batch_label)
    (cfg,) = [c for c in cfgs if c[1] == SEQ_LABEL]
    sig = ProfileLookup(DeviceProfile(device="cpu"), job.precision).signature(att, CP4, cfg)
    fwd, bwd = 1e-3, 2.5e-3
    prof = DeviceProfile(device="cpu", ops={sig: OpEntry(kind="attention", fwd=Stat(median=fwd, lo=fwd, hi=fwd),
                                                         bwd=Stat(median=bwd, lo=bwd, hi=bwd), samples=3)})
    cm = CostModel(g, cluster, job, profile=prof)
    costs = cm.op_costs(att, CP4)
    ci = costs.configs.index(cfg)
    alpha, beta = cm.ring_coefficients(CP4, 1)
    kv = 2 * att.inputs[1].numel / 4 * 2
    ring = 4 * (alpha + beta * kv) + 3 * (alpha + beta * 2 * kv)  # cpu: nothing overlaps
    overhead = cm.profile.op_overhead if cm.profile is not None else 0.0
    assert costs.time[ci] == pytest.approx(4 * (fwd + bwd) * cm.contention + overhead + ring, rel=1e-6)


def test_a_batch_smaller_than_the_data_axis_is_accepted_for_a_long_sequence():
    """Fewer sequences than devices split over dp x cp once the sequence is long: the request check
    that runs before capture knows it; a short sequence is still refused there."""
    from search.errors import InputError
    from search.plans.api import SearchRequest, request_cluster

    long = SearchRequest(model="llama-tiny", device="cpu", devices=4, global_batch=2, seq_len=8192)
    assert request_cluster(long).num_devices == 4
    with pytest.raises(InputError, match="global_batch 2 does not split over any data-parallel size"):
        request_cluster(long.model_copy(update={"seq_len": 1024}))
