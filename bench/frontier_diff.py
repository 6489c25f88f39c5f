"""Proves a change to the search alters no frontier point: searches a list of cases and compares
every point (time, memory, mesh and ZeRO stage or pipeline shape, stage split, and every op's
configuration) with a stored result.

    python bench/frontier_diff.py --save before.json          # on the old checkout (or PYTHONPATH=old)
    python bench/frontier_diff.py --against before.json       # on the new one: exit 1 on any difference
    python bench/frontier_diff.py --quick --against before.json

Times and memories are compared to 1e-9 relative (the same sums in another order may differ in
the last bits); everything else exactly. Each case runs in a process of its own, so one case's
caches cannot help another.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from typing import Any

# (model, device, devices, global batch, seq len or 0 for the model's default, pipelines)
CASES: list[tuple[str, str, int, int, int, bool]] = [
    ("gpt2-tiny", "h100-80gb", 4, 8, 0, True),
    ("gpt2-medium", "h100-80gb", 8, 32, 0, True),
    ("gpt3-1.3b", "v100-32gb", 8, 256, 2048, True),
    ("llama-7b", "h100-80gb", 64, 256, 0, True),
    ("llama-70b", "h100-80gb", 64, 64, 4096, True),
    ("llama-70b", "h100-80gb", 128, 128, 4096, True),
    ("gpt3-175b", "a100-80gb", 1024, 1536, 2048, True),
    ("gpt3-175b", "a100-80gb", 1024, 1536, 2048, False),
    ("llama-70b", "h100-80gb", 128, 128, 4096, False),
    # encoder-decoders: pipelines across two stacks (stacks.py: cuts on their own for T5's 12
    # units, the stage DP for BART's 24 over 8 and 16 stages)
    ("t5-small", "h100-80gb", 64, 64, 512, True),
    ("bart-base", "h100-80gb", 64, 64, 512, True),
]
QUICK = [c for c in CASES if c[2] <= 8]
RTOL = 1e-9


def run_case(model: str, device: str, devices: int, batch: int, seq: int, pipeline: bool) -> list[dict[str, Any]]:
    """The frontier as plain data, fastest point first."""
    from search.algorithm.ft import SearchOptions, search
    from search.models.capture import capture_model
    from search.models.zoo import get_model
    from search.prices.cluster import make_cluster
    from search.prices.costmodel import TrainingJob

    spec = get_model(model)
    seq = seq or spec.default_seq_len or 0
    graph = capture_model(spec, batch, seq)
    job = TrainingJob(global_batch=batch, seq_len=seq, precision="bf16")
    result = search(graph, make_cluster(device, devices), job, SearchOptions(pipeline=pipeline, accumulate=True))
    out = []
    for p in result.points:
        sol = result.solutions[p.mesh_index]
        assignment = p.assignment
        digest = hashlib.sha256(json.dumps(sorted(assignment.items())).encode()).hexdigest()[:16]
        out.append({"time_s": p.time_s, "memory_bytes": p.memory_bytes, "solution": sol.describe(),
                    "stages": list(p.stages) if p.stages else None, "assignment": digest})
    return out


def _differences(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    if len(old) != len(new):
        return [f"{len(old)} points before, {len(new)} now"]
    diffs = []
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        for k in a:
            x, y = a[k], b.get(k)
            same = (abs(x - y) <= RTOL * max(abs(x), abs(y)) if isinstance(x, float) and isinstance(y, float)
                    else x == y)
            if not same:
                diffs.append(f"point {i}: {k} {x} -> {y}")
    return diffs


def _key(case: tuple[str, str, int, int, int, bool]) -> str:
    return json.dumps(case)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--save", help="write the frontiers to this JSON file")
    p.add_argument("--against", help="compare with the frontiers in this JSON file")
    p.add_argument("--quick", action="store_true", help="the small cases only")
    p.add_argument("--only", help="cases whose model name contains this")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        print(json.dumps(run_case(*json.loads(args.case))))
        return
    if not args.save and not args.against:
        p.error("give --save FILE or --against FILE")
    cases = QUICK if args.quick else CASES
    if args.only:
        cases = [c for c in cases if args.only in c[0]]
    stored: dict[str, Any] = {}
    if args.against:
        with open(args.against) as f:
            stored = json.load(f)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    results: dict[str, Any] = {}
    failed = False
    for case in cases:
        out = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], env=env,
                             capture_output=True, text=True)
        if out.returncode:
            print(f"{case}: search failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            failed = True
            continue
        points = json.loads(out.stdout.strip().splitlines()[-1])
        results[_key(case)] = points
        if args.against:
            if _key(case) not in stored:
                print(f"{case}: not in {args.against}")
                continue
            diffs = _differences(stored[_key(case)], points)
            failed |= bool(diffs)
            print(f"{case}: {len(points)} points, " + ("identical" if not diffs else f"{len(diffs)} differences"))
            for d in diffs[:10]:
                print("   ", d)
        else:
            print(f"{case}: {len(points)} points")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(results, f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
