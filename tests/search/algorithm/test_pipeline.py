"""Pipeline parallelism in the search: exact against the exhaustive reference, self-consistent
plans, and the schedule rules (GPipe dominated, 2BW opt-in)."""

from __future__ import annotations

import numpy as np
import pytest

from search.algorithm.evaluate import evaluate_pipeline, micro_batch_graph
from search.algorithm.exhaustive import exhaustive_pipeline
from search.algorithm.ft import SearchOptions, search
from search.algorithm.pipeline import partitions, pipeline_shapes, search_pipelines, stage_band
from search.models.capture import capture_model
from search.models.zoo import get_model
from search.plans.plan import build_plans
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob
from tests.search.graphs import stack

JOB = TrainingJob(global_batch=24, seq_len=None)


def same_frontier(t1, m1, t2, m2) -> bool:
    o1, o2 = np.argsort(t1), np.argsort(t2)
    return (len(t1) == len(t2) and np.allclose(np.asarray(t1)[o1], np.asarray(t2)[o2], rtol=1e-9)
            and np.allclose(np.asarray(m1)[o1], np.asarray(m2)[o2], rtol=1e-9))


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "cnn-tiny"])
def test_micro_batch_graph_equals_capturing_the_micro_batch(name):
    spec = get_model(name)
    scaled = micro_batch_graph(capture_model(spec, 8, None), 4)
    direct = capture_model(spec, 2, None)
    assert [op.model_dump() for op in scaled.ops] == [op.model_dump() for op in direct.ops]
    assert scaled.op(scaled.ops[0].name) is scaled.ops[0]  # no stale name index from the full batch


def test_stage_band_and_partitions():
    assert list(stage_band(24, 4)) == [4, 5, 6, 7, 8]
    splits = partitions(5, 2)
    assert all(sum(s) == 5 and len(s) == 2 for s in splits)
    assert sorted(splits) == [(1, 4), (2, 3), (3, 2), (4, 1)]


@pytest.mark.parametrize("devices", [4, 6])
def test_pipeline_dp_equals_exhaustive(devices):
    """Every shape kind (p = 2 and 3, 1F1B, GPipe, 2BW, ZeRO 0 and 1, several m): the DP over
    stage boundaries and per-op configurations gives exactly the exhaustive frontier."""
    g = stack(3, batch=JOB.global_batch)
    cl = make_cluster("h100-80gb", devices)
    shapes = pipeline_shapes(cl, JOB, 3, (0, 1), allow_async=True, schedules=("1f1b", "gpipe", "2bw"))
    picked = {}
    for sh in shapes:  # one shape per (p, schedule) and per (p, ZeRO stage), smallest m: keeps it quick
        picked.setdefault((sh.stages, sh.schedule), sh)
        picked.setdefault((sh.stages, sh.zero), sh)
    assert {sh.stages for sh in picked.values()} == ({2} if devices == 4 else {2, 3})
    for sh in picked.values():
        sols = search_pipelines(g, cl, JOB, (0, 1), shapes=[sh])
        t, m = exhaustive_pipeline(g, cl, JOB, sh)
        assert sols, sh.describe()
        assert same_frontier(sols[0].root.t, sols[0].root.m, t, m), sh.describe()


@pytest.mark.parametrize("devices", [2, 4])
def test_accumulation_dp_equals_exhaustive(devices):
    """Gradient accumulation is the one-stage pipeline: for every ZeRO stage and micro-batch count
    the stage search gives exactly the exhaustive frontier of its shape."""
    g = stack(3, batch=JOB.global_batch)
    cl = make_cluster("h100-80gb", devices)
    shapes = pipeline_shapes(cl, JOB, 3, (0, 1, 2, 3), pipelines=False, accumulate=True)
    assert shapes and all(sh.stages == 1 and sh.micro_batches >= 2 for sh in shapes)
    assert {sh.zero for sh in shapes} == {0, 1, 2, 3}  # unlike a pipeline, every ZeRO stage accumulates
    picked = {}
    for sh in shapes:  # per ZeRO stage the fewest and the most micro-batches: keeps it quick
        picked.setdefault((sh.zero, "few"), sh)
        picked[(sh.zero, "many")] = sh
    for sh in picked.values():
        sols = search_pipelines(g, cl, JOB, (0, 1, 2, 3), shapes=[sh])
        t, m = exhaustive_pipeline(g, cl, JOB, sh)
        assert sols, sh.describe()
        assert same_frontier(sols[0].root.t, sols[0].root.m, t, m), sh.describe()


