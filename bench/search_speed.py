"""How fast FT finds the whole exact frontier: one fresh process per case, pinned to one core.

    python bench/search_speed.py            # the table for the README
    python bench/search_speed.py --quick    # the two small cases only

Columns: ops in the captured graph, configurations per op (largest, over all meshes), frontier
size, search seconds (FT only; capture is reported apart), and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

CASES = [
    # model, devices, global batch, eps, space: "ops" = per-op sharding only (the issue-2 space),
    # "full" = also every ZeRO stage and per-layer activation recomputation
    ("gpt2-medium", 8, 32, 0.0, "ops"),
    ("bert-large", 8, 64, 0.0, "ops"),
    ("llama-7b", 64, 256, 0.0, "ops"),
    ("gpt3-175b", 1024, 1536, 0.0, "ops"),
    ("gpt3-175b", 1024, 1536, 0.01, "ops"),
    ("gpt2-medium", 8, 32, 0.0, "full"),
    ("llama-7b", 64, 256, 0.0, "full"),
    ("gpt3-175b", 1024, 1536, 0.0, "full"),
    ("gpt3-175b", 1024, 1536, 0.01, "full"),
]


def run_case(model: str, devices: int, batch: int, eps: float, space: str) -> dict:
    import time

    from search.algorithm.ft import SearchOptions, search
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob

    t0 = time.perf_counter()
    graph = capture_model(get_model(model), batch)
    capture_s = time.perf_counter() - t0
    full = space == "full"
    options = SearchOptions(eps=eps, zero_stages=(0, 1, 2, 3) if full else (0,), recompute=full)
    result = search(graph, make_cluster("h100-80gb", devices), TrainingJob(global_batch=batch), options)
    return {
        "model": model, "devices": devices, "batch": batch, "eps": eps, "space": space, "ops": len(graph.ops),
        "configs_per_op": result.stats["max_configs_per_op"], "frontier": len(result.points),
        "search_s": result.search_seconds, "capture_s": capture_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        print(json.dumps(run_case(*json.loads(args.case))))
        return
    cases = CASES[:2] if args.quick else CASES
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    pin = ["taskset", "-c", "0"] if os.path.exists("/usr/bin/taskset") else []
    print(f"{'model':<12} {'devices':>7} {'batch':>6} {'space':>5} {'mode':>9} {'ops':>5} {'configs/op':>10} {'frontier':>8} "
          f"{'search s':>9} {'capture s':>9} {'peak RSS':>9}")
    for case in cases:
        out = subprocess.run([*pin, sys.executable, __file__, "--case", json.dumps(case)], env=env,
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        mode = "exact" if r["eps"] == 0 else f"eps={r['eps']}"
        print(f"{r['model']:<12} {r['devices']:>7} {r['batch']:>6} {r['space']:>5} {mode:>9} {r['ops']:>5} "
              f"{r['configs_per_op']:>10} {r['frontier']:>8} {r['search_s']:>9.2f} {r['capture_s']:>9.2f} "
              f"{r['peak_rss_mib']:>6.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
