"""Shared multi-process runs: every plan family of the faithfulness and collective checks runs in
ONE torchrun launch of 4 gloo processes (the plans one after the other in the same process
group), so the suite pays the process start-up once."""

from __future__ import annotations

import pytest

from tests.worker.families import COMM_FAMILIES, STEPS, families


@pytest.fixture(scope="session")
def family_plans():
    return families()


@pytest.fixture(scope="session")
def family_runs(family_plans):
    """name -> (Job, raw result) for every family, from one launch."""
    from worker.analyze import analyze
    from worker.launch import run_jobs
    from worker.spec import Job, RunSettings

    jobs = {name: Job(spec=analyze(plan), settings=RunSettings(steps=STEPS, warmup=1, comm_debug=name in COMM_FAMILIES))
            for name, plan in family_plans.items()}
    raws = run_jobs(list(jobs.values()), timeout=400)
    return {name: (job, raw) for (name, job), raw in zip(jobs.items(), raws, strict=True)}
