"""Whether this machine (the one `paretoplan serve` runs on and starts its workers on) can run a plan,
so the dashboard can say why before a launch, not after a run fails in the worker.

The rules are the worker's own before it starts anything (worker/launch.py, `check_capacity`, and
worker/analyze.py): the service may not import the worker, so they are restated here and kept in
step with it. A worker on another machine may host what this one cannot; the answer is about this
machine and says so.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

from search import format_size

PROCS_PER_CORE = 4              # as worker.launch: CPU ranks beyond this per core mostly wait
PROCESS_OVERHEAD = 600 * 2**20  # as worker.launch: a rank's Python + torch + gloo before any model


@cache
def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@cache
def zoo_params() -> dict[str, int]:
    """Parameter counts of the models the worker can build by name: the zoo (from its index) and
    the small test models (built here, they are tiny)."""
    from search.models import zoo_index
    from search.models.zoo import TEST_MODELS

    return {**{n: s.param_count() for n, s in TEST_MODELS.items()}, **{m["name"]: int(m["params"]) for m in zoo_index.load()}}


def available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def launch_blocker(plan: dict[str, Any]) -> str | None:
    """Why this machine cannot run `plan` (a stored Plan's JSON), or None when it can."""
    model = plan.get("model")
    params = zoo_params().get(str(model))
    if params is None:
        return (f"model {model!r} is not in the zoo: the worker rebuilds a model by its zoo name, so plans of "
                "uploaded graphs and HF configs are priced but not launched")
    if plan.get("async_weights"):
        return "PipeDream-2BW (1-stale weights) is priced only: the executor runs 1F1B and GPipe"
    n = int(plan.get("num_devices") or 1)
    need = int((plan.get("predicted") or {}).get("memory_bytes") or 0)
    have_gpus = gpus()
    if have_gpus:
        if n > have_gpus:
            return f"the plan needs {n} GPUs; this machine has {have_gpus}"
        return None
    cores = os.cpu_count() or 1
    limit = max(4, PROCS_PER_CORE * cores)
    if n > limit:
        return (f"the plan needs {n} processes (one per device); this machine ({cores} CPU cores, no GPU) hosts "
                f"at most {limit}: search for fewer devices")
    total = n * (need + 4 * params + PROCESS_OVERHEAD)  # each rank also builds the fp32 model once
    have = available_memory()
    if total > have:
        return (f"the plan needs about {format_size(total)} of memory on this machine ({n} processes x "
                f"({format_size(need)} predicted + {format_size(4 * params)} to initialise + "
                f"{format_size(PROCESS_OVERHEAD)} each)); it has {format_size(have)} available")
    return None
