"""Predicted vs measured: run frontier plans on this machine and compare with the cost model.

    python bench/cost_model_accuracy.py                      # both models, one shot (~3 min on 2 cores)
    python bench/cost_model_accuracy.py --profile cpu.json   # priced with a DeviceProfile of this machine
    python bench/cost_model_accuracy.py --reports runs/      # also write every RunReport (for calibration)
    python bench/cost_model_accuracy.py --held-out           # docs/benchmarks.md: calibrate on one model, score another (3-5 min)

For gpt2-tiny and llama-tiny, searches the 'cpu' catalog device with 4 devices on one node (4
gloo processes here), fp32, global batch 8, then runs every frontier plan the executor can run
as planned and every baseline (data-parallel, FSDP, Megatron TP/SP, with and without
recomputation) for --steps steps in one torchrun launch, and prints per plan the predicted and
measured iteration time (median of the slowest rank over the timed steps) and peak memory per
device (max over ranks; CPU allocator events from the profiler), with the relative errors, then
the median absolute errors against the targets (time 10%, memory 5%).

--held-out measures what a calibrated profile is worth on plans it never saw. It profiles this
machine (or takes --profile), picks a CALIBRATION set - every runnable frontier plan and baseline
of --calibrate-on (gpt2-tiny) - and a HELD-OUT set - those of --held-out-model (llama-tiny) - and
runs both, interleaved, twice (the second round in reverse order, so that a load on the shared
host that comes and goes weighs on both sets alike; a plan's time is the median over both
rounds' timed steps, global batch 16). It fits the profile's calibration to the calibration
runs alone (profiler/calibrate.py, shared_compute: one compute factor for every op kind, a sync
cost per collective call, a framework cost per op, a memory overhead per rank; the overheads and
collective fits the profile measured are kept as measured), prices the held-out plans with the calibrated profile and
prints both tables, the timing noise (how far a plan's two rounds differ) and, last,
`held-out: median |time error| X%, median |memory error| Y% over N plans`. --write-accuracy also
writes those figures into search/prices/accuracy.json.

Without a profile the cost model prices this machine as the catalog's 'cpu' (a 32-core Xeon
socket's roofline and assumed links) while the ranks here share 2 cores: expect time errors of
orders of magnitude. Frontier plans the executor refuses are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from search import Errors, Predicted, RunReport, rel_error
from search.plans.api import SearchRequest, run_search
from search.plans.plan import Plan
from search.prices.cluster import format_size
from worker.analyze import Unsupported, analyze
from worker.launch import Progress, check_capacity, make_report, run_jobs
from worker.measure import spread
from worker.reference import reference_losses
from worker.spec import Job, RunSettings

TIME_TARGET, MEMORY_TARGET = 0.10, 0.05
ACCURACY = Path(__file__).resolve().parents[1] / "search" / "prices" / "accuracy.json"


def candidates(model: str, devices: int, per_node: int, batch: int, profile: dict | None, *, device: str = "cpu",
               precision: str = "fp32", seq_len: int | None = None, host: str = "cpu") -> tuple[list, list]:
    """(label, ExecSpec) of every runnable frontier plan and baseline, and (label, reason) refused;
    searched on the catalog `device`, run on this machine's `host` ('cpu' or 'cuda')."""
    fields: dict = dict(model=model, device=device, devices=devices, devices_per_node=per_node, global_batch=batch,
                        precision=precision)
    if seq_len is not None:
        fields["seq_len"] = seq_len
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
            check_capacity(spec, host)
        except Unsupported as e:
            refused.append((label, str(e)))
            continue
        runnable.append((label, spec))
    return runnable, refused


def pct(x: float | None) -> str:
    return f"{x * 100:+.0f}%" if x is not None else "-"


def run_set(labelled: list, steps: int, warmup: int, measure_memory: bool = True, device: str = "cpu"
            ) -> list[RunReport]:
    """Run (model, label, ExecSpec) triples in one torchrun launch on `device` ('cpu': gloo
    processes, 'cuda': one process per GPU on NCCL); a RunReport each."""
    settings = RunSettings(steps=steps, warmup=warmup, measure_memory=measure_memory, device=device)
    jobs = [Job(spec=spec, settings=settings) for _, _, spec in labelled]
    bar = Progress(jobs)
    started = datetime.now(UTC)
    try:
        raws = run_jobs(jobs, progress=bar, timeout=3600)
    finally:
        bar.close()
    finished = datetime.now(UTC)
    return [make_report(j, r, started, finished) for j, r in zip(jobs, raws, strict=True)]


