"""What every executor test of a parallelism shares: launching named plans in one torchrun launch
of 4 gloo processes, and checking that a run trained the model as one process does."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from worker.spec import ExecSpec, Job


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
