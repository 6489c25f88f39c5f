"""`estimate`: one Megatron-style plan priced by the search's own cost model - the same price the
Megatron planners give the same grid point, dp and micro-batches derived as Megatron-LM does,
MFU by its definition, every impossible request an InputError naming the flag, and the place
of the plan against a frontier."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import pytest

from search.algorithm.evaluate import stage_weights
from search.errors import InputError
from search.models.graph import BlockInfo, Op, OpGraph, TensorRef
from search.plans.api import SearchRequest, run_search
from search.plans.baselines import GridPoint, Pricer, megatron, megatron_3d, megatron_tp_labels, pipeline_candidate
from search.plans.estimate import EstimateRequest, attention_core, compare, estimate, same_job
from search.plans.plan import Plan
from search.plans.reports import FrontierReport
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from tests.search.graphs import linear, norm, pointwise

N, B, SEQ = 8, 16, 128
GPT2 = dict(model="gpt2", device="h100-80gb", devices=N, global_batch=B, seq_len=SEQ)
TINY = dict(model="gpt2-tiny", device="h100-80gb", devices=N, global_batch=B)


def est(**kw):
    return estimate(EstimateRequest(**{**GPT2, **kw}))


@functools.cache
def pricer() -> Pricer:
    """The planners' pricer for the graph `estimate` captures for GPT2 (12 layers, 12 heads)."""
    from search.models.capture import capture_model
    from search.models.zoo import get_model

    graph = capture_model(get_model("gpt2"), B, SEQ)
    return Pricer(graph, make_cluster("h100-80gb", N), TrainingJob(global_batch=B, seq_len=SEQ))


# ---- the same price as the Megatron planners ---------------------------------------------------------
@pytest.mark.parametrize(("tp", "pp", "m", "recompute"), [(2, 2, 4, False), (4, 2, 8, True), (1, 4, 4, False),
                                                          (2, 4, 16, True)])
