"""Predicted vs measured on CUDA GPUs: the cost model's catalog entry for this machine's GPU (and,
with --profile, a DeviceProfile measured here) against real runs on it.

    python bench/gpu_accuracy.py                                   # every GPU here, gpt2-medium and gpt3-1.3b
    python bench/gpu_accuracy.py --profile --reports runs/      # also a profile of this GPU, raw and calibrated

For each model, searches the catalog entry matching this machine's GPU (an H100 SXM: h100-80gb)
with as many devices as this machine has GPUs, on one node, bf16, then runs up to --max-plans of
its plans the executor can run as planned (spread along the frontier, two baselines among them),
one process per GPU on NCCL, for --steps steps, and
prints per plan the predicted and measured iteration time (median of the slowest rank over the
timed steps) and peak memory per GPU (torch.cuda.max_memory_allocated), the relative errors, the
order (whether the frontier's plans stay non-dominated when run, and whether the plan picked for
each budget fits and is the measured fastest that fits) and the median absolute errors.

With one GPU the plans differ by micro-batch count, recomputation and (for a baseline) data
layout, not by parallelism across GPUs: the compute and memory halves of the model are checked,
the communication half needs a machine of several GPUs. Exits 2 on a machine without CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from cost_model_accuracy import MEMORY_TARGET, TIME_TARGET, candidates, print_order, print_refused, print_table, run_set

from search import Errors, Predicted, RunReport, rel_error
from search.prices.profile import DeviceProfile


def sample(runnable: list, n: int) -> list:
    """At most n plans spread over the whole frontier (its fastest and leanest ends included, every
    k-th between) and the baselines after them, two at most: a one-GPU frontier has dozens of
    points one recomputed layer apart, and the errors worth seeing are along its whole length."""
    front = [e for e in runnable if e[0].startswith("frontier")]
    rest = [e for e in runnable if not e[0].startswith("frontier")][:2]
    k = max(n - len(rest), 2)
    if len(front) > k:
        front = [front[round(i * (len(front) - 1) / (k - 1))] for i in range(k)]
    return front + rest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-medium,gpt3-1.3b")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-plans", type=int, default=12, help="per model")
    ap.add_argument("--profile", action="store_true",
                    help="then profile this GPU (paretoplan profile), price the same runs with that profile, and with it "
                    "calibrated on the first model's runs alone (the others held out)")
    ap.add_argument("--reports", help="folder to write every RunReport JSON (and the profile) into")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device on this machine: this benchmark runs on GPUs "
              "(bench/cost_model_accuracy.py measures the CPU)", file=sys.stderr)
        raise SystemExit(2)
    from profiler.run import detect_target

    target = detect_target(None)
    gpus = torch.cuda.device_count()
    start = time.perf_counter()
    models = args.models.split(",")
    labelled, refused = [], []
    for model in models:
        runnable, ref = candidates(model, gpus, gpus, args.global_batch, None, device=target.spec.name,
                                   precision=args.precision, seq_len=args.seq_len, host="cuda")
        labelled += [(model, label, spec) for label, spec in sample(runnable, args.max_plans)]
        refused += [(model, label, why) for label, why in ref]
    reports = run_set(labelled, args.steps, args.warmup, device="cuda")
    print(f"\n{gpus} x {torch.cuda.get_device_name(0)} (torch {torch.__version__}), {args.precision}, global batch "
          f"{args.global_batch}, sequence {args.seq_len}, {args.steps} steps ({args.warmup} warm-up)")
    summarize(f"the catalog's {target.spec.name!r}", labelled, reports)
    print_refused(refused)
    save(args.reports, "catalog", reports)

    if args.profile:
        from profiler.calibrate import calibrate
        from profiler.run import run_profile

        prof = None
        for model in models:
            prof, summary = run_profile(model, gpus, global_batch=args.global_batch, seq_len=args.seq_len,
                                        precision=args.precision, base=prof, progress=False)
            print(f"profiled {model}: {summary.line()}")
        assert prof is not None
        if args.reports:
            prof.dump(Path(args.reports) / "profile.json")
        profiled = [repriced(r, prof) for r in reports]
        summarize("a DeviceProfile measured on this GPU (uncalibrated)", labelled, profiled)
        save(args.reports, "profile", profiled)
        first = [i for i, (m, _, _) in enumerate(labelled) if m == models[0]]
        rest = [i for i in range(len(labelled)) if i not in first]
        if rest:
            cal = calibrate([profiled[i] for i in first], prof, shared_compute=True)
            print(f"calibrated on {models[0]}'s runs alone: {cal.line()}")
            held = [repriced(reports[i], cal.profile) for i in rest]
            summarize(f"that profile calibrated on {models[0]} (held-out: the other models' runs)",
                      [labelled[i] for i in rest], held)
    print(f"(ran {time.perf_counter() - start:.0f} s)")
    if args.reports:
        (Path(args.reports) / "machine.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(0), "gpus": gpus, "torch": torch.__version__,
             "catalog": target.spec.name}, indent=1))


def repriced(report: RunReport, profile: DeviceProfile) -> RunReport:
    """The same run with its prediction re-priced from `profile`."""
    from profiler.calibrate import price_plan

    t, m = price_plan(report.plan, profile)
    predicted = Predicted(time_s=t, memory_bytes=int(round(m)))
    errors = Errors(time=rel_error(report.measured.time_s, t), memory=rel_error(report.measured.memory_bytes, m))
    plan = {**report.plan, "predicted": {**report.plan["predicted"], **predicted.model_dump()}}
    return RunReport.model_validate(report.model_copy(update={"predicted": predicted, "errors": errors, "plan": plan})
                                    .model_dump())


def summarize(source: str, labelled: list, reports: list[RunReport]) -> None:
    print(f"\npredictions from {source}:")
    t_err, m_err = print_table(labelled, reports)
    print()
    print_order(labelled, reports)
    if t_err:
        signed = [r.errors.time for r in reports if r.errors.time is not None]
        print(f"median |time error| {statistics.median(t_err) * 100:.1f}% (target {TIME_TARGET:.0%}; median signed "
              f"{statistics.median(signed) * 100:+.1f}%: + means the run was slower than predicted), median |memory "
              f"error| {statistics.median(m_err) * 100:.1f}% (target {MEMORY_TARGET:.0%}) over {len(reports)} plans")


def save(folder: str | None, tag: str, reports: list[RunReport]) -> None:
    if folder:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for i, rep in enumerate(reports):
            (out / f"{tag}-{i:02d}.json").write_text(rep.model_dump_json(indent=1))

if __name__ == "__main__":
    main()
