"""Profile gpt2-tiny on this CPU, then search with the profile: the cost model prices every op
from its measured signature (within the profile's own spread), plans carry `estimated=False`
only when everything was measured, and a second run or model times only what is new."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.run import run_profile
from search.errors import InputError
from search.plans.api import SearchRequest, run_search
from search.prices.cluster import make_cluster
from search.prices.costmodel import CostModel, runs_on_dtensor
from search.prices.mesh import Mesh, MeshAxis
from search.prices.profile import DeviceProfile, ProfileLookup, op_signature
from tests.profiler.tiny import TINY


def _search(prof: DeviceProfile, **kw):
    fields = dict(model=TINY["model"], devices=TINY["devices"], devices_per_node=TINY["devices_per_node"],
                  global_batch=TINY["global_batch"], profile=prof.model_dump(mode="json"))
    fields.update(kw)
    return run_search(SearchRequest(**fields))


@pytest.fixture(scope="module")
def searched(tiny_profile):
    prof, _ = tiny_profile
    return prof, _search(prof)


def test_profile_holds_every_kind_of_measurement(tiny_profile) -> None:
    prof, summary = tiny_profile
    assert prof.device == "cpu" and prof.backend == "cpu" and prof.dist_backend == "gloo"
    assert summary.timed == summary.signatures == len(prof.ops) > 0 and summary.reused == 0
    assert summary.instances > summary.signatures  # deduplicated across layers and meshes
    assert not summary.failed
    assert all(e.samples >= 3 and e.fwd.median > 0 for e in prof.ops.values())
    assert {(f.kind, f.group_size) for f in prof.collectives} >= {(k, 2) for k in ("all_reduce", "all_gather",
                                                                                  "reduce_scatter", "all_to_all")}
    assert "bf16" in prof.optimizer and prof.optimizer["bf16"].beta > 0
    assert prof.models[0].model == "gpt2-tiny" and prof.models[0].signatures == summary.signatures


def test_search_uses_the_profile_device_and_measures_everything(searched) -> None:
    prof, o = searched
    assert o.report.device == "cpu"  # no device asked for: the profile's
    use = o.result.stats["profile"]
    assert use["signatures_measured"] > 0
    assert use["signatures_estimated"] == 0 and use["collectives_estimated"] == []
    assert o.plans and all(not p.predicted.estimated for p in o.plans)
    assert o.report.baselines and all(not b.plan["predicted"]["estimated"] for b in o.report.baselines)


def test_per_op_predicted_times_lie_within_the_measured_spread(searched) -> None:
    """For every op of every frontier plan, in the configuration the plan gives it: the forward
    time the cost model uses (time_rc - time: a recomputed op runs its forward once more) lies
    within the measured forward spread of the op's signature at that configuration's local
    shapes, and for ops without parameters (no gradient sync, no optimizer step) the whole time
    lies within the measured forward + backward spread."""
    prof, o = searched
    result = o.result
    graph = result.graph
    cm = CostModel(graph, result.cluster, result.job, profile=prof)
    roof = CostModel(graph, result.cluster, result.job)
    checked = 0
    for p in result.points:
        sol = result.solutions[p.mesh_index]
        assign = p.assignment
        for op in graph.ops:
            oc = cm.op_costs(op, sol.mesh, sol.zero)
            k = assign[op.name]
            entry = prof.ops[op_signature(op, sol.mesh, oc.configs[k], result.job.precision)]
            # recomputing also pays the checkpoint's own work, and a styled op's DTensor dispatch
            # half (both profiled apart: profiler.overheads), scaled by the host's contention
            lookup = cm.profile
            assert lookup is not None
            extra = lookup.recompute_op() + (lookup.dtensor_op() / 2 if runs_on_dtensor(op, oc.configs[k], sol.mesh)
                                             else 0.0)
            fwd = oc.time_rc[k] - oc.time[k] - extra * cm.contention
            assert entry.fwd.lo * (1 - 1e-9) <= fwd <= entry.fwd.hi * (1 + 1e-9), op.name
            if not op.params:
                lo, hi = entry.fwd.lo + entry.bwd.lo, entry.fwd.hi + entry.bwd.hi
                assert lo * (1 - 1e-9) <= oc.time[k] <= hi * (1 + 1e-9), op.name
            # and it is not the roofline's figure (the CPU catalog entry is a 32-core server)
            r = roof.op_costs(op, sol.mesh, sol.zero)
            assert fwd != pytest.approx(r.time_rc[k] - r.time[k], rel=1e-3)
            checked += 1
    assert checked >= len(graph.ops)


def test_unprofiled_shapes_fall_back_to_the_roofline_and_are_flagged(tiny_profile) -> None:
    """A global batch of 16 gives local shapes the profile (made at 8) never timed."""
    prof, _ = tiny_profile
    o = _search(prof, global_batch=16)
    use = o.result.stats["profile"]
    assert use["signatures_estimated"] > 0
    assert any(p.predicted.estimated for p in o.plans)  # plans using an unmeasured shape say so
    # a missing signature is priced exactly as without a profile: roofline forward, 2x backward
    graph, cluster, job = o.result.graph, o.result.cluster, o.result.job
    cm, roof = CostModel(graph, cluster, job, profile=prof), CostModel(graph, cluster, job)
    lookup = cm.profile
    # at 16 the local shapes on dp4 and dp2 x tp2 are those the profile timed at 8 on dp2 x tp2
    # and dp1 x tp4; on dp1 x tp4 the whole batch of 16 was never timed
    op = next(op for op in graph.ops if op.kind == "attention")
    seen = []
    for dp, tp in ((4, 1), (2, 2), (1, 4)):
        mesh = Mesh(pp=1, axes=(MeshAxis("dp", dp, tp, "data"), MeshAxis("tp", tp, 1, "tensor")))
        oc, r = cm.op_costs(op, mesh), roof.op_costs(op, mesh)
        have = [lookup.signature(op, mesh, c) in prof.ops for c in oc.configs]
        seen += have
        for k, measured in enumerate(have):
            if measured:
                assert oc.time[k] != pytest.approx(r.time[k], rel=1e-3)
            else:
                assert oc.time[k] == r.time[k]
        assert oc.estimated == (not all(have))
    assert any(seen) and not all(seen)


def test_an_empty_profile_prices_exactly_like_none() -> None:
    """Everything falls back: the same numbers to the bit, every table flagged estimated."""
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.costmodel import TrainingJob
    from search.prices.mesh import mesh_candidates

    graph = capture_model(get_model("gpt2-tiny"), 8, None)
    cluster = make_cluster("cpu", 4, 4)
    job = TrainingJob(global_batch=8, seq_len=64)
    cm, roof = CostModel(graph, cluster, job, profile=DeviceProfile(device="cpu")), CostModel(graph, cluster, job)
    for mesh in mesh_candidates(cluster):
        for zero in (0, 3):
            for op in graph.ops:
                a, b = cm.op_costs(op, mesh, zero), roof.op_costs(op, mesh, zero)
                for x, y in ((a.time, b.time), (a.time_rc, b.time_rc), (a.mem, b.mem)):
                    np.testing.assert_array_equal(x, y)
                assert a.estimated
            assert cm.buffers(mesh, zero=zero) == roof.buffers(mesh, zero=zero)
        prod, cons = graph.ops[2], graph.ops[3]
        from search.prices.mesh import op_configs

        e1 = cm.edge_costs(prod, cons, mesh, op_configs(prod, mesh), op_configs(cons, mesh))
        e2 = roof.edge_costs(prod, cons, mesh, op_configs(prod, mesh), op_configs(cons, mesh))
        np.testing.assert_array_equal(e1.time, e2.time)
        assert e1.estimated == (mesh.axes[0].size > 1 or mesh.axes[1].size > 1)


def test_calibration_factors_scale_what_they_name(tiny_profile) -> None:
    """Compute factors scale an op kind's measured time; comm factors an axis's collectives;
    the memory overhead shifts every rank's constant buffers."""
    from search.prices.profile import Calibration

    prof, _ = tiny_profile
    cal = prof.model_copy(update={"calibration": Calibration(compute={"linear": 2.0}, comm={"dp": 3.0},
                                                              memory_overhead_bytes=1000)})
    o = _search(prof, baselines=False)
    graph, cluster, job = o.result.graph, o.result.cluster, o.result.job
    mesh = next(s.mesh for s in o.result.solutions if s.mesh.axes[0].size == 2)  # dp2
    a, b = CostModel(graph, cluster, job, profile=prof), CostModel(graph, cluster, job, profile=cal)
    lin = next(op for op in graph.ops if op.kind == "linear" and op.params)
    fa, fb = (m.op_costs(lin, mesh) for m in (a, b))
    assert a.profile is not None
    ckpt = a.profile.recompute_op() * a.contention  # the checkpoint's own work: not linear's to scale
    np.testing.assert_allclose(fb.time_rc - fb.time - ckpt, 2.0 * (fa.time_rc - fa.time - ckpt), rtol=1e-12)
    al, bl = a.collective_coefficients(mesh, 0), b.collective_coefficients(mesh, 0)
    np.testing.assert_allclose(bl[0], 3.0 * al[0])
    np.testing.assert_allclose(bl[1], 3.0 * al[1])
    assert b.buffers(mesh) == a.buffers(mesh) + 1000


