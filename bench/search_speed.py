"""How fast the search finds the whole exact frontier: one fresh process per case, pinned to one
core with one BLAS thread.

    python bench/search_speed.py                 # the table in docs/benchmarks.md
    python bench/search_speed.py --quick         # the small cases only
    PYTHONPATH=/path/to/old/tree python bench/search_speed.py   # the same table for another checkout
    python bench/search_speed.py --before /path/to/old/tree     # both, and the speedup (before/after)
    python bench/search_speed.py --only gpt3-175b --repeat 7    # 7 fresh processes per case: median, min

With `--repeat N` each case runs N times, each in a fresh process (alternating with `--before`'s
tree, so both see the same machine), and the seconds columns are the medians, with the fastest
CPU seconds beside them: on a shared machine one run swings by 1.5x, the median of several less.

Cases are searched as a new user runs them: the default space (every ZeRO stage, per-layer
recomputation, pipelines, gradient accumulation) and, for comparison, the same space without
pipelines (`--no-pipeline`). Columns: ops in the captured graph, frontier size, how many of its
points are pipelined (pp > 1) and on how many distinct meshes (pp x dp x tp) they lie, the least
memory per device on the frontier, search seconds (wall, the search only; capture is reported
apart), the search's CPU seconds (steadier than wall time on a shared machine) and the process's
peak RSS. It runs on older checkouts too (their default space, whatever it was).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

# (model, device, devices, global batch, seq len or 0 for the model's, pipelines)
CASES: list[tuple[str, str, int, int, int, bool]] = [
    ("gpt2-medium", "h100-80gb", 8, 32, 0, True),
    ("gpt3-1.3b", "v100-32gb", 8, 256, 2048, True),
    ("gpt3-1.3b", "v100-32gb", 4, 1024, 2048, True),  # Aceso's GPT-1.3B case (docs/benchmarks.md)
    ("llama-7b", "h100-80gb", 64, 256, 0, True),
    ("llama-70b", "h100-80gb", 64, 64, 4096, True),
    ("llama-70b", "h100-80gb", 128, 128, 4096, True),
    ("gpt3-175b", "a100-80gb", 1024, 1536, 2048, True),
    ("gpt3-175b", "a100-80gb", 1024, 1536, 2048, False),
    ("llama-70b", "h100-80gb", 64, 64, 4096, False),
    ("llama-70b", "h100-80gb", 128, 128, 4096, False),
]
QUICK = [c for c in CASES if c[2] <= 8]


def options(pipeline: bool):
    """The default space of this checkout (what `paretoplan search` searches), with or without
    pipelines; checkouts older than gradient accumulation have no `accumulate`."""
    import dataclasses

    from search.algorithm.ft import SearchOptions

    fields = {f.name for f in dataclasses.fields(SearchOptions)}
    return SearchOptions(pipeline=pipeline, **({"accumulate": True} if "accumulate" in fields else {}))


def run_case(model: str, device: str, devices: int, batch: int, seq: int, pipeline: bool) -> dict:
    import time

    from search.algorithm.ft import search
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob

    t0 = time.perf_counter()
    spec = get_model(model)
    seq = seq or spec.default_seq_len  # as `paretoplan search` fills it in
    graph = capture_model(spec, batch, seq)
    capture_s = time.perf_counter() - t0
    job = TrainingJob(global_batch=batch, seq_len=seq, precision="bf16")
    cpu0 = time.process_time()
    result = search(graph, make_cluster(device, devices), job, options(pipeline))
    cpu_s = time.process_time() - cpu0
    meshes = set()
    piped = 0
    for p in result.points:
        sol = result.solutions[p.mesh_index]
        meshes.add(sol.mesh.describe())
        piped += sol.mesh.pp > 1
    return {
        "model": model, "device": device, "devices": devices, "batch": batch, "seq": seq, "pipeline": pipeline,
        "ops": len(graph.ops), "frontier": len(result.points), "pipelined": piped, "meshes": len(meshes),
        "least_gib": min((p.memory_bytes for p in result.points), default=float("nan")) / 2**30,
        "search_s": result.search_seconds, "cpu_s": cpu_s, "capture_s": capture_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", help="cases whose model name contains this")
    p.add_argument("--before", metavar="TREE", help="also run each case on this checkout (e.g. main, from git "
                   "worktree or git archive) and print its times and the speedup in CPU seconds")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="runs per case, each in a fresh process; report medians (and the fastest CPU seconds)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.case:
        print(json.dumps(run_case(*json.loads(args.case))))
        return
    cases = QUICK if args.quick else CASES
    if args.only:
        cases = [c for c in cases if args.only in c[0]]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    pin = ["taskset", "-c", "0"] if os.path.exists("/usr/bin/taskset") else []

    def measure(case: tuple[str, str, int, int, int, bool], tree: str | None) -> dict | str:
        """One case in a fresh process, on this checkout or (PYTHONPATH) on `tree`."""
        run_env = dict(env, PYTHONPATH=tree) if tree else env
        out = subprocess.run([*pin, sys.executable, os.path.abspath(__file__), "--case", json.dumps(case)],
                             env=run_env, capture_output=True, text=True)
        if out.returncode:
            return out.stderr.strip().splitlines()[-1] if out.stderr.strip() else str(out.returncode)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def repeated(case: tuple[str, str, int, int, int, bool]) -> tuple[dict | str | None, dict | str]:
        """The case `--repeat` times on each tree, alternating; per tree the median of each time
        (and the fastest CPU seconds as `cpu_min`), or the first failure."""
        olds: list[dict | str] = []
        news: list[dict | str] = []
        for _ in range(args.repeat):
            if args.before:
                olds.append(measure(case, args.before))
            news.append(measure(case, None))
        return (median_of(olds) if args.before else None), median_of(news)

    min_col = f" {'min cpu':>7}" if args.repeat > 1 else ""
    before_cols = f" {'before s':>9} {'before cpu':>10} {'speedup':>7}" if args.before else ""
    print(f"{'model':<12} {'device':<10} {'devices':>7} {'batch':>6} {'seq':>5} {'space':>11} {'ops':>5} "
          f"{'frontier':>8} {'piped':>6} {'meshes':>6} {'least':>10} {'search s':>9} {'cpu s':>7}{min_col} {'capture s':>9} "
          f"{'peak RSS':>9}{before_cols}")
    for case in cases:
        old, r = repeated(case)
        if isinstance(r, str):
            print(f"{case}: failed: {r}", flush=True)
            continue
        space = "default" if r["pipeline"] else "no-pipeline"
        fastest = f" {r['cpu_min']:>7.2f}" if args.repeat > 1 else ""
        extra = ""
        if isinstance(old, dict):
            same = old["frontier"] == r["frontier"]
            extra = (f" {old['search_s']:>9.2f} {old.get('cpu_s', float('nan')):>10.2f} "
                     f"{old.get('cpu_s', float('nan')) / r['cpu_s']:>6.1f}x" + ("" if same else " (frontier differs!)"))
        elif old is not None:
            extra = f" before failed: {old}"
        print(f"{r['model']:<12} {r['device']:<10} {r['devices']:>7} {r['batch']:>6} {r['seq'] or '-':>5} {space:>11} "
              f"{r['ops']:>5} {r['frontier']:>8} {r['pipelined']:>6} {r['meshes']:>6} {r['least_gib']:>6.1f} GiB "
              f"{r['search_s']:>9.2f} {r.get('cpu_s', float('nan')):>7.2f}{fastest} {r['capture_s']:>9.2f} "
              f"{r['peak_rss_mib']:>6.0f} MiB{extra}", flush=True)


def median_of(runs: list[dict | str]) -> dict | str:
    """One row for several runs of a case: the first run's counts, the median of each time, the
    fastest CPU seconds as `cpu_min`; the first failure if a run failed."""
    failed = [r for r in runs if isinstance(r, str)]
    if failed:
        return failed[0]
    rows = [r for r in runs if isinstance(r, dict)]
    out = dict(rows[0])
    for key in ("search_s", "cpu_s", "capture_s", "peak_rss_mib"):
        out[key] = statistics.median(r[key] for r in rows if key in r) if any(key in r for r in rows) else float("nan")
    out["cpu_min"] = min((r.get("cpu_s", float("nan")) for r in rows), default=float("nan"))
    return out


if __name__ == "__main__":
    main()