def test_accumulation_holds_one_micro_batch():
    """Accumulating over m micro-batches keeps one micro-batch's activations: the leanest plan
    needs less memory than the leanest plan that runs the whole per-rank batch at once."""
    g = stack(3, batch=JOB.global_batch)
    cl = make_cluster("h100-80gb", 2)
    flat = search(g, cl, JOB)
    acc = search(g, cl, JOB, SearchOptions(accumulate=True))
    assert min(p.memory_bytes for p in acc.points) < min(p.memory_bytes for p in flat.points)
    sols = [acc.solutions[p.mesh_index] for p in acc.points]
    assert any(s.pipeline is not None and s.pipeline.stages == 1 and s.pipeline.micro_batches > 1 for s in sols)
    assert min(acc.points, key=lambda p: p.memory_bytes).stages == (3,)


def test_shapes_reach_micro_batches_of_one_and_a_stage_per_layer():
    """Megatron-LM's own plans live here: micro-batches of one sample (m = the per-rank batch),
    and as many stages as layers."""
    cl = make_cluster("h100-80gb", 16)
    job = TrainingJob(global_batch=64, seq_len=None)
    shapes = pipeline_shapes(cl, job, 16, (0, 1))
    assert max(sh.stages for sh in shapes) == 16
    for sh in shapes:
        dp = sh.mesh.num_devices // sh.stages // sh.mesh.axes[-1].size
        assert sh.micro_batches >= sh.stages and (job.global_batch // dp) % sh.micro_batches == 0
    # pp 4 x dp 2 x tp 2: per-rank batch 32, micro-batches of 1 to 8 samples
    got = {sh.micro_batches for sh in shapes if sh.stages == 4 and sh.mesh.axes[-1].size == 2}
    assert got == {4, 8, 16, 32}


@pytest.mark.slow  # re-costs every pipeline point of a 6-layer stack: ~5 s
def test_every_pipeline_point_recosts_to_itself():
    g = stack(6, batch=32)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=32, seq_len=None)
    sols = search_pipelines(g, cl, job, (0, 1), allow_async=True)
    assert {s.shape.stages for s in sols} == {2, 4, 8} - {8}  # 8 stages > 6 layers
    for sol in sols:
        # plans re-cost every point of a solution at once, one evaluation per distinct split
        together = sol.recost(g, sol.assigns, list(sol.partitions))
        for i, split in enumerate(sol.partitions):
            assert sum(split) == 6
            r = evaluate_pipeline(sol, {k: v[i:i + 1] for k, v in sol.assigns.items()}, split)
            assert r["time"][0] == pytest.approx(sol.root.t[i], rel=1e-9)
            assert r["memory"][0] == pytest.approx(sol.root.m[i], rel=1e-9)
            for key, v in r.items():  # the same arithmetic per point: equal to the bit
                assert np.array_equal(together[key][i], v[0]), key


def test_gpipe_never_beats_1f1b():
    """Same bubble, at least as many in-flight micro-batches: every GPipe point is matched by 1F1B."""
    g = stack(4, batch=16)
    cl = make_cluster("h100-80gb", 4)
    job = TrainingJob(global_batch=16, seq_len=None)
    for sh in pipeline_shapes(cl, job, 4, (0,), schedules=("gpipe",)):
        gp = search_pipelines(g, cl, job, (0,), shapes=[sh])[0]
        sh1 = type(sh)(sh.mesh, sh.zero, sh.micro_batches, "1f1b")
        fb = search_pipelines(g, cl, job, (0,), shapes=[sh1])[0]
        for t, m in zip(gp.root.t, gp.root.m, strict=True):
            assert np.any((fb.root.t <= t * (1 + 1e-9)) & (fb.root.m <= m * (1 + 1e-9)))


def test_2bw_needs_opt_in():
    cl = make_cluster("h100-80gb", 8)
    assert all(s.schedule == "1f1b" for s in pipeline_shapes(cl, JOB, 12, (0, 1)))
    assert {s.schedule for s in pipeline_shapes(cl, JOB, 12, (0, 1), allow_async=True)} == {"1f1b", "2bw"}
    assert all(s.zero in (0, 1) for s in pipeline_shapes(cl, JOB, 12, (0, 1, 2, 3)))


