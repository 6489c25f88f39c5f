"""What every executor test of a parallelism shares: launching named plans in one torchrun launch
of 4 gloo processes, and checking that a run trained the model as one process does."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from search.plans.plan import Plan
from search.prices.mesh import Mesh, MeshAxis
from worker.spec import ExecSpec, Job

BATCH = 8


def mesh(dp: int, tp: int) -> Mesh:
    """dp x tp on one node of 4 processes, the tensor axis inside the data axis."""
    return Mesh(pp=1, axes=(MeshAxis("dp", dp, tp, "data"), MeshAxis("tp", tp, 1, "tensor")))


def frontier_on(model: str, m: Mesh, zero: int, **options: Any) -> list[Plan]:
    """The search's frontier for a zoo model on one mesh and ZeRO stage (no recomputation; fp32 on
    4 CPU devices, global batch BATCH), fastest first; `options` go to SearchOptions."""
    from search.algorithm.ft import SearchOptions, search
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.plans.plan import build_plans
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob

    spec = get_model(model)
    g = capture_model(spec, BATCH, spec.default_seq_len)
    job = TrainingJob(global_batch=BATCH, seq_len=spec.default_seq_len, precision="fp32")
    r = search(g, make_cluster("cpu", 4, devices_per_node=4), job,
               SearchOptions(meshes=(m,), zero_stages=(zero,), recompute=False, **options))
    return build_plans(r, r.points)


def searched_plan(model: str, batch: int, seq: int, m: Mesh, zero: int, recompute: bool = False) -> Plan:
    """The fastest plan the search finds for a zoo model on this mesh and ZeRO stage, fp32 on 4 CPU
    devices (with `recompute`, the leanest: every layer recomputed)."""
    from search.algorithm.ft import SearchOptions, search
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.plans.plan import build_plans
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob

    g = capture_model(get_model(model), batch, seq)
    job = TrainingJob(global_batch=batch, seq_len=seq, precision="fp32")
    r = search(g, make_cluster("cpu", 4, devices_per_node=4), job,
               SearchOptions(meshes=(m,), zero_stages=(zero,), recompute=recompute))
    points = [p for p in r.points if r.solutions[p.mesh_index].mesh == m]
    return build_plans(r, points[-1:] if recompute else points[:1])[0]


def launch(specs: dict[str, ExecSpec], steps: int, comm_debug: Callable[[str], bool] = lambda name: False
           ) -> dict[str, tuple[Job, dict[str, Any]]]:
    """name -> (Job, raw result) for every spec, run one after the other in one launch (the suite
    pays the process start-up once); `comm_debug(name)` counts that run's collectives."""
    from worker.launch import run_jobs
    from worker.spec import RunSettings

    jobs = {name: Job(spec=spec, settings=RunSettings(steps=steps, warmup=1, comm_debug=comm_debug(name)))
            for name, spec in specs.items()}
    raws = run_jobs(list(jobs.values()), timeout=400)
    return {name: (job, raw) for (name, job), raw in zip(jobs.items(), raws, strict=True)}


def assert_losses_match(what: str, got: list[float], reference: list[float], steps: int, tol: float) -> None:
    """The run's losses are finite, moved (something trained) and within `tol` of the single
    process's at every step."""
    assert len(got) == steps and all(math.isfinite(x) for x in got)
    assert abs(got[-1] - got[0]) > 1e-4, "the loss did not move: no training happened"
    diffs = [abs(a - b) for a, b in zip(got, reference, strict=True)]
    assert max(diffs) < tol, f"{what}: losses {got} vs single-process {reference}"


def assert_trains_as_one_process(what: str, job: Job, raw: dict[str, Any], steps: int, tol: float) -> None:
    """`assert_losses_match` against the single process run of the job's own model (its source
    too: an HF config rebuilt from the plan), seed and learning rate."""
    from worker.reference import reference_losses

    spec = job.spec
    ref = reference_losses(spec.model, steps, spec.global_batch, spec.seq_len, seed=job.settings.seed,
                           lr=job.settings.lr, source=spec.source)
    assert_losses_match(f"{what} ({spec.summary})", raw["losses"], ref, steps, tol)


def layer_all_to_alls(comm: dict[str, dict[str, dict[str, int]]]) -> Counter[tuple[str, str]]:
    """One rank's all-to-alls per (layer, phase), counted at the layers ("layers.N") themselves."""
    return Counter({(unit, phase): kinds["all_to_all"] for unit, phases in comm.items()
                    if unit.startswith("layers.") and unit.count(".") == 1
                    for phase, kinds in phases.items() if "all_to_all" in kinds})


def all_to_alls_outside_layers(comm: dict[str, dict[str, dict[str, int]]]) -> set[tuple[str, str]]:
    """The (unit, phase) pairs of one rank that ran an all-to-all outside the layers."""
    return {(u, p) for u, phases in comm.items() for p, kinds in phases.items()
            if "all_to_all" in kinds and not u.startswith("layers.") and u not in ("", "Global")}
