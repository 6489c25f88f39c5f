"""How much the frontier gains over the plans people use today, on the same cost model.

    python bench/frontier_quality.py

For each model and device count (h100-80gb nodes of 8, bf16): every baseline planner's time and
memory, the speed-up of the frontier's fastest plan that fits the device's memory over it
("best fit"), the speed-up at the baseline's own memory, and the memory saved at its time.
"""

from __future__ import annotations

import time

from search.baselines import baselines
from search.capture import capture_model
from search.cluster import make_cluster
from search.costmodel import TrainingJob
from search.ft import search
from search.plan import pick
from search.zoo import get_model

CASES = [("gpt2-xl", 16, 32), ("bert-large", 8, 64), ("llama-7b", 64, 256), ("gpt3-13b", 64, 256)]
GIB = 2**30


def main() -> None:
    print(f"{'model':<11} {'dev':>4} {'baseline':<30} {'time ms':>9} {'mem GiB':>8} {'fits':>4} "
          f"{'best fit':>9} {'at its mem':>10} {'mem at its time':>15}")
    for model, devices, batch in CASES:
        graph = capture_model(get_model(model), batch)
        cluster = make_cluster("h100-80gb", devices)
        job = TrainingJob(global_batch=batch)
        t0 = time.perf_counter()
        result = search(graph, cluster, job)
        seconds = time.perf_counter() - t0
        best = pick(result.points, cluster.memory_per_device)
        for b in baselines(graph, cluster, job):
            at_mem = min((p.time_s for p in result.points if p.memory_bytes <= b.memory_bytes * (1 + 1e-9)),
                         default=None)
            at_time = min((p.memory_bytes for p in result.points if p.time_s <= b.time_s * (1 + 1e-9)), default=None)
            fits = b.memory_bytes <= cluster.memory_per_device
            best_fit = f"{b.time_s / best.time_s:.2f}x" if best and fits else "-"
            print(f"{model:<11} {devices:>4} {b.name:<30} {b.time_s * 1e3:>9.2f} {b.memory_bytes / GIB:>8.2f} "
                  f"{'yes' if fits else 'no':>4} {best_fit:>9} "
                  f"{(f'{b.time_s / at_mem:.2f}x' if at_mem else '-'):>10} "
                  f"{(f'{b.memory_bytes / at_time:.2f}x less' if at_time else '-'):>15}", flush=True)
        print(f"{model:<11} {devices:>4} {'frontier: ' + str(len(result.points)) + ' plans':<30} "
              f"{best.time_s * 1e3 if best else float('nan'):>9.2f} "
              f"{best.memory_bytes / GIB if best else float('nan'):>8.2f}  (fastest that fits; search {seconds:.1f} s)")


if __name__ == "__main__":
    main()
