"""The suite's shared launch: the plans of every executor test module that checks finished runs
(the plan families, accumulation, context and expert parallelism, encoder-decoders, HF configs,
state-space and Tofu's models) run one after the other in ONE torchrun launch of 4 gloo processes,
so the suite pays the process start-up (4 ranks importing torch, ~10 CPU-seconds) once instead of
once per module.

A module declares its plans with `share(...)` at import; pytest imports every test module before it
runs any test, so when the first test asks for the launch (the session fixture `shared_launch`,
tests/worker/conftest.py), every group is known. Only the groups some selected test reads are
launched, so `pytest tests/worker/test_expert_parallel.py` runs the expert plans alone. A rank's
failure fails every test of the launch, with the name of the plan that was running."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from worker.spec import ExecSpec, Job

Runs = dict[str, tuple[Job, dict[str, Any]]]  # plan name -> (its Job, the raw result of its run)


@dataclass(frozen=True)
class Group:
    """One module's plans: built when the launch starts (building runs searches)."""

    build: Callable[[], dict[str, ExecSpec]]
    steps: int
    comm_debug: Callable[[str], bool]  # whose collectives the run counts


# (module reading the group, or "" for any module; the fixture that reads it) -> its plans
GROUPS: dict[tuple[str, str], Group] = {}


def share(module: str, fixture: str, build: Callable[[], dict[str, ExecSpec]], steps: int,
          comm_debug: Callable[[str], bool] = lambda name: False) -> None:
    """Put `build()`'s plans into the shared launch, for the tests of `module` ("": of any module)
    that use `fixture`."""
    GROUPS[(module, fixture)] = Group(build, steps, comm_debug)


def analyzed(plans: dict[str, Callable[[], Any]]) -> Callable[[], dict[str, ExecSpec]]:
    """A `share` build for plans named by builders (each returns a Plan): each analysed into its
    ExecSpec when the launch is made."""

    def build() -> dict[str, ExecSpec]:
        from worker.analyze import analyze

        return {name: analyze(make()) for name, make in plans.items()}

    return build


def wanted(items: Iterable[Any]) -> list[tuple[str, str]]:
    """The groups that the selected test items read."""
    keys = set()
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        module = getattr(getattr(item, "module", None), "__name__", "")
        keys |= {(m, f) for m, f in GROUPS if f in fixtures and m in ("", module)}
    return [k for k in GROUPS if k in keys]


def launch_groups(keys: list[tuple[str, str]], timeout: float = 1200) -> dict[tuple[str, str], Runs]:
    """Every plan of these groups, one after the other in one launch; per group, name -> (Job, raw
    result)."""
    from worker.launch import RunFailed, run_jobs
    from worker.spec import RunSettings

    jobs: list[tuple[tuple[str, str], str, Job]] = []
    for key in keys:
        g = GROUPS[key]
        for name, spec in g.build().items():
            settings = RunSettings(steps=g.steps, warmup=1, comm_debug=g.comm_debug(name))
            jobs.append((key, name, Job(spec=spec, settings=settings)))
    running: list[str] = []  # the plan the ranks started last, to name it when one fails

    def progress(msg: dict) -> None:
        if "job" in msg:
            key, name, _ = jobs[msg["job"]]
            running[:] = [f"{key[0] or key[1]}: {name!r}"]

    try:
        raws = run_jobs([job for _, _, job in jobs], timeout=timeout, progress=progress)
    except RunFailed as e:
        raise RunFailed(f"the shared launch of {len(jobs)} plans failed at {running or 'start-up'}: {e}",
                        rank=e.rank, log=e.log, died=e.died) from e
    out: dict[tuple[str, str], Runs] = {key: {} for key in keys}
    for (key, name, job), raw in zip(jobs, raws, strict=True):
        out[key][name] = (job, raw)
    return out
