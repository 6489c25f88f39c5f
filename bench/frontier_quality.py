"""How much the frontier gains over the plans people use today, on the same cost model.

    python bench/frontier_quality.py                 # the frontier with pipelines, every planner
    python bench/frontier_quality.py --no-pipeline   # without pipelines (and pipeline planners)

For each model and device count (h100-80gb nodes of 8, bf16): every baseline planner's time and
memory (Megatron 3-D and PipeDream-2BW's own planner included; 2BW's 1-stale weights admitted for
it, so the frontier is searched with --allow-async-pipeline too), the speed-up of the frontier's
fastest plan that fits the device's memory over it ("best fit"), the speed-up at the baseline's
own memory, and the memory saved at its time.
"""

from __future__ import annotations

import argparse
import time

from search.algorithm.ft import SearchOptions, search
from search.models.capture import capture_model
from search.models.zoo import get_model
from search.plans.baselines import against_frontier, baselines
from search.plans.plan import pick
from search.prices.cluster import make_cluster
from search.prices.costmodel import TrainingJob

CASES = [("gpt2-xl", 16, 32), ("bert-large", 8, 64), ("llama-7b", 64, 256), ("gpt3-13b", 64, 256)]
GIB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-pipeline", action="store_true", help="search and plan without pipelines")
    args = ap.parse_args()
    piped = not args.no_pipeline
    print(f"{'model':<11} {'dev':>4} {'baseline':<30} {'time ms':>9} {'mem GiB':>8} {'fits':>4} "
          f"{'best fit':>9} {'at its mem':>10} {'mem at its time':>15}")
    for model, devices, batch in CASES:
        graph = capture_model(get_model(model), batch)
        cluster = make_cluster("h100-80gb", devices)
        job = TrainingJob(global_batch=batch)
        t0 = time.perf_counter()
        result = search(graph, cluster, job, SearchOptions(pipeline=piped, allow_async=piped))
        seconds = time.perf_counter() - t0
        best = pick(result.points, cluster.memory_per_device)
        for b in baselines(graph, cluster, job, pipelines=piped, allow_async=piped):
            d = against_frontier(result.points, b)
            fits = b.memory_bytes <= cluster.memory_per_device
            best_fit = f"{b.time_s / best.time_s:.2f}x" if best and fits else "-"
            at_mem = f"{d['speedup']:.2f}x" if d["speedup"] else "-"
            at_time = f"{d['memory_ratio']:.2f}x less" if d["memory_ratio"] else "-"
            print(f"{model:<11} {devices:>4} {b.name:<30} {b.time_s * 1e3:>9.2f} {b.memory_bytes / GIB:>8.2f} "
                  f"{'yes' if fits else 'no':>4} {best_fit:>9} {at_mem:>10} {at_time:>15}", flush=True)
        print(f"{model:<11} {devices:>4} {'frontier: ' + str(len(result.points)) + ' plans':<30} "
              f"{best.time_s * 1e3 if best else float('nan'):>9.2f} "
              f"{best.memory_bytes / GIB if best else float('nan'):>8.2f}  (fastest that fits; search {seconds:.1f} s)")


if __name__ == "__main__":
    main()
