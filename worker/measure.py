"""Step time and peak memory of one rank.

Time: ``perf_counter`` around a whole step (forward, backward, optimizer), after the warm-up
steps, summarised by the median. Memory: on CUDA ``max_memory_allocated`` over the timed steps;
on CPU there is no allocator statistic, so one extra-instrumented step (kept out of the timing)
measures it, by default from the profiler's allocation events on top of the bytes live when the
step starts (`profiler_peak`). torch's ``MemTracker`` (`cpu_peak`) agrees with that to the size
of the input batch in a single process and splits the peak by kind, but it misses the buffers
collectives allocate inside c10d (hundreds of KiB on these runs) and refuses a module that runs
more than once per step, as a pipeline stage's do. RSS would under-read (allocator reuse). DDP's
gradient buckets (ZeRO-1 runs DDP) are allocated in C++ before any step and are reachable from
no Python object: they are added from the DDP modules' parameters (`ddp_bucket_bytes`).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator

import torch
from torch import nn


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> float:
    """Interquartile range over median: how steady the timed steps were (0 = identical)."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    m = statistics.median(xs)
    return (q[2] - q[0]) / m if m else 0.0


@contextlib.contextmanager
def cpu_peak(module: nn.Module, optimizer: torch.optim.Optimizer, out: dict) -> Iterator[None]:
    """Track one step with MemTracker; out['peak_bytes'] = the peak of all tracked CPU tensors
    (parameters, gradients, optimizer state, activations, temporaries)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    mt.track_external(module, optimizer)
    with mt:
        yield
    snap = mt.get_tracker_snapshot("peak")
    out["peak_bytes"] = int(sum(v.get("Total", 0) for dev, v in snap.items() if torch.device(dev).type == "cpu"))
    out["by_category"] = {str(k): int(v) for dev, cats in snap.items() for k, v in cats.items()
                          if torch.device(dev).type == "cpu"}


def live_cpu_bytes() -> int:
    """Bytes of every distinct CPU storage reachable from Python now (parameters, optimizer
    state, pipeline buffers, ...): what a step starts from."""
    import gc

    seen: set[int] = set()
    total = 0
    for o in gc.get_objects():
        try:
            if not torch.is_tensor(o):
                continue
        except ReferenceError:
            continue
        for t in _plain_tensors(o):
            if t.device.type != "cpu" or t.is_meta:
                continue
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr == 0 or ptr in seen:
                continue
            seen.add(ptr)
            total += st.nbytes()
    return total


def _plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding a tensor's data: itself, or those a wrapper subclass wraps
    (a DTensor's local shard; the AsyncCollectiveTensor of a functional collective, which a
    pipeline's last stage keeps from a step's row-parallel head among its outputs). A wrapper's
    own storage is a placeholder that refuses data_ptr()."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(t):
        return [t]
    attrs, _ = t.__tensor_flatten__()
    # (a DTensor names its device mesh among them too, no tensor)
    return [x for a in attrs if torch.is_tensor(getattr(t, a)) for x in _plain_tensors(getattr(t, a))]


def ddp_bucket_bytes() -> int:
    """Bytes of the gradient buckets of every DistributedDataParallel module alive: its Reducer
    allocates them in C++ when it is built (one flat buffer of all its trainable parameters'
    size, kept for the run), where neither the Python heap nor a step's allocation events see it."""
    import gc

    from torch.nn.parallel import DistributedDataParallel

    total = 0
    for o in gc.get_objects():
        try:
            if not isinstance(o, DistributedDataParallel):
                continue
        except ReferenceError:
            continue
        total += sum(p.numel() * p.element_size() for p in o.module.parameters() if p.requires_grad)
    return total


@contextlib.contextmanager
def profiler_peak(out: dict) -> Iterator[None]:
    """Peak CPU memory of one step from the profiler's memory events: the live bytes at the start
    plus the highest running sum of allocations and frees during the step. Used where MemTracker
    cannot be (a pipeline stage runs its modules once per micro-batch)."""
    from torch.profiler import ProfilerActivity, profile

    base = live_cpu_bytes() + ddp_bucket_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield
    # allocation events (sizes, negative for frees) from the profiler's event tree; the
    # FunctionEvent list folds most of them into the ops that made them
    from torch._C._profiler import _EventType

    allocs = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            allocs.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    run = peak = 0
    for _, size in sorted(allocs):
        run += size
        peak = max(peak, run)
    out["peak_bytes"] = int(base + peak)
    out["by_category"] = {"live_at_start": int(base), "step_peak_delta": int(peak)}
