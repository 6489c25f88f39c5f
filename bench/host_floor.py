"""How much of a micro-batch on a GPU is the host issuing kernels rather than the GPU running them.

    python bench/host_floor.py                                  # gpt2-medium and gpt3-1.3b, micro-batches 1..16
    python bench/host_floor.py --models gpt2-medium --sizes 1,16 --device cpu   # the script's own check

The H100 runs (docs/benchmarks.md, "On an H100") measured accumulating plans 3-9x slower than
predicted: each extra micro-batch of one sequence cost far more than its GPU work. This bench
tells the two apart for the model as the worker builds it (`reference_model`, bf16 autocast,
eager PyTorch), one forward and backward per row:

- `wall`: issue to completion (synchronised), median of --reps;
- `host`: issue to the return of `backward()`, unsynchronised: the time the Python thread and
  autograd's engine spend issuing work (when the GPU is the bottleneck the launch queue fills and
  this grows to the wall time);
- `gpu busy`: the sum of the kernels' own times (torch.profiler), i.e. the wall time if the host
  kept the GPU fed;
- `kernels`: kernel launches, and `host / kernel`: the host's cost per launch.

A row whose wall time is near its host time and well above its GPU time is host-bound: what the
cost model, which sums GPU time per op, cannot see.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from worker.analyze import Unsupported, model_spec
from worker.data import global_batch
from worker.executor import reference_model


def fwd_bwd(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> None:
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
          reps: int) -> tuple[float, float]:
    """(wall, host) medians in seconds."""
    walls, hosts = [], []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fwd_bwd(model, x, y, device)
        t1 = time.perf_counter()
        sync(device)
        t2 = time.perf_counter()
        hosts.append(t1 - t0)
        walls.append(t2 - t0)
        model.zero_grad(set_to_none=True)
    return statistics.median(walls), statistics.median(hosts)


def kernel_profile(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> tuple[float, int]:
    """(GPU busy seconds, kernel launches) of one forward and backward."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fwd_bwd(model, x, y, device)
        sync(device)
    model.zero_grad(set_to_none=True)
    busy_us, launches = 0.0, 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            busy_us += e.device_time_total
        elif "LaunchKernel" in e.name:
            launches += 1
    return busy_us * 1e-6, launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-medium,gpt3-1.3b")
    ap.add_argument("--sizes", default="1,2,4,16", help="micro-batch sizes in sequences")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here (--device cpu checks the script itself)", file=sys.stderr)
        raise SystemExit(2)
    try:
        specs = {name: model_spec(name) for name in args.models.split(",")}
    except Unsupported as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    sizes = [int(s) for s in args.sizes.split(",") if s.isdigit() and int(s) > 0]
    if len(sizes) != len(args.sizes.split(",")):
        print(f"error: --sizes takes positive whole numbers of sequences, got {args.sizes!r}", file=sys.stderr)
        raise SystemExit(2)
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'} (torch {torch.__version__}), "
          f"bf16 autocast, sequence {args.seq_len}, median of {args.reps}")
    print("| model | micro-batch | wall | host | gpu busy | kernels | host / kernel | host-bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, spec in specs.items():
        model = reference_model(name, seed=0).to(device)
        for size in sizes:
            x, y = (t.to(device) for t in global_batch(spec, 0, size, args.seq_len, seed=0)[:2])
            fwd_bwd(model, x, y, device)  # warm-up: allocator, cuBLAS handles, autotuning
            model.zero_grad(set_to_none=True)
            wall, host = timed(model, x, y, device, args.reps)
            busy, launches = kernel_profile(model, x, y, device)
            per = f"{host / launches * 1e6:.1f} us" if launches else "-"
            bound = "yes" if device.type == "cuda" and busy < 0.6 * wall else "no"
            print(f"| {name} | {size} | {wall * 1e3:.1f} ms | {host * 1e3:.1f} ms | {busy * 1e3:.1f} ms | "
                  f"{launches} | {per} | {bound} |", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
