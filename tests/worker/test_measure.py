"""worker.measure: memory as torch holds it, including what no step's allocation events show."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from worker.measure import ddp_bucket_bytes, profiler_peak


def test_ddp_gradient_buckets_are_counted_in_the_peak() -> None:
    """DDP's Reducer allocates one flat gradient buffer of its parameters' size when it is built;
    a step's peak must include it although the step never allocates it."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    params = sum(p.numel() * 4 for p in model.parameters())
    before = ddp_bucket_bytes()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        assert ddp_bucket_bytes() - before == params
        x = torch.randn(4, 64)
        out: dict = {}
        with profiler_peak(out):
            ddp(x).sum().backward()
        # parameters, the buckets and the step's gradients at least
        assert out["peak_bytes"] >= 3 * params
        del ddp
    finally:
        dist.destroy_process_group()