@pytest.mark.slow  # two searches of an 8-layer stack, one with pipelines: ~5 s
def test_pipeline_plans_in_the_frontier():
    """A memory-bound stack: pipelines join the frontier, their Plans carry the stages and
    re-cost to the point, and 2BW plans say their weights are stale."""
    g = stack(8, batch=32)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=32, seq_len=None)
    flat = search(g, cl, job)
    piped = search(g, cl, job, SearchOptions(pipeline=True, allow_async=True))
    assert piped.stats["pipeline_shapes"] > 0
    # the joint frontier is never worse: every flat point is matched
    pt = np.array([p.time_s for p in piped.points])
    pm = np.array([p.memory_bytes for p in piped.points])
    for p in flat.points:
        assert np.any((pt <= p.time_s * (1 + 1e-9)) & (pm <= p.memory_bytes * (1 + 1e-9)))
    pipe_points = [p for p in piped.points if p.stages is not None]
    assert pipe_points, "no pipeline plan on the frontier of a stack this deep"
    # the leanest plan of all is a pipeline
    assert min(piped.points, key=lambda p: p.memory_bytes).stages is not None
    plans = build_plans(piped, pipe_points)
    for p, plan in zip(pipe_points, plans, strict=True):
        spec = plan.pipeline
        assert spec.stages == plan.mesh.pp == len(spec.stage_layers) // spec.virtual_stages > 1  # chunks, interleaved
        assert spec.stage_layers[0][0] == 0 and spec.stage_layers[-1][1] == 8
        assert all(a[1] == b[0] for a, b in zip(spec.stage_layers, spec.stage_layers[1:], strict=False))
        assert plan.predicted.time_s == pytest.approx(p.time_s, rel=1e-9)
        assert plan.predicted.memory_bytes == pytest.approx(p.memory_bytes, abs=1)
        assert max(spec.stage_memory_bytes) == pytest.approx(plan.predicted.memory_bytes, abs=1)
        assert spec.async_weights == (spec.schedule == "2bw")
        assert "pp" in plan.predicted.comm_bytes
        assert spec.schedule in plan.summary


def test_graph_without_a_stack_has_no_pipelines():
    g = capture_model(get_model("gpt2-tiny"), 8, None)  # 2 layers: no stack of 3 to cut
    assert search_pipelines(g, make_cluster("cpu", 4), TrainingJob(global_batch=8, seq_len=64), (0, 1)) == []


def test_a_tied_head_holds_its_own_copy_on_the_last_stage():
    """The lm head reads the input layer's weight (tied, as GPT's): on a pipeline the last stage
    keeps a copy with its gradients and optimizer state, and all-reduces its gradient with the
    first stage once per iteration (Megatron-LM's layout)."""
    from search.algorithm.evaluate import pipe_tables
    from search.models.graph import ParamRef
    from search.prices.costmodel import CostModel

    g = stack(4, batch=16)
    inp_w = g.op("inp").params[0]
    head = g.op("head")
    tied_head = head.model_copy(update={"params": (ParamRef(name=inp_w.name, shape=head.params[0].shape,
                                                             dims=head.params[0].dims, owner=False),)})
    tied = g.model_copy(update={"ops": tuple(tied_head if op.name == "head" else op for op in g.ops)})
    tied.__dict__.pop("_op_index", None)
    cl = make_cluster("h100-80gb", 4)
    job = TrainingJob(global_batch=16, seq_len=None)
    shape = next(s for s in pipeline_shapes(cl, job, 4, (0,)) if s.stages == 2)
    plain_t = pipe_tables(g, CostModel(g, cl, job), shape)
    tied_t = pipe_tables(tied, CostModel(tied, cl, job), shape)
    a, b = plain_t.op_costs["head"], tied_t.op_costs["head"]
    # the same states as the untied head (its own weight of the same shape), plus the cross-stage all-reduce
    assert np.allclose(a.parts, b.parts) and np.allclose(a.mem, b.mem)
    assert np.all(b.step > a.step) and np.allclose(b.time - a.time, b.step - a.step)
    # without a pipeline the head owns nothing: one copy, on every device, counted at the input layer
    flat = CostModel(tied, cl, job).op_costs(tied_head, search_mesh(cl))
    assert not flat.parts[:, :3].any()


def search_mesh(cl):
    from search.prices.mesh import mesh_candidates

    return mesh_candidates(cl)[0]


