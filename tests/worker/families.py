"""The plan families the faithfulness tests run, as Plans (4 processes each).

Data-parallel, FSDP and Megatron plans are the search's own baselines (search/plans/baselines.py) for
the 'cpu' catalog device; pipeline plans are those Plans with the mesh's pp axis and a
PipelineSpec set by hand, or `paretoplan estimate`'s plans (interleaved 1F1B, PipeDream-2BW).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from search.plans.api import SearchRequest, run_search
from search.plans.plan import AxisSpec, MeshSpec, PipelineSpec, Plan


@cache
def baselines(model: str, devices: int, batch: int = 8) -> dict[str, Plan]:
    o = run_search(SearchRequest(model=model, device="cpu", devices=devices, devices_per_node=devices,
                                 global_batch=batch, precision="fp32"))
    return {b.name: Plan.model_validate(b.plan) for b in o.report.baselines}


def baseline(model: str, name: str, devices: int = 4) -> Plan:
    bases = baselines(model, devices)
    return bases[name] if name in bases else bases[next(n for n in bases if n.startswith(name))]


def pipelined(plan: Plan, pp: int, schedule: str, micro_batches: int, layers: int = 2) -> Plan:
    """`plan` with pp pipeline stages in front of its own axes (so pp x its devices in all)."""
    axes = [AxisSpec(name=a.name, size=a.size, stride=a.stride, role=a.role) for a in plan.mesh.axes]
    data = 1
    for a in axes:  # axes on which the plan's ops split the batch (its summary says so)
        data *= a.size if f"{a.name}: batch" in plan.summary else 1
    per = layers // pp
    stage_layers = [[s * per, (s + 1) * per if s < pp - 1 else layers] for s in range(pp)]
    return plan.model_copy(update={
        "num_devices": plan.num_devices * pp,
        "mesh": MeshSpec(pp=pp, axes=axes),
        "pipeline": PipelineSpec(stages=pp, schedule=schedule, micro_batches=micro_batches,
                                 micro_batch_size=plan.global_batch // (data * micro_batches),
                                 stage_layers=stage_layers),
        "summary": f"{plan.summary} | pp{pp} {schedule} x{micro_batches}",
    })


def pipeline_points(config: dict, name: str, stages: int) -> list[Plan]:
    """Every point of the search's pipeline shapes of `stages` stages (not only the merged
    frontier's: on 4 CPU devices a tiny model's pipelines are mostly beaten), fastest first."""
    import numpy as np

    from search.algorithm.ft import SearchOptions, search
    from search.algorithm.results import FrontierPoint
    from search.plans.api import request_source, resolve, with_source
    from search.plans.plan import build_plans
    from search.prices.mesh import Mesh, MeshAxis

    req = SearchRequest(hf_config=config, name=name, device="cpu", devices=4, devices_per_node=4, global_batch=8,
                        seq_len=16, precision="fp32", baselines=False)
    graph, cluster, job, _ = resolve(req)
    dp4 = Mesh(pp=1, axes=(MeshAxis("dp", 4, 1, "data"), MeshAxis("tp", 1, 1, "tensor")))
    r = search(graph, cluster, job, SearchOptions(meshes=(dp4,), zero_stages=(0,), recompute=False, pipeline=True,
                                                  accumulate=False))
    points = []
    for i, sol in enumerate(r.solutions):
        if sol.pipeline is None or sol.pipeline.stages != stages:
            continue
        rows = np.arange(len(sol.root))
        configs, splits = sol.read_back(rows)
        points += [FrontierPoint(time_s=float(sol.root.t[j]), memory_bytes=float(sol.root.m[j]), mesh_index=i,
                                 configs=configs, row=int(j), stages=splits[j]) for j in rows]
    plans = with_source(build_plans(r, points), request_source(req, graph))
    return sorted(plans, key=lambda p: p.predicted.time_s)


def estimated(model: str, **shape: object) -> Plan:
    """The plan `paretoplan estimate` prices for 4 devices of this machine (Megatron-LM's terms)."""
    from search.plans.estimate import EstimateRequest, estimate

    est = estimate(EstimateRequest.model_validate({"model": model, "device": "cpu", "devices": 4, "devices_per_node": 4,
                                                   "global_batch": 8, "precision": "fp32", **shape}))
    assert est.launchable, est.not_launchable_reason
    return est.plan


@cache
def tensor_2d(model: str) -> list[Plan]:
    """The frontier's plans on a tpa2 x tpb2 mesh of 4 processes that split tensors on both axes,
    leanest first (2-D tensor parallelism: each op a different dimension on each axis)."""
    from search.algorithm.ft import SearchOptions, search
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.plans.plan import build_plans
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob
    from search.prices.mesh import tensor_2d_meshes

    cluster = make_cluster("cpu", 4, devices_per_node=4)
    mesh = next(m for m in tensor_2d_meshes(cluster) if m.axes[1].size == m.axes[2].size == 2)
    res = search(capture_model(get_model(model), 8, None), cluster, TrainingJob(global_batch=8, seq_len=None,
                 precision="fp32"), SearchOptions(meshes=(mesh,), zero_stages=(0,), recompute=False))
    both = [p for p in build_plans(res) if "tpa: rep 100%" not in p.summary and "tpb: rep 100%" not in p.summary]
    return sorted(both, key=lambda p: p.predicted.memory_bytes)


def uneven(plan: Plan, stage_layers: list[list[int]]) -> Plan:
    """`plan` with its stages holding these layers (a cut the search may pick: uneven stages)."""
    return plan.model_copy(update={"pipeline": plan.pipeline.model_copy(update={"stage_layers": stage_layers}),
                                   "summary": f"{plan.summary} | layers {stage_layers}"})


def with_zero(plan: Plan, zero: int) -> Plan:
    return plan.model_copy(update={"zero_stage": zero, "summary": f"{plan.summary} | zero{zero}"})


def cnn(name: str) -> Plan:
    return baseline("cnn-tiny", name)


GPT, LLAMA = "gpt2-tiny", "llama-tiny"
GPT4 = "gpt2-mini"  # 4 layers: 2 stages x 2 virtual stages

# name -> how to build its Plan on 4 processes. Builders, not Plans: the tests are parametrised
# by these names at collection, and building the Plans takes five searches (seconds).
FAMILIES: dict[str, Callable[[], Plan]] = {
    "dp": lambda: baseline(GPT, "data-parallel"),
    "fsdp": lambda: baseline(GPT, "fsdp"),
    "zero1": lambda: with_zero(baseline(GPT, "data-parallel"), 1),
    "zero2": lambda: with_zero(baseline(LLAMA, "data-parallel"), 2),
    "tp": lambda: baseline(GPT, "megatron-tp4-dp"),
    "tp+sp": lambda: baseline(GPT, "megatron-tp4-sp-dp"),
    "dp x tp": lambda: baseline(LLAMA, "megatron-tp2-dp"),
    "dp x tp+sp fsdp": lambda: with_zero(baseline(LLAMA, "megatron-tp2-sp-dp"), 3),
    "pp gpipe": lambda: pipelined(baseline(GPT, "data-parallel", 2), 2, "gpipe", 2),
    "pp 1f1b": lambda: pipelined(baseline(GPT, "data-parallel", 2), 2, "1f1b", 2),
    "pp x tp": lambda: pipelined(baseline(LLAMA, "megatron-tp2-dp", 2), 2, "1f1b", 2),
    "pp x fsdp": lambda: pipelined(baseline(LLAMA, "fsdp", 2), 2, "1f1b", 2),
    "tp 2-d": lambda: tensor_2d(GPT)[0],  # the leanest: every Linear split on both axes
    "tp 2-d fastest": lambda: min(tensor_2d(GPT), key=lambda p: p.predicted.time_s),
    "pp interleaved": lambda: estimated(GPT4, pp=2, micro_batch=1, virtual_stages=2),  # m4, chunks 1/1/1/1
    "pp 2bw": lambda: estimated(GPT4, pp=2, micro_batch=2, schedule="2bw"),
    "pp uneven": lambda: uneven(estimated(GPT4, pp=2, micro_batch=2), [[0, 3], [3, 4]]),
    "recompute": lambda: baseline(GPT, "fsdp+recompute"),
    "tp+recompute": lambda: baseline(GPT, "megatron-tp4-dp+recompute"),
    "cnn dp": lambda: cnn("data-parallel"),
}
STEPS = 3  # training steps of every family in the shared launch
COMM_FAMILIES = ("tp", "tp+sp", "tp 2-d", "tp 2-d fastest")  # whose collectives are counted (CommDebugMode)
# the pipelines whose point-to-point sends and receives are counted (worker/commcheck.py P2PCount)
P2P_FAMILIES = ("pp gpipe", "pp 1f1b", "pp x tp", "pp interleaved", "pp 2bw", "pp uneven")


def families() -> dict[str, Plan]:
    """name -> Plan on 4 processes."""
    return {name: build() for name, build in FAMILIES.items()}
