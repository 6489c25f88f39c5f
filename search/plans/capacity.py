"""Whether one CPU host can run a plan's ranks: the rule the worker applies before it starts
anything (worker.launch.check_capacity) and the service states before it offers a launch
(service.host.launch_blocker). It lives here, below both, so the two cannot drift apart."""

from __future__ import annotations

import os
from pathlib import Path

from search.prices.cluster import format_size

PROCESS_OVERHEAD = 600 * 2**20  # a rank's Python + torch + gloo before any model (measured ~450 MiB RSS)
PROCS_PER_CORE = 4              # CPU ranks time-share cores; beyond this a step is mostly waiting


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else total RAM."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cuda_devices() -> int:
    """CUDA devices this host has (0 without a GPU or a CUDA build)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_host_blocker(ranks: int, predicted_bytes: int, params: int, max_procs: int | None = None) -> str | None:
    """Why this CPU host cannot run `ranks` processes of a plan predicted at `predicted_bytes` per
    rank for a model of `params` parameters, or None. At start-up every rank also builds the
    whole fp32 model on the host once (worker.executor.materialize)."""
    cores = os.cpu_count() or 1
    limit = max_procs if max_procs is not None else max(4, PROCS_PER_CORE * cores)
    if ranks > limit:
        return (f"the plan needs {ranks} processes (one per device); this machine ({cores} CPU cores, no GPU) "
                f"hosts at most {limit}: search for fewer devices")
    init = 4 * params
    total = ranks * (predicted_bytes + init + PROCESS_OVERHEAD)
    have = available_memory()
    if total > have:
        return (f"the plan needs about {format_size(total)} of memory on this machine ({ranks} processes x "
                f"({format_size(predicted_bytes)} predicted + {format_size(init)} to initialise + "
                f"{format_size(PROCESS_OVERHEAD)} each)); it has {format_size(have)} available")
    return None