@pytest.mark.parametrize("devices,layers", [(4, 6), (8, 8)])
def test_shape_bounds_and_stage_pruning_keep_the_frontier_exact(devices, layers):
    """Skipping whole shapes on their bounds, taking the end stages first and dropping partial
    splits with the rest's lookahead only remove plans that cannot win: the default space's
    frontier (pipelines and accumulation) is the same with pruning on and off."""
    g = stack(layers, batch=32)
    cl = make_cluster("h100-80gb", devices)
    # fp32: no bf16 weight copies, which ZeRO-3 frees after each use and a pipeline stage holds
    # whole, so that pipelines still reach this small model's frontier and the check bites
    job = TrainingJob(global_batch=32, seq_len=None, precision="fp32")
    on = search(g, cl, job, SearchOptions(pipeline=True, accumulate=True))
    off = search(g, cl, job, SearchOptions(pipeline=True, accumulate=True, prune=False))
    assert on.stats["pipeline_shapes_tried"] == off.stats["pipeline_shapes_tried"] > 10
    t1, m1 = [p.time_s for p in on.points], [p.memory_bytes for p in on.points]
    t2, m2 = [p.time_s for p in off.points], [p.memory_bytes for p in off.points]
    assert same_frontier(t1, m1, t2, m2)
    assert any(p.stages is not None and len(p.stages) > 1 for p in on.points)  # pipelines reach it


