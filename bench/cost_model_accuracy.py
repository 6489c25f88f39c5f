"""Predicted vs measured: run frontier plans on this machine and compare with the cost model.

    python bench/cost_model_accuracy.py                      # the table in README.md (~3 min on 2 cores)
    python bench/cost_model_accuracy.py --profile cpu.json   # priced with a DeviceProfile of this machine
    python bench/cost_model_accuracy.py --reports runs/      # also write every RunReport (for calibration)

For gpt2-tiny and llama-tiny, searches the 'cpu' catalog device with 4 devices on one node (4
gloo processes here), fp32, global batch 8, then runs every frontier plan the executor can run
as planned and every baseline (data-parallel, FSDP, Megatron TP/SP, with and without
recomputation) for --steps steps in one torchrun launch, and prints per plan the predicted and
measured iteration time (median of the slowest rank over the timed steps) and peak memory per
device (max over ranks; CPU allocator events from the profiler), with the relative errors, then
the median absolute errors against the targets (time 10%, memory 5%).

Without a profile the cost model prices this machine as the catalog's 'cpu' (a 32-core Xeon
socket's roofline and assumed links) while the ranks here share 2 cores: expect time errors of
orders of magnitude. Frontier plans the executor refuses are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from search.prices.cluster import format_size
from worker.analyze import Unsupported, analyze
from worker.launch import Progress, check_capacity, make_report, run_jobs
from worker.reference import reference_losses
from worker.spec import Job, RunSettings

TIME_TARGET, MEMORY_TARGET = 0.10, 0.05


def candidates(model: str, devices: int, per_node: int, batch: int, profile: dict | None) -> tuple[list, list]:
    """(label, Plan) of every runnable frontier plan and baseline, and (label, reason) refused."""
    fields = dict(model=model, device="cpu", devices=devices, devices_per_node=per_node, global_batch=batch,
                  precision="fp32")
    if profile is not None:
        fields["profile"] = profile
    o = run_search(SearchRequest(**fields))
    entries = [(f"frontier #{i}", p) for i, p in enumerate(o.plans)]
    entries += [(b.name, Plan.model_validate(b.plan)) for b in o.report.baselines]
    runnable, refused, seen = [], [], set()
    for label, plan in entries:
        key = plan.model_dump_json(include={"mesh", "ops", "blocks", "zero_stage", "recompute", "pipeline"})
        if key in seen:
            continue
        seen.add(key)
        try:
            spec = analyze(plan)
            check_capacity(spec, "cpu")
        except Unsupported as e:
            refused.append((label, str(e)))
            continue
        runnable.append((label, spec))
    return runnable, refused


def pct(x: float | None) -> str:
    return f"{x * 100:+.0f}%" if x is not None else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-tiny,llama-tiny")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--devices-per-node", type=int, default=4, help="all processes share this machine (default 4)")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", help="a DeviceProfile JSON of this machine to price with")
    ap.add_argument("--reports", help="folder to write every RunReport JSON into")
    ap.add_argument("--max-plans", type=int, default=40)
    args = ap.parse_args()
    profile = json.loads(Path(args.profile).read_text()) if args.profile else None

    labelled, refused_all = [], []
    for model in args.models.split(","):
        runnable, refused = candidates(model, args.devices, args.devices_per_node, args.global_batch, profile)
        labelled += [(model, label, spec) for label, spec in runnable]
        refused_all += [(model, label, why) for label, why in refused]
    labelled = labelled[: args.max_plans]
    settings = RunSettings(steps=args.steps, warmup=args.warmup)
    jobs = [Job(spec=spec, settings=settings) for _, _, spec in labelled]
    bar = Progress(jobs)
    started = datetime.now(UTC)
    try:
        raws = run_jobs(jobs, progress=bar, timeout=3600)
    finally:
        bar.close()
    finished = datetime.now(UTC)
    reports = [make_report(j, r, started, finished) for j, r in zip(jobs, raws, strict=True)]
    if args.reports:
        out = Path(args.reports)
        out.mkdir(parents=True, exist_ok=True)
        for i, rep in enumerate(reports):
            (out / f"run-{i:02d}.json").write_text(rep.model_dump_json(indent=1))

    priced = "a DeviceProfile" if profile else "the 'cpu' catalog roofline"
    print(f"{args.devices} gloo processes on this machine, fp32, global batch {args.global_batch}, "
          f"{args.steps} steps ({args.warmup} warm-up); predictions from {priced}")
    print("| model | plan | from | time pred | time meas | err | mem pred | mem meas | err |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    t_err, m_err = [], []
    for (model, label, spec), rep in zip(labelled, reports, strict=True):
        t_err.append(abs(rep.errors.time)) if rep.errors.time is not None else None
        m_err.append(abs(rep.errors.memory)) if rep.errors.memory is not None else None
        print(f"| {model} | {spec.summary.replace(' | ', '; ')} | {label} | {rep.predicted.time_s * 1e3:.3f} ms | "
              f"{rep.measured.time_s * 1e3:.1f} ms | {pct(rep.errors.time)} | {format_size(rep.predicted.memory_bytes)} | "
              f"{format_size(rep.measured.memory_bytes) if rep.measured.memory_bytes else '-'} | {pct(rep.errors.memory)} |")
    # every run must also have trained the model it claims to: its losses against one process's
    refs = {(m, s.seq_len): reference_losses(m, args.steps, args.global_batch, s.seq_len) for m, _, s in labelled}
    worst = max((max(abs(a - b) for a, b in zip(rep.losses, refs[(m, s.seq_len)], strict=True)), f"{m} {label}")
                for (m, label, s), rep in zip(labelled, reports, strict=True))
    print(f"\nlosses: every run within {worst[0]:.1e} of the single-process run's ({args.steps} steps; worst: {worst[1]})")
    if t_err:
        print(f"median |time error| {statistics.median(t_err) * 100:.0f}% (target {TIME_TARGET:.0%}), "
              f"median |memory error| {statistics.median(m_err) * 100:.0f}% (target {MEMORY_TARGET:.0%}) "
              f"over {len(reports)} plans")
    if refused_all:
        print(f"\n{len(refused_all)} plans refused by the executor (cannot run as planned):")
        ops = Counter(m.group(1) if (m := re.search(r"op '([^']+)'", why)) else why.split(":")[0]
                      for _, _, why in refused_all)
        for model, label, why in refused_all[:6]:
            print(f"  {model} {label}: {why}")
        if len(refused_all) > 6:
            print(f"  ... and {len(refused_all) - 6} more; the op named first: "
                  + ", ".join(f"{op} ({n}x)" for op, n in ops.most_common(4)))


if __name__ == "__main__":
    main()