def test_an_explicit_other_device_is_refused(tiny_profile) -> None:
    prof, _ = tiny_profile
    with pytest.raises(InputError, match="measured on 'cpu'"):
        _search(prof, device="h100-80gb")


def test_a_rerun_on_its_own_profile_times_nothing(tiny_profile) -> None:
    prof, first = tiny_profile
    again, s = run_profile(TINY["model"], TINY["devices"], device="cpu", devices_per_node=TINY["devices_per_node"],
                           global_batch=TINY["global_batch"], base=prof, progress=False)
    assert (s.timed, s.reused, s.signatures) == (0, first.signatures, first.signatures)
    assert s.collective_fits == 0 and not s.optimizer_timed
    assert again.ops == prof.ops and again.collectives == prof.collectives
    assert len(again.models) == 1  # the same run recorded once


def test_a_second_model_times_only_what_is_new(tiny_profile) -> None:
    """llama-tiny shares gpt2-tiny's width, sequence and vocabulary: its embedding, attention and
    the square projections have the same signatures; RMS norm, SiLU and its MLP do not."""
    prof, _ = tiny_profile
    both, s = run_profile("llama-tiny", TINY["devices"], device="cpu", devices_per_node=TINY["devices_per_node"],
                          global_batch=TINY["global_batch"], base=prof, repeats=3, progress=False)
    assert s.reused > 0 and s.timed > 0 and s.timed + s.reused == s.signatures
    assert s.collective_fits == 0  # same devices: the collectives are all there
    assert set(prof.ops) < set(both.ops) and len(both.ops) == len(prof.ops) + s.timed
    assert [m.model for m in both.models] == ["gpt2-tiny", "llama-tiny"]


