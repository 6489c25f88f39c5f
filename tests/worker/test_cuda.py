"""The CUDA/NCCL half of the worker and the profiler, run on real GPUs.

These machines have none: every test here skips with the reason, and the device tool (a lent
GPU machine) runs them: `python -m pytest -q tests/worker/test_cuda.py`. What they hold the code
to: a plan runs on GPUs (one process per GPU, NCCL) and trains the model as one CPU process does;
its report says what it measured and how; profiling a GPU times its ops and the search prices
from them.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import torch

from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from tests.worker.parity import assert_losses_match

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no CUDA device here: the device tool runs these on a GPU machine"),
]

STEPS, BATCH = 4, 8


def catalog_device() -> str:
    from profiler.run import detect_target

    return detect_target(None).spec.name


def frontier(model: str, devices: int, precision: str = "fp32") -> list[Plan]:
    return run_search(SearchRequest(model=model, device=catalog_device(), devices=devices, devices_per_node=devices,
                                    global_batch=BATCH, precision=precision)).plans


def run_on_gpus(plans: list[Plan], steps: int = STEPS) -> list:
    """RunReports of the plans, run one after the other in one launch, one process per GPU."""
    from worker.analyze import analyze
    from worker.launch import make_report, run_jobs
    from worker.spec import Job, RunSettings

    jobs = [Job(spec=analyze(p), settings=RunSettings(steps=steps, warmup=1, device="cuda")) for p in plans]
    started = datetime.now(UTC)
    raws = run_jobs(jobs, timeout=300)
    finished = datetime.now(UTC)
    return [make_report(j, r, started, finished) for j, r in zip(jobs, raws, strict=True)]


def test_the_fastest_and_leanest_plans_train_on_one_gpu_as_one_cpu_process_does() -> None:
    from worker.reference import reference_losses

    plans = frontier("llama-tiny", 1)
    picked = [plans[0], plans[-1]]  # the fastest and the leanest (recomputation, accumulation)
    reports = run_on_gpus(picked)
    ref = reference_losses("llama-tiny", STEPS, BATCH, None)
    for plan, rep in zip(picked, reports, strict=True):
        # fp32 on both sides; the GPU's kernels sum in another order than the CPU's
        assert_losses_match(plan.summary, rep.losses, ref, STEPS, tol=1e-4)
        assert rep.backend == "nccl" and torch.cuda.get_device_name(0) in rep.device
        assert rep.measured.memory_method == "cuda_max_allocated"
        assert rep.measured.memory_bytes and rep.measured.memory_bytes > 0
        assert rep.measured.time_s > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: data parallelism over NCCL")
def test_data_and_tensor_parallel_plans_over_two_gpus_train_as_one_process_does() -> None:
    from worker.reference import reference_losses

    plans = frontier("llama-tiny", 2)
    by_mesh = {}
    for p in plans:
        by_mesh.setdefault(p.summary.split(" recompute")[0].split(" zero")[0], p)
    reports = run_on_gpus(list(by_mesh.values()))
    ref = reference_losses("llama-tiny", STEPS, BATCH, None)
    for (mesh, _), rep in zip(by_mesh.items(), reports, strict=True):
        assert_losses_match(mesh, rep.losses, ref, STEPS, tol=1e-4)
        assert rep.num_devices == 2 and rep.backend == "nccl"


def test_profiling_the_gpu_times_its_ops_and_the_search_prices_from_them() -> None:
    from profiler.run import run_profile

    prof, summary = run_profile("gpt2-tiny", 1, global_batch=BATCH, precision="bf16", progress=False)
    assert prof.host.accelerator == torch.cuda.get_device_name(0)
    assert summary.timed > 0 and not summary.failed, summary.line()
    assert prof.ops and all(op.fwd.median > 0 for op in prof.ops.values())
    out = run_search(SearchRequest(model="gpt2-tiny", device=catalog_device(), devices=1, global_batch=BATCH,
                                   precision="bf16", profile=prof.model_dump(mode="json")))
    assert out.plans and all(p.predicted.priced_from == "profile" for p in out.plans)