def test_a_pipeline_is_priced_as_the_megatron_3d_grid_prices_it(tp, pp, m, recompute):
    pr = pricer()
    c = pipeline_candidate(pr, GridPoint(tp, pp, m, "1f1b", 0, recompute, megatron_tp_labels(pr.graph)))
    assert c is not None
    dp = N // (tp * pp)
    e = est(tp=tp, pp=pp, micro_batch=B // (dp * m), recompute="full" if recompute else "none")
    assert (e.dp, e.micro_batches) == (dp, m)
    assert e.time_s == pytest.approx(c.time_s, rel=1e-12)
    assert e.memory_bytes == pytest.approx(c.memory_bytes, abs=1)
    assert e.plan.pipeline.stages == pp and e.plan.pipeline.micro_batches == m and e.plan.mesh.pp == pp


def test_the_megatron_3d_pick_is_what_its_flags_estimate_to():
    """megatron-3d's chosen grid point, written as Megatron-LM flags, prices to the baseline itself."""
    b = megatron_3d(pricer(), 2**30)[0]  # 1 GiB: a budget that makes it choose
    m = re.search(r"tp (\d+) x pp (\d+) x dp (\d+), 1F1B with (\d+) micro-batches", b.description)
    assert m, b.description
    tp, pp, dp, mb = (int(x) for x in m.groups())
    e = est(tp=tp, pp=pp, micro_batch=B // (dp * mb), recompute="full" if "recomputed" in b.description else "none")
    assert e.time_s == pytest.approx(b.time_s, rel=1e-12)
    assert e.memory_bytes == pytest.approx(b.memory_bytes, abs=1)


@pytest.mark.parametrize(("sp", "recompute"), [(False, "none"), (False, "full"), (True, "none")])
def test_without_a_pipeline_it_is_the_megatron_tp_dp_baseline(sp, recompute):
    bases = {b.name: b for b in megatron(pricer())}
    name = f"megatron-tp4{'-sp' if sp else ''}-dp" + ("+recompute" if recompute == "full" else "")
    e = est(tp=4, micro_batch=B // 2, sequence_parallel=sp, recompute=recompute)  # dp 2: one micro-batch
    assert e.micro_batches == 1 and e.plan.pipeline.stages == 1
    assert e.time_s == pytest.approx(bases[name].time_s, rel=1e-12)
    assert e.memory_bytes == pytest.approx(bases[name].memory_bytes, abs=1)
    assert e.launchable, e.not_launchable_reason


def test_dp_and_micro_batches_are_derived_as_megatron_does():
    e = est(tp=2, pp=2, micro_batch=2)
    assert (e.tp, e.pp, e.dp, e.micro_batch, e.micro_batches) == (2, 2, 2, 2, B // (2 * 2))
    sizes = {a.name: a.size for a in e.plan.mesh.axes}
    assert sizes == {"dp": 2, "tp": 2} and e.plan.mesh.pp == 2 and e.plan.num_devices == N
    assert e.plan.pipeline.micro_batch_size == 2 and e.plan.pipeline.stage_layers == [[0, 6], [6, 12]]
    assert Plan.model_validate(e.plan.model_dump(mode="json")) == e.plan


def test_gradient_accumulation_costs_time_and_saves_activations():
    one = est(tp=2, micro_batch=4)   # dp 4: 4 samples per rank in one micro-batch
    four = est(tp=2, micro_batch=1)  # the same in 4 micro-batches
    assert (one.micro_batches, four.micro_batches) == (1, 4)
    assert four.breakdown.activations < one.breakdown.activations
    assert four.breakdown.params == one.breakdown.params
    assert four.time_s > one.time_s
    assert "accumulate m4" in four.plan.summary
    assert four.launchable, four.not_launchable_reason  # the executor accumulates (tests/worker/test_accumulation.py)


# ---- MFU ------------------------------------------------------------------------------------------------
def test_mfu_is_model_flops_over_time_devices_and_peak():
    e = est(tp=2, pp=2, micro_batch=2)
    graph = pricer().graph
    assert e.model_flops == pytest.approx(3 * sum(op.flops for op in graph.ops), rel=1e-12)
    peak = make_cluster("h100-80gb", N).device.peak("bf16")
    assert e.peak_flops == peak
    assert e.mfu == pytest.approx(e.model_flops / (e.time_s * N * peak), rel=1e-12)
    assert e.plan.predicted.mfu == e.mfu and e.plan.predicted.model_flops == e.model_flops


def test_recomputation_is_not_model_flops():
    plain, full = est(tp=2, micro_batch=4), est(tp=2, micro_batch=4, recompute="full")
    assert full.model_flops == plain.model_flops
    assert full.time_s > plain.time_s and full.mfu < plain.mfu


# ---- interleaving and selective recomputation -----------------------------------------------------------
def test_interleaved_weights_follow_megatron():
    w = stage_weights(4, 8, "1f1b", 2)
    assert [x.slots for x in w] == [8 + 3 / 2] * 4
    assert [x.inflight for x in w] == [(2 * (4 - s - 1) + 4 + 1) / 2 for s in range(4)]
    plain = stage_weights(4, 8, "1f1b")
    assert [x.slots for x in plain] == [11] * 4 and [x.inflight for x in plain] == [4, 3, 2, 1]


def test_interleaving_shrinks_the_bubble_and_launches():
    v1, v2 = est(tp=2, pp=2, virtual_stages=1), est(tp=2, pp=2, virtual_stages=2)  # m = 8
    assert v2.time_s < v1.time_s  # NVLink transfers are cheap next to the bubble they remove
    assert v2.memory_bytes > v1.memory_bytes  # more micro-batches in flight on the first stage
    assert v2.plan.predicted.comm_bytes["pp"] == pytest.approx(2 * v1.plan.predicted.comm_bytes["pp"])
    assert v2.plan.pipeline.virtual_stages == 2 and "interleaved v2" in v2.plan.summary
    # launchable as far as the plan's shape tells (tp 2 splits GPT's tied head across stages: refused for that)
    assert "interleaved" not in (v2.not_launchable_reason or "") and est(pp=2, virtual_stages=2).launchable
    assert any("(pp - 1) / (v m)" in n for n in v2.notes)


def unfused_attention_graph(layers: int = 2) -> OpGraph:
    """A pre-norm block stack with unfused attention: q/k/v projections, scores = q k^T (matmul),
    softmax, dropout, probabilities x v (matmul), the output projection and the residual."""
    b, s, h = 8, 64, 512

    def t(src: str | None, dims: tuple[str, ...]) -> TensorRef:
        size = {"batch": b, "seq": s, "kv": s}
        return TensorRef(source=src, shape=tuple(size.get(d, h) for d in dims), dims=dims)

    ops: list[Op] = [linear("inp", t(None, ("batch", "seq", "x")), "hidden")]
    prev, blocks = "inp", []
    for i in range(layers):
        p = f"blocks.{i}"
        x = t(prev, ("batch", "seq", "hidden"))
        ln = norm(f"{p}.ln", x)
        q, k, v = (linear(f"{p}.{n}", t(ln.name, ln.output.dims), "hd") for n in "qkv")
        scores = Op(name=f"{p}.scores", kind="matmul", inputs=(t(q.name, ("batch", "seq", "hd")),
                                                                t(k.name, ("batch", "kv", "hd"))),
                    output=t(None, ("batch", "seq", "kv")), splittable=("batch", "seq"), flops=2.0 * b * s * s * h)
        soft = Op(name=f"{p}.softmax", kind="softmax", inputs=(t(scores.name, scores.output.dims),),
                  output=t(None, scores.output.dims), splittable=("batch", "seq"), flops=5.0 * b * s * s, saves="output")
        drop = pointwise(f"{p}.dropout", [t(soft.name, soft.output.dims)], saves="mask")
        drop = drop.model_copy(update={"output": t(None, soft.output.dims), "splittable": ("batch", "seq")})
        ctx = Op(name=f"{p}.context", kind="matmul", inputs=(t(drop.name, drop.output.dims),
                                                              t(v.name, ("batch", "kv", "hd"))),
                 output=t(None, ("batch", "seq", "hd")), splittable=("batch", "seq"), flops=2.0 * b * s * s * h)
        o = linear(f"{p}.o", t(ctx.name, ctx.output.dims), "hidden")
        add = pointwise(f"{p}.add", [x, t(o.name, o.output.dims)], saves="none")
        layer = [ln, q, k, v, scores, soft, drop, ctx, o, add]
        ops += layer
        blocks.append(tuple(op.name for op in layer))
        prev = add.name
    ops.append(linear("head", t(prev, ("batch", "seq", "hidden")), "vocab"))
    return OpGraph(name="unfused", ops=tuple(ops), blocks=(BlockInfo(prefix="blocks", layers=tuple(blocks)),),
                   meta={"global_batch": b})


def test_the_attention_core_is_what_megatron_checkpoints():
    g = unfused_attention_graph()
    core, outputs = attention_core(g)
    assert {n for n in core if n.startswith("blocks.0.")} == {"blocks.0.scores", "blocks.0.softmax",
                                                              "blocks.0.dropout", "blocks.0.context"}
    assert outputs == {"blocks.0.context", "blocks.1.context"}
    fused_core, _ = attention_core(pricer().graph)
    assert {pricer().graph.op(n).kind for n in fused_core} == {"attention"}


def test_selective_recomputation_lies_between_none_and_full():
    g = unfused_attention_graph().model_dump(mode="json")
    base = dict(graph=g, device="cpu", devices=2, micro_batch=4)  # dp 2, one micro-batch each
    none, sel, full = (estimate(EstimateRequest(**base, recompute=r)) for r in ("none", "selective", "full"))
    assert none.breakdown.activations > sel.breakdown.activations > full.breakdown.activations
    assert none.time_s < sel.time_s < full.time_s
    assert sel.model_flops == none.model_flops
    assert not sel.launchable and "selective" in (sel.not_launchable_reason or "")
    assert any("attention core" in n for n in sel.notes)


def test_selective_with_fused_attention_is_said_to_save_little():
    none, sel = est(tp=2, micro_batch=4), est(tp=2, micro_batch=4, recompute="selective")
    assert sel.memory_bytes <= none.memory_bytes and sel.time_s >= none.time_s
    assert any("fused attention op" in n for n in sel.notes)


def test_a_two_layer_model_can_be_pipelined_and_says_so():
    e = estimate(EstimateRequest(**TINY, tp=2, pp=2))
    assert e.plan.pipeline.stage_layers == [[0, 1], [1, 2]]
    assert any("stack of 2 layers" in n for n in e.notes)
    # GPT's embedding and head share a weight, split over tp and held by both stages: the worker runs it
    assert e.launchable, e.not_launchable_reason
    assert estimate(EstimateRequest(**TINY, pp=2)).launchable


# ---- every request that cannot be planned -----------------------------------------------------------------
BAD = {
    "tp x pp does not divide": (dict(**GPT2, tp=3), ["--tp 3 x --pp 1", "1, 2, 4, 8"]),
    "batch over dp": (dict(**{**GPT2, "global_batch": 12}, pp=1), ["--global-batch 12", "dp 8"]),
    "micro-batch does not divide": (dict(**GPT2, tp=2, micro_batch=3), ["--micro-batch 3", "1, 2, 4"]),
    "heads do not split": (dict(**GPT2, tp=8), ["--tp 8", "1, 2, 4"]),
    "more stages than layers": (dict(**TINY, pp=4), ["--pp 4", "at most --pp 2"]),
    "a CNN has no stages": (dict(model="cnn-tiny", devices=8, global_batch=16, pp=2), ["--pp 2", "no block stack"]),
    "a CNN has no layers to recompute": (dict(model="cnn-tiny", devices=8, global_batch=16, micro_batch=2, recompute="full"),
                                         ["--recompute full"]),
    "a CNN has no accumulation": (dict(model="cnn-tiny", devices=8, global_batch=16), ["--micro-batch 1", "2"]),
    "interleaving needs a pipeline": (dict(**GPT2, virtual_stages=2), ["--virtual-stages 2", "--pp 2 or more"]),
    "interleaving is 1F1B": (dict(**GPT2, pp=2, virtual_stages=2, schedule="gpipe"), ["--schedule 1f1b"]),
    "interleaving needs m a multiple of pp": (dict(**GPT2, tp=2, pp=4, micro_batch=8, virtual_stages=3),
                                              ["multiple of --pp 4", "--micro-batch must be one of 1, 2, 4"]),
    "chunks must divide the layers": (dict(**GPT2, pp=2, virtual_stages=4), ["--virtual-stages 4", "1, 2, 3, 6"]),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_impossible_requests_name_the_flag_and_what_works(case):
    kw, needles = BAD[case]
    with pytest.raises(InputError) as exc:
        estimate(EstimateRequest(**kw))
    for needle in needles:
        assert needle in str(exc.value), str(exc.value)


def test_bad_sizes_are_refused_at_the_edge():
    from pydantic import ValidationError

    for kw in (dict(tp=0), dict(zero=4), dict(recompute="some"), dict(schedule="zb")):
        with pytest.raises(ValidationError):
            EstimateRequest(**GPT2, **kw)


# ---- launchable, as far as the search knows ------------------------------------------------------------------
def test_what_the_executor_would_refuse_is_still_priced_and_flagged():
    cases = {
        "1f1b with fewer micro-batches than stages": (dict(pp=4, micro_batch=4), "1F1B needs at least"),
        "fp16 pipeline": (dict(tp=2, pp=2, precision="fp16"), "fp16"),
    }
    for name, (kw, needle) in cases.items():
        e = est(**kw)
        assert e.time_s > 0 and not e.launchable, name
        assert needle in (e.not_launchable_reason or ""), (name, e.not_launchable_reason)
    assert est(pp=2, schedule="2bw").launchable  # PipeDream-2BW runs (worker/stale.py)


# ---- against a frontier -------------------------------------------------------------------------------------
@dataclass
class P:
    time_s: float
    memory_bytes: float


def test_compare_names_the_dominating_point_and_by_how_much():
    frontier = [P(1.0, 10.0), P(2.0, 5.0), P(4.0, 2.0)]
    a = compare(frontier, P(3.0, 6.0))  # #1 is faster within its memory and leaner at its time
    assert a.dominated and a.dominated_by == 1 and not a.on_frontier
    assert (a.faster_point, a.leaner_point) == (1, 1)
    assert a.speedup == pytest.approx(1.5) and a.memory_ratio == pytest.approx(1.2)
    assert "dominated by #1" in a.message
    on = compare(frontier, P(2.0, 5.0))
    assert on.on_frontier and not on.dominated and "on the frontier" in on.message
    below = compare(frontier, P(0.5, 1.0))  # outside the searched space: nothing beats it
    assert not below.dominated and below.faster_point is None and "not dominated" in below.message


@functools.cache
def tiny_frontier() -> FrontierReport:
    return run_search(SearchRequest(**TINY, baselines=False)).report


def test_an_estimate_against_a_searched_frontier():
    report = tiny_frontier()
    e = estimate(EstimateRequest(**TINY, tp=2, micro_batch=2), report.frontier)  # dp 4, one micro-batch
    a = e.against_frontier
    assert a is not None and a.points == len(report.frontier)
    # the search covers tp x dp without a pipeline: nothing there beats the frontier
    assert a.dominated or a.on_frontier
    if a.dominated_by is not None:
        p = report.frontier[a.dominated_by]
        assert p.time_s <= e.time_s * (1 + 1e-9) and p.memory_bytes <= e.memory_bytes * (1 + 1e-9)
    assert math.isclose(min(p.time_s for p in report.frontier if p.memory_bytes <= e.memory_bytes * (1 + 1e-9)),
                        e.time_s / a.speedup, rel_tol=1e-9)


def test_a_frontier_of_another_job_is_refused():
    e = estimate(EstimateRequest(**TINY, tp=2))
    same_job(tiny_frontier(), e.plan, "the frontier")  # the same job: no error
    other = estimate(EstimateRequest(**{**TINY, "global_batch": 32}, tp=2))
    with pytest.raises(InputError, match="global batch is 16.*global batch is 32"):
        same_job(tiny_frontier(), other.plan, "the frontier")
