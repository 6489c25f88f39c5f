"""Framework overheads a training step pays beside its ops' own compute, timed on this machine.

The op timings (profiler.ops) run each op alone on plain tensors. A step run by the executor
(worker/) also pays, on every device:
- the optimizer step per parameter *tensor*: AdamW with foreach=False (as worker.parallelize
  builds it) launches a dozen small ops per tensor, and on DTensor parameters (FSDP2's
  fully_shard/replicate and tensor parallelism make every parameter one) each of them goes
  through DTensor's dispatch;
- tensor parallelism's DTensor dispatch per op: a module under a parallel style converts its
  input to a DTensor, runs its op on DTensor parameters (sharding propagation on every aten call,
  forward and backward) and converts the output back;
- activation checkpointing's own work per recomputed op, beyond running its forward again: the
  non-reentrant checkpoint packs every tensor autograd saves through a hook in the forward, and in
  the backward unpacks them by re-running the region under a second set of hooks.

Both are timed here in one process on a one-rank device mesh (DTensor's dispatch does the same
work whatever the mesh size; the collectives a larger mesh adds are priced by the collective
fits), as the median of repeats, and recorded in the DeviceProfile's `overheads`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch
from torch import nn

from search.prices.profile import Overheads


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of this process alone (DTensor needs one), unless one exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _median_time(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def optimizer_per_tensor(params: list[nn.Parameter], repeats: int) -> float:
    """Seconds per parameter tensor of one AdamW step (foreach=False) over tiny tensors, where
    the per-tensor launches are all there is."""
    for p in params:
        p.grad = torch.ones_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    return _median_time(opt.step, repeats) / len(params)


def time_overheads(repeats: int = 30, tensors: int = 32, width: int = 64) -> Overheads:
    """Measure the overheads above on this process's device (the CPU)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    plain = [nn.Parameter(torch.zeros(width)) for _ in range(tensors)]
    t_plain = optimizer_per_tensor(plain, repeats)
    with one_rank_group():
        mesh = init_device_mesh("cpu", (1,))
        dt = [nn.Parameter(distribute_tensor(torch.zeros(width), mesh, [Replicate()])) for _ in range(tensors)]
        t_dt = optimizer_per_tensor(dt, repeats)

        x = torch.randn(8, width, requires_grad=True)
        base = nn.Linear(width, width)
        styled = parallelize_module(nn.Linear(width, width), mesh, ColwiseParallel())

        def step(m: nn.Module) -> Callable[[], None]:
            def run() -> None:
                m.zero_grad(set_to_none=True)
                m(x).sum().backward()
            return run

        t_base = _median_time(step(base), repeats)
        t_styled = _median_time(step(styled), repeats)
    return Overheads(optimizer_tensor=t_plain, optimizer_dtensor=t_dt, dtensor_op=max(t_styled - t_base, 0.0),
                     recompute_op=recompute_per_op(repeats, width=width))


def recompute_per_op(repeats: int, width: int = 64, rows: int = 256, layers: int = 4) -> float:
    """Seconds per op that a non-reentrant checkpoint of a block of small ops (Linear, GELU) adds
    beyond running its forward once more: (checkpointed step - plain step - forward) / ops. The
    three are timed in turn within each repeat, so that a load on the host weighs on all three."""
    from torch.utils.checkpoint import checkpoint

    block = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())])
    x = torch.randn(rows, width, requires_grad=True)
    n_ops = 2 * layers

    def plain() -> None:
        block.zero_grad(set_to_none=True)
        block(x).sum().backward()

    def forward() -> None:
        with torch.no_grad():
            block(x)

    def checkpointed() -> None:
        block.zero_grad(set_to_none=True)
        checkpoint(block, x, use_reentrant=False).sum().backward()

    extra = []
    for i in range(repeats + 3):
        t = []
        for fn in (plain, forward, checkpointed):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        if i >= 3:
            extra.append((t[2] - t[0] - t[1]) / n_ops)
    return max(statistics.median(extra), 0.0)