def print_table(labelled: list, reports: list[RunReport]) -> tuple[list[float], list[float]]:
    """The per-plan table; the absolute time and memory errors."""
    print("| model | plan | from | time pred | time meas | spread | err | mem pred | mem meas | err |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    t_err, m_err = [], []
    for (model, label, spec), rep in zip(labelled, reports, strict=True):
        if rep.errors.time is not None:
            t_err.append(abs(rep.errors.time))
        if rep.errors.memory is not None:
            m_err.append(abs(rep.errors.memory))
        print(f"| {model} | {spec.summary.replace(' | ', '; ')} | {label} | {rep.predicted.time_s * 1e3:.1f} ms | "
              f"{rep.measured.time_s * 1e3:.1f} ms | {rep.measured.time_spread:.0%} | {pct(rep.errors.time)} | "
              f"{format_size(rep.predicted.memory_bytes)} | "
              f"{format_size(rep.measured.memory_bytes) if rep.measured.memory_bytes else '-'} | {pct(rep.errors.memory)} |")
    return t_err, m_err


def print_losses(labelled: list, reports: list[RunReport], steps: int, batch: int) -> None:
    """Every run must also have trained the model it claims to: its losses against one process's."""
    refs = {(m, s.seq_len): reference_losses(m, steps, batch, s.seq_len) for m, _, s in labelled}
    worst = max((max(abs(a - b) for a, b in zip(rep.losses, refs[(m, s.seq_len)], strict=True)), f"{m} {label}")
                for (m, label, s), rep in zip(labelled, reports, strict=True))
    print(f"losses: every run within {worst[0]:.1e} of the single-process run's ({steps} steps; worst: {worst[1]})")


def print_order(labelled: list, reports: list[RunReport]) -> None:
    """What a frontier is worth beyond each error: per model, how many of its frontier plans stay
    non-dominated when run (measured time and memory among the frontier plans run), and for
    every memory budget at a measured peak of a plan run, whether the plan the prediction picks
    (fastest predicted within the budget) fits when run and is the measured fastest that fits."""
    by_model: dict[str, list[tuple[str, RunReport]]] = {}
    for (model, label, _), rep in zip(labelled, reports, strict=True):
        if rep.measured.memory_bytes:
            by_model.setdefault(model, []).append((label, rep))
    for model, runs in by_model.items():
        meas = [(r.measured.time_s, float(r.measured.memory_bytes or 0)) for _, r in runs]
        pred = [(r.predicted.time_s, float(r.predicted.memory_bytes)) for _, r in runs]
        front = [i for i, (label, _) in enumerate(runs) if label.startswith("frontier")]
        kept = sum(1 for i in front if not any(
            meas[j][0] <= meas[i][0] and meas[j][1] <= meas[i][1] and meas[j] != meas[i] for j in front))
        fits = fastest = budgets = 0
        for budget in sorted({m for _, m in meas}):
            within = [i for i, (_, m) in enumerate(pred) if m <= budget]
            if not within:
                continue
            budgets += 1
            pick = min(within, key=lambda i: pred[i][0])
            fits += meas[pick][1] <= budget
            really = [i for i, (_, m) in enumerate(meas) if m <= budget]
            fastest += pick == min(really, key=lambda i: meas[i][0])
        print(f"order ({model}): {kept} of {len(front)} frontier plans non-dominated when run; at {budgets} budgets "
              f"(each plan's measured peak), the predicted pick fits in {fits} and is the measured fastest that fits "
              f"in {fastest}")


def print_refused(refused_all: list) -> None:
    if not refused_all:
        return
    print(f"\n{len(refused_all)} plans refused by the executor (cannot run as planned):")
    ops = Counter(m.group(1) if (m := re.search(r"op '([^']+)'", why)) else why.split(":")[0]
                  for _, _, why in refused_all)
    for model, label, why in refused_all[:6]:
        print(f"  {model} {label}: {why}")
    if len(refused_all) > 6:
        print(f"  ... and {len(refused_all) - 6} more; the op named first: "
              + ", ".join(f"{op} ({n}x)" for op, n in ops.most_common(4)))


def collect(models: list[str], args: argparse.Namespace, profile: dict | None) -> tuple[list, list]:
    labelled, refused_all = [], []
    for model in models:
        runnable, refused = candidates(model, args.devices, args.devices_per_node, args.global_batch, profile)
        labelled += [(model, label, spec) for label, spec in runnable]
        refused_all += [(model, label, why) for label, why in refused]
    return labelled[: args.max_plans], refused_all


def machine() -> str:
    from profiler.run import _cpu_name

    return f"{os.cpu_count()} cores, {_cpu_name()}, {platform.system()} {platform.release()}"


def profile_machine(models: list[str], args: argparse.Namespace):
    """A DeviceProfile of this machine covering every model's op signatures (one profiling run
    per model, each on top of the last)."""
    from profiler.run import run_profile

    prof = None
    for model in models:
        prof, summary = run_profile(model, args.devices, devices_per_node=args.devices_per_node,
                                    global_batch=args.global_batch, precision="fp32", base=prof, progress=False)
        print(f"profiled {model}: {summary.line()}")
    return prof


def merge_rounds(first: RunReport, second: RunReport, time_s: float, memory_bytes: float) -> RunReport:
    """One report of a plan run twice: the median over both rounds' timed steps, the higher peak
    memory, and the errors against the prediction given (time_s, memory_bytes)."""
    n = len(first.measured.step_times_s)
    steps = first.measured.step_times_s + second.measured.step_times_s
    timed = first.measured.timed_steps + [n + i for i in second.measured.timed_steps]
    times = [steps[i] for i in timed]
    mems = [m for m in (first.measured.memory_bytes, second.measured.memory_bytes) if m is not None]
    measured = first.measured.model_copy(update={
        "time_s": statistics.median(times), "time_spread": spread(times), "step_times_s": steps,
        "timed_steps": timed, "memory_bytes": max(mems) if mems else None})
    predicted = Predicted(time_s=time_s, memory_bytes=int(round(memory_bytes)))
    errors = Errors(time=rel_error(measured.time_s, predicted.time_s),
                    memory=rel_error(measured.memory_bytes, predicted.memory_bytes))
    plan = {**first.plan, "predicted": {**first.plan["predicted"], **predicted.model_dump()}}
    merged = first.model_copy(update={"measured": measured, "predicted": predicted, "errors": errors, "plan": plan,
                                      "steps": first.steps + second.steps, "losses": first.losses + second.losses,
                                      "finished": second.finished})
    return RunReport.model_validate(merged.model_dump())


def held_out(args: argparse.Namespace) -> None:
    """Calibrate on one model's runs, score on another's (see the module docstring). Both sets run
    interleaved, twice (the second round in reverse order), so that a load on the host that
    comes and goes weighs on both sets alike; a plan's time is the median over both rounds'
    timed steps."""
    from profiler.calibrate import calibrate, price_plan
    from search.prices.profile import load_profile

    start = time.perf_counter()
    models = [args.calibrate_on, args.held_out_model]
    if args.calibrate_on == args.held_out_model:
        raise SystemExit("--calibrate-on and --held-out-model must differ")
    prof = load_profile(args.profile) if args.profile else profile_machine(models, args)
    assert prof is not None
    prof = prof.model_copy(update={"calibration": None})  # calibrated here, from this run's set alone
    if args.save_profile:
        prof.dump(args.save_profile)
    as_json = prof.model_dump(mode="json")
    calib, refused_c = collect([args.calibrate_on], args, as_json)
    held, refused_h = collect([args.held_out_model], args, as_json)
    both = calib + held
    order = [i for pair in zip(range(len(calib)), range(len(calib), len(both)), strict=False) for i in pair]
    order += [i for i in range(len(both)) if i not in order]
    per_round = args.steps // 2
    rounds: list[dict[int, RunReport]] = []
    for seq in (order, order[::-1]):
        # memory in both rounds (the step profiled is left out of the timed ones): on gloo a
        # tensor-parallel step's peak moves with when async collectives release their buffers,
        # and a user's OOM comes from the higher of the two
        reps = run_set([both[i] for i in seq], per_round, args.warmup)
        rounds.append(dict(zip(seq, reps, strict=True)))
    gaps = [abs(rounds[0][i].measured.time_s - rounds[1][i].measured.time_s)
            / ((rounds[0][i].measured.time_s + rounds[1][i].measured.time_s) / 2) for i in range(len(both))]

    c_reports = [merge_rounds(rounds[0][i], rounds[1][i], rounds[0][i].predicted.time_s,
                              rounds[0][i].predicted.memory_bytes) for i in range(len(calib))]
    print(f"\n{args.devices} gloo processes on this machine ({machine()}), fp32, global batch {args.global_batch}; "
          f"every plan run twice ({per_round} steps, {args.warmup} warm-up, each round), both sets interleaved")
    print(f"\nCALIBRATION set: {len(calib)} plans of {args.calibrate_on}, predicted from the uncalibrated profile")
    print_table(calib, c_reports)
    res = calibrate(c_reports, prof, shared_compute=True)
    cal = res.profile.calibration
    assert cal is not None
    print(res.line())
    print(f"calibration: compute factor {cal.compute.get('*', 1.0):.3g} (beyond the profile's contention "
          f"{prof.host.threads * args.devices_per_node / max(prof.host.cpu_count, 1):.3g}), sync "
          f"{cal.sync_s * 1e3:.2f} ms per collective waited on, {cal.op_s * 1e3:.3f} ms per op, memory overhead "
          f"{format_size(cal.memory_overhead_bytes)}")

    h_reports = []
    for i in range(len(calib), len(both)):
        t, m = price_plan(both[i][2].plan, res.profile)
        h_reports.append(merge_rounds(rounds[0][i], rounds[1][i], t, m))
    print(f"\nHELD-OUT set: {len(held)} plans of {args.held_out_model} (its frontier and baselines), predicted with "
          f"the calibrated profile; no run of this model was used to calibrate")
    t_err, m_err = print_table(held, h_reports)
    print()
    print_losses(both, [rounds[0][i] for i in range(len(both))], per_round, args.global_batch)
    print_order(calib + held, c_reports + h_reports)
    print(f"timing noise: the two rounds' medians of a plan differ by {statistics.median(gaps):.0%} (median over "
          f"{len(gaps)} plans; max {max(gaps):.0%})")
    print_refused(refused_c + refused_h)
    if args.reports:
        out = Path(args.reports)
        out.mkdir(parents=True, exist_ok=True)
        for i, rep in enumerate(c_reports + h_reports):
            (out / f"run-{i:02d}.json").write_text(rep.model_dump_json(indent=1))
        res.profile.dump(out / "calibrated-profile.json")
    x, y, n = statistics.median(t_err), statistics.median(m_err), len(h_reports)
    if args.write_accuracy:
        kept = json.loads(ACCURACY.read_text()).get("catalog") if ACCURACY.exists() else None
        ACCURACY.write_text(json.dumps({
            "catalog": kept or {"time": None, "memory": None, "source": "not measured"},  # bench/published.py's
            "profile": {"time": round(x, 4), "memory": round(y, 4), "plans": n, "machine": machine(),
                        "command": "python bench/cost_model_accuracy.py --held-out",
                        "date": datetime.now(UTC).date().isoformat()}}, indent=1) + "\n")
        print(f"wrote {ACCURACY}")
    print(f"(ran {time.perf_counter() - start:.0f} s; targets: time {TIME_TARGET:.0%}, memory {MEMORY_TARGET:.0%})")
    print(f"held-out: median |time error| {x * 100:.1f}%, median |memory error| {y * 100:.1f}% over {n} plans")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt2-tiny,llama-tiny")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--devices-per-node", type=int, default=4, help="all processes share this machine (default 4)")
    ap.add_argument("--global-batch", type=int, default=None, help="default 8 (--held-out: 16)")
    ap.add_argument("--steps", type=int, default=None, help="default 20 (--held-out: 40, in two rounds of 20)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", help="a DeviceProfile JSON of this machine to price with")
    ap.add_argument("--reports", help="folder to write every RunReport JSON into")
    ap.add_argument("--max-plans", type=int, default=40)
    ap.add_argument("--held-out", action="store_true", help="calibrate on one model's runs, score on another's")
    ap.add_argument("--calibrate-on", default="gpt2-tiny", help="--held-out: the model whose runs calibrate")
    ap.add_argument("--held-out-model", default="llama-tiny", help="--held-out: the model scored")
    ap.add_argument("--write-accuracy", action="store_true", help="--held-out: write search/prices/accuracy.json")
    ap.add_argument("--save-profile", help="--held-out: write the (uncalibrated) profile used to this file")
    args = ap.parse_args()
    if args.held_out:
        args.global_batch = args.global_batch or 16
        args.steps = args.steps or 40  # two rounds of 20
        held_out(args)
        return
    args.global_batch = args.global_batch or 8
    args.steps = args.steps or 20
    profile = json.loads(Path(args.profile).read_text()) if args.profile else None
    labelled, refused_all = collect(args.models.split(","), args, profile)
    reports = run_set(labelled, args.steps, args.warmup)
    if args.reports:
        out = Path(args.reports)
        out.mkdir(parents=True, exist_ok=True)
        for i, rep in enumerate(reports):
            (out / f"run-{i:02d}.json").write_text(rep.model_dump_json(indent=1))

    priced = "a DeviceProfile" if profile else "the 'cpu' catalog roofline"
    print(f"{args.devices} gloo processes on this machine, fp32, global batch {args.global_batch}, "
          f"{args.steps} steps ({args.warmup} warm-up); predictions from {priced}")
    t_err, m_err = print_table(labelled, reports)
    print()
    print_losses(labelled, reports, args.steps, args.global_batch)
    print_order(labelled, reports)
    if t_err:
        print(f"median |time error| {statistics.median(t_err) * 100:.0f}% (target {TIME_TARGET:.0%}), "
              f"median |memory error| {statistics.median(m_err) * 100:.0f}% (target {MEMORY_TARGET:.0%}) "
              f"over {len(reports)} plans")
    print_refused(refused_all)


if __name__ == "__main__":
    main()