@pytest.mark.slow  # a pipeline search of gpt2-medium: ~8 s
def test_the_enumeration_is_exactly_what_the_search_looks_up() -> None:
    """Everything a search (every mesh, the pipeline stages at every micro-batch size, the
    baselines) asks the profile for is enumerated for timing, and nothing else: a 24-layer
    model with pipelines, shortened to 64 tokens (nothing is timed here)."""
    from profiler.ops import enumerate_signatures, pipeline_graphs
    from search.algorithm.ft import SearchOptions, search
    from search.plans.api import resolve
    from search.plans.baselines import baselines

    req = SearchRequest(model="gpt2-medium", device="cpu", devices=4, devices_per_node=4, global_batch=16, seq_len=64)
    graph, cluster, job, _ = resolve(req)
    lookup = ProfileLookup(DeviceProfile(device="cpu"), job.precision)
    result = search(graph, cluster, job, SearchOptions(profile=lookup, pipeline=True))
    assert result.stats["pipeline"]  # the stage search ran (whether or not a pipeline reaches the frontier)
    baselines(graph, cluster, job, profile=lookup)
    pipes = pipeline_graphs(graph, cluster, job)
    sigs = enumerate_signatures(graph, cluster, job.precision, pipelines=pipes)
    assert set(sigs.items) == lookup.missing
    # and the pipeline's micro-batch shapes are among them (not only the full batch's)
    assert len(enumerate_signatures(graph, cluster, job.precision).items) < len(sigs.items)


def test_cpu_ops_run_slower_beside_the_hosts_other_ranks(tiny_profile) -> None:
    """The profiler times an op in one process; a job runs one process per device on the same
    cores. 4 ranks of 1 thread on 2 cores: each op takes twice its profiled time."""
    from search.prices.profile import HostInfo

    prof, _ = tiny_profile
    host = prof.host.model_copy(update={"cpu_count": 2, "threads": 1, "accelerator": None})
    cpu = prof.model_copy(update={"host": host})
    assert ProfileLookup(cpu, "fp32").contention(4) == 2.0
    assert ProfileLookup(cpu, "fp32").contention(1) == 1.0  # never faster than alone
    gpu = prof.model_copy(update={"host": host.model_copy(update={"accelerator": "NVIDIA H100"})})
    assert ProfileLookup(gpu, "fp32").contention(8) == 1.0
    assert HostInfo().cpu_count == 0 and ProfileLookup(DeviceProfile(device="cpu"), "fp32").contention(4) == 1.0
    o = _search(prof)
    graph, job = o.result.graph, o.result.job
    mesh = o.result.solutions[0].mesh
    op = next(op for op in graph.ops if op.kind == "attention")  # no parameters: compute only
    four = CostModel(graph, make_cluster("cpu", 4, 4), job, profile=cpu).op_costs(op, mesh)
    roomy = cpu.model_copy(update={"host": host.model_copy(update={"cpu_count": 4})})
    alone = CostModel(graph, make_cluster("cpu", 4, 4), job, profile=roomy).op_costs(op, mesh)
    assert not four.estimated and np.allclose(four.time, 2.0 * alone.time) and alone.time.min() > 0