def test_every_shape_lies_inside_its_bound():
    """`shape_bound` is a lower bound: every point of every shape's complete frontier (solved with
    no pruning) is at least as slow and as large as the bound, and above each of its lines."""
    from search.algorithm.chain import find_chain
    from search.algorithm.evaluate import mesh_costs
    from search.algorithm.pipeline import shape_bound, solve_shape
    from search.prices.costmodel import CostModel
    from search.prices.mesh import Mesh

    g = stack(6, batch=32)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=32, seq_len=None)
    lams = np.array([1e-12, 1e-10, 1e-9, 1e-8])  # seconds per byte, around this stack's trade-offs
    shapes = pipeline_shapes(cl, job, 6, (0, 1, 2, 3), accumulate=True)
    assert {sh.stages for sh in shapes} == {1, 2, 4}
    checked = 0
    for sh in shapes:
        mg = micro_batch_graph(g, sh.micro_batches)
        cm = CostModel(mg, cl, job.model_copy(update={"global_batch": job.global_batch // sh.micro_batches}))
        chain = find_chain(mg)
        sol = solve_shape(mg, cm, sh)
        if sol is None:
            continue
        bound = shape_bound(mg, cm, sh, chain, mesh_costs(mg, cm, Mesh(pp=1, axes=sh.mesh.axes), sh.zero, chain), lams)
        t, m = sol.root.t, sol.root.m
        tol = 1 - 1e-9
        assert np.all(t >= bound.t * tol) and np.all(m >= bound.m * tol), sh.describe()
        assert np.all(t[:, None] + lams[None, :] * m[:, None] >= bound.b[None, :] * tol), sh.describe()
        checked += 1
    assert checked > 20


def test_a_shape_is_not_pruned_by_plans_slightly_worse_than_its_own():
    """Known plans a hair slower and larger than a shape's own frontier beat none of its points:
    with them as the envelope (end-stage bounds, the DP's lookahead, partial-stage pruning all
    on) the shape still returns its complete frontier."""
    from search.algorithm.chain import find_chain
    from search.algorithm.evaluate import mesh_costs
    from search.algorithm.pipeline import solve_shape
    from search.prices.costmodel import CostModel
    from search.prices.mesh import Mesh

    g = stack(6, batch=32)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=32, seq_len=None)
    checked = 0
    for sh in pipeline_shapes(cl, job, 6, (0, 1, 2, 3), accumulate=True):
        mg = micro_batch_graph(g, sh.micro_batches)
        cm = CostModel(mg, cl, job.model_copy(update={"global_batch": job.global_batch // sh.micro_batches}))
        full = solve_shape(mg, cm, sh)
        if full is None:
            continue
        chain = find_chain(mg)
        base = mesh_costs(mg, cm, Mesh(pp=1, axes=sh.mesh.axes), sh.zero, chain)
        near = (full.root.t * (1 + 1e-6), full.root.m * (1 + 1e-6))
        pruned = solve_shape(mg, cm, sh, envelope=near, chain=chain, base=base)
        assert pruned is not None, sh.describe()
        assert same_frontier(pruned.root.t, pruned.root.m, full.root.t, full.root.m), sh.describe()
        checked += 1
    assert checked > 20


def test_known_plans_reduced_to_their_steps_answer_every_query_alike():
    """`_steps` keeps only the points where the staircase's least memory drops: every
    `least_memory` query, at a point's time, between two, before the first or after the last,
    gets the same answer (ties in time and in memory included)."""
    from search.algorithm.frontier import least_memory, staircase
    from search.algorithm.pipeline import _steps

    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        t = rng.integers(0, 20, n).astype(float)  # integers: many exact ties
        m = rng.integers(0, 20, n).astype(float)
        stair = staircase(t, m)
        steps = _steps(stair)
        assert len(steps[0]) <= len(stair[0])
        q = np.concatenate([t, t + 0.5, t - 0.5, [-1.0, 100.0]])
        assert np.array_equal(least_memory(steps, q), least_memory(stair, q))


def _one_stage_shapes(layers: int, zeros: tuple[int, ...], least_points: int):
    """Each gradient-accumulation shape of a stack of `layers` on 8 H100s (global batch 32) whose
    complete frontier has at least `least_points` points: (shape, its micro-batch graph, cost
    model, that frontier, the graph's stack, the shape's op tables), what a solve under known
    plans takes."""
    from search.algorithm.chain import find_chain
    from search.algorithm.evaluate import mesh_costs
    from search.algorithm.pipeline import solve_shape
    from search.prices.costmodel import CostModel
    from search.prices.mesh import Mesh

    g = stack(layers, batch=32)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=32, seq_len=None)
    for sh in pipeline_shapes(cl, job, layers, zeros, accumulate=True, pipelines=False):
        mg = micro_batch_graph(g, sh.micro_batches)
        cm = CostModel(mg, cl, job.model_copy(update={"global_batch": job.global_batch // sh.micro_batches}))
        full = solve_shape(mg, cm, sh)
        if full is None or len(full.root) < least_points:
            continue
        chain = find_chain(mg)
        yield sh, mg, cm, full, chain, mesh_costs(mg, cm, Mesh(pp=1, axes=sh.mesh.axes), sh.zero, chain)


def test_one_stage_partial_sums_pruned_by_their_completion_keep_every_point(monkeypatch: pytest.MonkeyPatch):
    """Gradient accumulation (p = 1) prunes each partial sum of its one stage by the least of
    the parts still to add (`_Completion`): against known plans that beat part of the shape's
    frontier, it returns the points the same solve without that bound returns (every point the
    known plans do not beat), and forms fewer pairs doing so."""
    from search.algorithm import pipeline
    from search.algorithm.pipeline import solve_shape

    checked = fewer = 0
    for sh, mg, cm, full, chain, base in _one_stage_shapes(6, (0, 1, 2, 3), 2):
        # known plans a little better than every other point of the shape's own frontier
        o = np.argsort(full.root.t)[::2]
        known = (full.root.t[o] * (1 - 1e-3), full.root.m[o] * (1 - 1e-3))
        pruned = solve_shape(mg, cm, sh, envelope=known, chain=chain, base=base)
        with monkeypatch.context() as mp:  # nothing left to add: the envelope's own test alone
            mp.setattr(pipeline._Completion, "rest",
                       lambda self, *a, **k: pipeline._Rest(np.zeros_like(self.unit.t), np.zeros_like(self.unit.m),
                                                            np.zeros_like(self.unit.w)))
            plain = solve_shape(mg, cm, sh, envelope=known, chain=chain, base=base)
        assert (pruned is None) == (plain is None), sh.describe()
        if pruned is None or plain is None:
            continue
        assert same_frontier(pruned.root.t, pruned.root.m, plain.root.t, plain.root.m), sh.describe()
        assert 0 < len(pruned.root) < len(full.root), sh.describe()
        fewer += pruned.stats.pairs < plain.stats.pairs
        checked += 1
    assert checked >= 4 and fewer >= 1


def test_pruned_one_stage_points_read_back_every_layer_and_recost_to_themselves():
    """A one-stage shape's layer powers pruned by the known plans (the corner and the hull tests
    drop points of intermediate powers) still read back a configuration for every op of every
    layer - the read-back splits each power's join by its layer count - and each point re-costs
    to itself."""
    from search.algorithm.pipeline import solve_shape

    checked = 0
    for sh, mg, cm, full, chain, base in _one_stage_shapes(12, (0, 3), 4):
        o = np.argsort(full.root.t)[::3]  # known plans a little better than a third of its points
        pruned = solve_shape(mg, cm, sh, envelope=(full.root.t[o] * (1 - 1e-3), full.root.m[o] * (1 - 1e-3)),
                             chain=chain, base=base)
        if pruned is None:
            continue
        assert {op.name for op in mg.ops} <= set(pruned.assigns), sh.describe()
        again = pruned.recost(mg, pruned.assigns, list(pruned.partitions))
        assert np.allclose(again["time"], pruned.root.t, rtol=1e-9), sh.describe()
        assert np.allclose(again["memory"], pruned.root.m, rtol=1e-9), sh.describe()
        checked += 1
    assert checked >= 2


def test_every_shape_lies_inside_its_end_stage_bounds():
    """`ends_bounds` holds every point of the shape's complete frontier through that boundary
    layout, whether its minima come from the first and last stage's frontiers, from the last
    stage's weights standing in for the first's, or from min-sum eliminations of the very
    factors those frontiers come from (`_end_least`, what the search prunes with: it must equal
    the frontiers' minima, so a shape it drops is one the frontiers would drop)."""
    from search.algorithm.evaluate import pipe_tables, stage_weights, weigh_op
    from search.algorithm.factor_graph import mesh_factors
    from search.algorithm.pipeline import EndLeast, _end_least, _Envelope, _Stages, ends_bounds, frontier_least, solve_shape
    from search.prices.costmodel import CostModel
    from search.prices.mesh import Mesh

    g = stack(6, batch=32)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=32, seq_len=None)
    lams = np.array([1e-12, 1e-10, 1e-9, 1e-8])
    checked = 0
    for sh in pipeline_shapes(cl, job, 6, (0, 1), accumulate=True):
        mg = micro_batch_graph(g, sh.micro_batches)
        cm = CostModel(mg, cl, job.model_copy(update={"global_batch": job.global_batch // sh.micro_batches}))
        sol = solve_shape(mg, cm, sh)
        tabs = pipe_tables(mg, cm, sh)
        if sol is None or tabs is None:
            continue
        S = _Stages.build(mg, cm, tabs, 0.0, True, _Envelope(np.zeros(0), np.zeros(0), tabs.buffers))
        assert S is not None
        w = stage_weights(sh.stages, sh.micro_batches, sh.schedule, sh.virtual_stages)
        first, last = S.ends[w[0]], S.ends[w[-1]]
        lean_head = S.solve(w[-1], head=True) if sh.stages > 1 else last
        assert lean_head is not None
        nb = len(tabs.op_costs[tabs.chain.boundary].configs)
        sub = Mesh(pp=1, axes=sh.mesh.axes)
        covered = {name for layer in tabs.chain.layers[2:] for name in layer}
        fresh = [mesh_factors(mg, cm, sub, 0.0, True, {k: weigh_op(oc, wt) for k, oc in tabs.op_costs.items()
                                                       if k not in covered}, wt, tabs.chain) for wt in (w[0], w[-1])]
        assert lean_head.head is not None and first.head is not None and last.tail is not None
        assert first.unit is not None and last.unit is not None
        least = {id(f): frontier_least(f, nb, lams, sh.stages)
                 for f in (first.head, first.unit, last.unit, last.tail, lean_head.head)}
        scalar = _end_least(mg, tabs, fresh[0], fresh[1], lams)
        exact = EndLeast(least[id(first.head)], least[id(first.unit)], least[id(last.unit)], least[id(last.tail)])
        for got, want in zip(scalar, exact, strict=True):
            assert np.array_equal(np.isfinite(got), np.isfinite(want)), sh.describe()
            assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-12, atol=0), sh.describe()
        lean = EndLeast(least[id(lean_head.head)], least[id(last.unit)], least[id(last.unit)], least[id(last.tail)])
        for ends in (exact, lean, scalar):
            bounds = ends_bounds(tabs, w, ends, lams)
            b_of = sol.assigns[tabs.chain.boundary]
            for i, (t, m) in enumerate(zip(sol.root.t, sol.root.m, strict=True)):
                # every point lies in one of the regions of its layout (one per end-stage split)
                assert bounds[int(b_of[i])].holds(float(t), float(m), rtol=1e-9), sh.describe()
        checked += 1
    assert checked > 10


def _stage_searches(devices: int, min_stages: int):
    """(shape, its tables, its stage search) for every pipeline shape of an 8-layer stack with at
    least `min_stages` stages whose tables exist: what the stage-search tests check, shape by shape."""
    from search.algorithm.evaluate import pipe_tables
    from search.algorithm.pipeline import _Envelope, _Stages
    from search.prices.costmodel import CostModel

    g = stack(8, batch=64)
    cl = make_cluster("h100-80gb", devices)
    job = TrainingJob(global_batch=64, seq_len=None)
    for sh in pipeline_shapes(cl, job, 8, (0, 1)):
        if sh.stages < min_stages:
            continue
        mg = micro_batch_graph(g, sh.micro_batches)
        cm = CostModel(mg, cl, job.model_copy(update={"global_batch": job.global_batch // sh.micro_batches}))
        tabs = pipe_tables(mg, cm, sh)
        if tabs is None:
            continue
        S = _Stages.build(mg, cm, tabs, 0.0, True, _Envelope(np.zeros(0), np.zeros(0), tabs.buffers))
        assert S is not None
        yield sh, tabs, S


def test_middle_stage_lower_bounds_hold_every_split():
    """The DP with its middle stages at their lower bounds (`_Stages.lower`: the ladder of
    powers-of-two micro-batches in flight) weakly dominates the true DP point for point, per
    boundary layout: what lets it declare a layout dead before the middle stages are solved."""
    from search.algorithm.pipeline import _split_layers

    checked = 0
    for sh, tabs, S in _stage_searches(8, min_stages=4):
        # some middle stage is bounded by another weighting than its own (else nothing is tested)
        assert any(S.lower_weights(s) != S.weights[s] for s in range(1, sh.stages - 1)), sh.describe()
        for b in S.boundary_configs():
            true = _split_layers(S, b, 8, tabs.p2p, 0.0)
            low = _split_layers(S, b, 8, tabs.p2p, 0.0, lower=True)
            if true is None:
                continue
            assert low is not None, sh.describe()
            tol = 1 + 1e-9
            for t, m in zip(true[0], true[1], strict=True):
                assert np.any((low[0] <= t * tol) & (low[1] <= m * tol)), sh.describe()
            checked += 1
    assert checked > 4


def test_pareto_mask3_keeps_exactly_the_points_nothing_beats_in_all_three():
    """`pareto_mask3` against the definition, pair by pair, with ties and several groups."""
    from search.algorithm.frontier import pareto_mask3

    rng = np.random.default_rng(7)
    n = 600
    group = rng.integers(0, 5, n)
    t, m, m2 = (rng.integers(0, 12, n).astype(float) for _ in range(3))  # coarse values: many ties
    kept = set(pareto_mask3(group, t, m, m2).tolist())
    for i in range(n):
        same = np.flatnonzero((group == group[i]) & (t <= t[i]) & (m <= m[i]) & (m2 <= m2[i]))
        beaten = any((t[j], m[j], m2[j]) != (t[i], m[i], m2[i]) for j in same)
        twins = [j for j in same if (t[j], m[j], m2[j]) == (t[i], m[i], m2[i])]
        # a point stays iff nothing beats it; of identical points exactly one stays
        if beaten:
            assert i not in kept, i
        else:
            assert sum(j in kept for j in twins) == 1, i


@pytest.mark.parametrize("devices", [8, 16])
def test_middle_stages_weigh_one_layer_frontier_exactly(devices):
    """A middle stage's layer frontier read off the one (time, static, activation) elimination
    (`_Stages.middle`) is the frontier its own weighted elimination finds, per boundary layout,
    for every middle stage of every shape."""
    checked = 0
    for sh, _, S in _stage_searches(devices, min_stages=3):
        assert S.middle is not None
        for w in S.weights[1:-1]:
            fast = S.middle(w)
            prob = S.solve(w)
            assert prob is not None and prob.unit is not None
            ref = prob.unit
            for b in np.unique(ref.keys[:, 0]):
                a, r = fast.keys[:, 0] == b, ref.keys[:, 0] == b
                assert same_frontier(fast.t[a], fast.m[a], ref.t[r], ref.m[r]), (sh.describe(), w, b)
            checked += 1
    assert checked > 5


def test_end_stage_bounds_keep_every_shape_that_adds_a_point():
    """The end-stage regions (`ends_bounds`, from min-sum minima) must not drop a shape whose
    own frontier beats the known plans: with known plans a hair slower and larger than each
    shape's points, no shape of a stack deep enough for middle stages may be judged beaten,
    and the pruned search of every such shape still finds its whole frontier."""
    from functools import partial

    from search.algorithm.evaluate import pipe_tables, stage_weights, weigh_op
    from search.algorithm.factor_graph import mesh_factors
    from search.algorithm.pipeline import _end_least, _ends_beaten, solve_shape
    from search.prices.costmodel import CostModel
    from search.prices.mesh import Mesh

    g = stack(8, batch=64)
    cl = make_cluster("h100-80gb", 8)
    job = TrainingJob(global_batch=64, seq_len=None)
    checked = 0
    for sh in pipeline_shapes(cl, job, 8, (0, 1)):
        if sh.stages < 3:
            continue
        mg = micro_batch_graph(g, sh.micro_batches)
        cm = CostModel(mg, cl, job.model_copy(update={"global_batch": job.global_batch // sh.micro_batches}))
        full = solve_shape(mg, cm, sh)
        tabs = pipe_tables(mg, cm, sh)
        if full is None or tabs is None:
            continue
        near = (full.root.t * (1 + 1e-6), full.root.m * (1 + 1e-6))
        w = stage_weights(sh.stages, sh.micro_batches, sh.schedule, sh.virtual_stages)
        sub = Mesh(pp=1, axes=sh.mesh.axes)
        covered = {name for layer in tabs.chain.layers[2:] for name in layer}
        first, last = (mesh_factors(mg, cm, sub, 0.0, True, {k: weigh_op(oc, wt) for k, oc in tabs.op_costs.items()
                                                             if k not in covered}, wt, tabs.chain) for wt in (w[0], w[-1]))
        least = partial(_end_least, mg, tabs, first, last)
        assert not _ends_beaten(tabs, w, least, near), sh.describe()
        pruned = solve_shape(mg, cm, sh, envelope=near)
        assert pruned is not None and same_frontier(pruned.root.t, pruned.root.m, full.root.t, full.root.m)
        checked += 1
    assert checked > 5


def test_collapsed_run_is_r_stage_steps():
    """`_collapsed_run` (r stages alike in one step of the lower DP) against r steps of the
    DP's recurrence N(j) = min over k of max(F(j - k), g_k), on random staircases with ties,
    budgets a stage cannot meet (inf) and bands of 1 to 5 counts, gaps and strides included:
    the same values, bit for bit, in the window of states asked for and inf outside it."""
    from search.algorithm.pipeline import _collapsed_run

    rng = np.random.default_rng(11)
    checked = 0
    for trial in range(300):
        ks = sorted(rng.choice(np.arange(1, 8), size=int(rng.integers(1, 6)), replace=False).tolist())
        if trial % 5 == 0:
            ks = [2 * k for k in ks]  # interleaved: counts in steps of v
        r = int(rng.integers(1, 7))
        n, budgets = int(rng.integers(r * ks[0], r * ks[-1] + 12)), int(rng.integers(1, 7))
        # staircases: nonincreasing in the budget, coarse values (ties), inf below a stage's leanest point
        g = np.sort(rng.integers(0, 6, (len(ks), budgets)).astype(float), axis=1)[:, ::-1].copy()
        g[rng.random(g.shape) < 0.2] = np.inf
        F = np.full((n + 1, budgets), np.inf)
        live = rng.random(n + 1) < 0.5
        F[live] = rng.integers(0, 6, (int(live.sum()), budgets))
        lo, hi = int(rng.integers(0, n + 1)), int(rng.integers(0, n + 1))
        want = F
        for _ in range(r):
            step = np.full_like(want, np.inf)
            for i, k in enumerate(ks):
                if k > n:
                    continue
                step[k:] = np.minimum(step[k:], np.maximum(want[:len(want) - k], g[i]))
            want = step
        want[:lo] = np.inf
        want[hi + 1:] = np.inf
        got = _collapsed_run(F, g, ks, r, lo, hi)
        assert np.array_equal(got, want), (ks, r, lo, hi)
        checked += len(ks) >= 3 and r >= 2 and bool(np.isfinite(want).any())
    assert checked > 20
