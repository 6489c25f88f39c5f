"""Launch plans with torchrun (``python -m torch.distributed.run --standalone``) and collect the
RunReports: gloo on CPU processes when there is no GPU, NCCL on CUDA devices when there are.

Before anything starts, a plan this machine cannot host is refused (`check_capacity`): more
processes than it can reasonably run, more memory than it has. While it runs, rank 0's progress
lines drive a tqdm bar (step, loss, step time). A rank that raises ends the run: torchrun stops the
other ranks, and `RunFailed` carries the first failing rank's error. torchrun and everything it
started run in their own session, which is killed on any way out (error, timeout, Ctrl-C) and
checked to be empty afterwards, so no process outlives the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from search import Errors, Measured, NodeRecord, Plan, Predicted, RankMeasure, RunReport, Segment, format_size, rel_error
from search.plans.capacity import cpu_host_blocker, cuda_devices
from worker import measure
from worker.analyze import Unsupported, analyze, model_spec
from worker.lifeline import die_with_parent
from worker.memwatch import ENV, MemoryWatch, run_memory_limit
from worker.nodes import COLLECTIVE_TIMEOUT_ENV, Rendezvous
from worker.spec import PROGRESS, ExecSpec, Job, RunSettings


class RunFailed(RuntimeError):
    """A rank failed (or the run timed out); the message names the rank and its error.
    `died`: no rank raised an error of its own: one was killed (a signal, the OOM killer, its
    host lost), the fault a restart from the last checkpoint answers; an error a rank raised would
    only be raised again."""

    def __init__(self, message: str, rank: int | None = None, log: str = "", died: bool = False) -> None:
        super().__init__(message)
        self.rank = rank
        self.log = log
        self.died = died


# ---- before launch ----------------------------------------------------------------------------
def check_capacity(spec: ExecSpec, device: str, max_procs: int | None = None, nodes: int = 1) -> None:
    """Refuse (Unsupported) a plan this machine cannot host, before anything is started; `nodes`:
    this machine is one node of that many and hosts num_devices / nodes of the processes."""
    n = spec.num_devices // max(nodes, 1)
    need = spec.predicted_memory_bytes
    if device == "cuda":
        import torch

        have = cuda_devices()
        if n > have:
            raise Unsupported(f"plan needs {n} GPUs, this machine has {have}")
        total = torch.cuda.get_device_properties(0).total_memory
        if need > total:
            raise Unsupported(f"plan needs {format_size(need)} per GPU (predicted), the GPU has {format_size(total)}")
        return
    blocker = cpu_host_blocker(n, need, model_spec(spec.model, spec.source).param_count(), max_procs)
    if blocker is not None:
        raise Unsupported(blocker)


# ---- running torchrun -------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command may contain spaces and ')'
            out.setdefault(ppid, []).append(int(d.name))
    return out


def _tree(pid: int) -> set[int]:
    """`pid` and all its descendants. torchrun starts each rank in a session of its own, so the
    ranks are found by parentage, not by session or process group."""
    kids = _children()
    seen, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(kids.get(p, []))
    return seen


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie is dead: it only waits to be reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_session(proc: subprocess.Popen, known: set[int], grace: float = 5.0) -> None:
    """SIGTERM torchrun and every process it started (torchrun stops its ranks on SIGTERM),
    SIGKILL whatever is left after `grace` seconds, and reap torchrun. `known` holds ranks seen
    earlier, in case torchrun is already gone and they were re-parented."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = {p for p in (known | (_tree(proc.pid) if proc.poll() is None else set())) if _alive(p)}
        if proc.poll() is not None:
            pids.discard(proc.pid)
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) and not (p == proc.pid and proc.poll() is not None)
                                                  for p in pids):
            time.sleep(0.05)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# what the ranks around a dead one raise: the collective they were in lost its peer
COLLATERAL_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError")
COLLATERAL_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo", "NCCL",
                    "ProcessGroup", "Socket Timeout", "timed out")


def _collateral(error: dict) -> bool:
    return error.get("type") in COLLATERAL_TYPES or any(w in error.get("message", "") for w in COLLATERAL_WORDS)


def _first_error(out: Path) -> dict | None:
    """The error of the first rank that raised one of its own; when every error is a lost peer's
    (or none was written), the first of those marked `collateral` (a rank died)."""
    errors: list[dict[str, Any]] = []
    for p in out.glob("error-rank*.json"):
        try:
            errors.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not errors:
        return None
    # the first rank to fail is the cause; the others typically fail on its closed connections
    def when(e: dict[str, Any]) -> float:
        return float(e.get("time", 0.0))

    own = [e for e in errors if not _collateral(e)]
    if own:
        return min(own, key=when)
    first: dict[str, Any] = min(errors, key=when)
    return first | {"collateral": True}


def _death(log_text: str) -> str:
    """What torchrun's failure summary says killed a rank ('rank 1: Signal 9 (SIGKILL)'), or ''.
    Its "Root Cause (first observed failure)" section names the rank that died first; the other
    failures it lists are the ranks it stopped afterwards."""
    import re

    root = log_text.rpartition("Root Cause")[2] if "Root Cause" in log_text else log_text
    m = re.search(r"rank\s*:\s*(\d+)[^\n]*\n(?:[^\n]*\n){0,4}?[^\n]*(Signal \d+ \(\w+\))", root)
    return f"rank {m.group(1)}: {m.group(2)}" if m else ""


def _die_with_parent() -> None:
    """In torchrun's process, before it runs: SIGTERM when the launcher dies (a worker killed by
    SIGKILL must not leave its ranks training on; torchrun stops them on SIGTERM)."""
    die_with_parent(signal.SIGTERM)


def run_jobs(jobs: list[Job], *, workdir: str | Path | None = None, progress: Callable[[dict], None] | None = None,
             timeout: float | None = None, keep: bool = False, rendezvous: Rendezvous | None = None,
             abort: threading.Event | None = None) -> list[dict[str, Any]]:
    """Run jobs (all with the same number of processes) in one torchrun; the raw result per job.
    `rendezvous`: this machine is one node of several (worker.nodes): torchrun's multi-node agent
    runs this node's share of the processes, and the result holds this node's ranks. `abort`:
    when set, torchrun is stopped (another node of the run failed)."""
    if not jobs:
        return []
    n = jobs[0].spec.num_devices
    if any(j.spec.num_devices != n for j in jobs):
        raise ValueError("jobs sharing one launch must use the same number of processes")
    if rendezvous is not None and rendezvous.nnodes * rendezvous.nproc_per_node != n:
        raise ValueError(f"{rendezvous.nnodes} nodes of {rendezvous.nproc_per_node} processes do not make the "
                         f"plan's {n}")
    device = jobs[0].settings.device
    tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="paretoplan-run-"))
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out"
    jobs_path = tmp / "jobs.json"
    jobs_path.write_text(json.dumps([j.model_dump(mode="json") for j in jobs]))
    log_path = tmp / "torchrun.log"
    where = ["--standalone", f"--nproc-per-node={n}"] if rendezvous is None else rendezvous.torchrun_args()
    cmd = [sys.executable, "-m", "torch.distributed.run", *where,
           "--max-restarts=0", "--monitor-interval=0.2", "-m", "worker.executor",
           "--jobs", str(jobs_path), "--out", str(out)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHELASTIC_ERROR_FILE=str(tmp / "torchelastic-error.json"))
    if rendezvous is not None:
        env[COLLECTIVE_TIMEOUT_ENV] = str(rendezvous.timeout_s)
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # n ranks on a few cores: threads would only contend
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([repo, *filter(None, [env.get("PYTHONPATH")])])
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent)
        known: set[int] = set()  # the ranks, remembered while torchrun is their parent
        seen_at = 0.0
        aborted = _stop_on(abort, proc)
        memory_limit = run_memory_limit()
        watch = MemoryWatch(proc.pid, memory_limit, _tree) if memory_limit is not None else None
        try:
            start = time.monotonic()
            assert proc.stdout is not None
            for line in proc.stdout:
                if time.monotonic() - seen_at > 2.0 and proc.poll() is None:
                    known |= _tree(proc.pid) - {proc.pid}
                    seen_at = time.monotonic()
                if line.startswith(PROGRESS):
                    if progress:
                        progress(json.loads(line[len(PROGRESS):]))
                else:
                    log.write(line)
                if timeout is not None and time.monotonic() - start > timeout:
                    raise RunFailed(f"run exceeded its time limit of {timeout:.0f} s", log=str(log_path))
            rc = proc.wait(timeout=None if timeout is None else max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            raise RunFailed(f"run exceeded its time limit of {timeout:.0f} s", log=str(log_path)) from None
        finally:
            if watch is not None:
                watch.stop()
            _kill_session(proc, known)
    if watch is not None and watch.exceeded is not None:
        raise RunFailed(f"run exceeded its memory limit of {format_size(watch.limit)} ({ENV}): torchrun and its "
                        f"ranks held {format_size(watch.exceeded)}", log=str(log_path))
    if rc != 0 and aborted.is_set():
        raise RunFailed("stopped: another node failed", log=str(log_path))
    if rc != 0:
        err = _first_error(out)
        log_text = log_path.read_text(errors="replace")
        if err is not None and not err.get("collateral"):
            raise RunFailed(f"rank {err['rank']} failed: {err['type']}: {err['message'].strip()}",
                            rank=err["rank"], log=str(log_path))
        if rc < 0:  # torchrun itself was killed: its ranks die with it (worker.executor.die_with_agent)
            raise RunFailed(f"torchrun was killed ({signal.Signals(-rc).name}); its ranks died with it",
                            log=str(log_path), died=True)
        death = _death(log_text)
        if death:
            raise RunFailed(f"a rank died ({death}); the others lost it", log=str(log_path), died=True)
        if err is not None:
            raise RunFailed(f"rank {err['rank']} lost its peers ({err['type']}: {err['message'].strip()[:300]}); "
                            f"a rank died without reporting an error", rank=err["rank"], log=str(log_path), died=True)
        raise RunFailed(f"torchrun exited with code {rc} before any rank reported an error:\n{log_text[-2000:]}",
                        log=str(log_path), died=True)
    results = [json.loads((out / str(i) / "result.json").read_text()) for i in range(len(jobs))]
    if rendezvous is None:  # one node: its record says nothing the report needs
        results = [{k: v for k, v in r.items() if k != "nodes"} for r in results]
    if not keep and workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _stop_on(abort: threading.Event | None, proc: subprocess.Popen) -> threading.Event:
    """SIGTERM torchrun when `abort` is set (it then stops its ranks); the event returned is set
    when that happened."""
    fired = threading.Event()
    if abort is None:
        return fired

    def watch() -> None:
        while proc.poll() is None:
            if abort.wait(0.2):
                if proc.poll() is None:
                    fired.set()
                    proc.send_signal(signal.SIGTERM)
                return

    threading.Thread(target=watch, daemon=True, name="stop-on-abort").start()
    return fired


# ---- reports ----------------------------------------------------------------------------------
def measured_of(job: Job, raw: dict[str, Any]) -> Measured:
    """What one launch measured; its steps are numbered in the run (from the launch's first step)."""
    st = job.settings
    ranks = raw["ranks"]
    first = raw.get("first_step", 0)
    n = len(ranks[0]["times"])
    timed = ranks[0]["timed"]
    per_step = [max(r["times"][s] for r in ranks) for s in range(n)]
    timed_times = [per_step[s] for s in timed]
    mems = [r["memory_bytes"] for r in ranks if r["memory_bytes"] is not None]
    return Measured(
        time_s=measure.median(timed_times), time_spread=measure.spread(timed_times),
        memory_bytes=max(mems) if mems else None,
        memory_method="cuda_max_allocated" if st.device == "cuda" else (
            "memtracker" if st.memory_method == "memtracker" and job.spec.pipeline.stages == 1 else "profiler"),
        timed_steps=[first + s for s in timed], step_times_s=per_step,
        per_rank=[RankMeasure(rank=r["rank"], coord=r["coord"], time_s=r["time_s"], memory_bytes=r["memory_bytes"])
                  for r in ranks])


def make_report(job: Job, raw: dict[str, Any], started: datetime, finished: datetime, *,
                losses: list[float] | None = None, step_times_s: list[float] | None = None,
                segments: list[Segment] | None = None, restarts: int = 0) -> RunReport:
    """The RunReport of a run whose last launch was `job` (its figures are that launch's); `losses`
    and `step_times_s` of every step when the run had several launches."""
    spec, st = job.spec, job.settings
    measured = measured_of(job, raw)
    if step_times_s is not None:
        measured = measured.model_copy(update={"step_times_s": step_times_s})
    predicted = Predicted(time_s=spec.predicted_time_s, memory_bytes=spec.predicted_memory_bytes)
    if st.device == "cuda":
        import torch

        device = f"{torch.cuda.get_device_name(0)} x {spec.num_devices}"
    else:
        device = f"cpu ({spec.num_devices} processes on {os.cpu_count()} cores)"
    if len(raw.get("nodes", [])) > 1:
        device += f" on {len(raw['nodes'])} nodes"
    return RunReport(
        model=spec.model, plan_summary=spec.summary, num_devices=spec.num_devices, device=device,
        backend="nccl" if st.device == "cuda" else "gloo", mesh={d.name: d.size for d in spec.mesh},
        steps=st.steps, seed=st.seed, losses=raw["losses"] if losses is None else losses, predicted=predicted,
        measured=measured,
        errors=Errors(time=rel_error(measured.time_s, predicted.time_s),
                      memory=rel_error(measured.memory_bytes, predicted.memory_bytes)),
        notes=spec.notes, comm=raw["ranks"][0].get("comm") or {}, plan=spec.plan, started=started, finished=finished,
        segments=segments or [], restarts=restarts,
        nodes=[NodeRecord.model_validate(n) for n in raw.get("nodes", [])])


class Progress:
    """A tqdm bar over all steps of all jobs: step, loss, step time."""

    def __init__(self, jobs: list[Job], enabled: bool = True, resumable: bool = False) -> None:
        """`resumable`: one job whose launches may resume at an earlier step (the bar follows the step)."""
        from tqdm import tqdm

        self.resumable = resumable
        self.bar = tqdm(total=sum(j.settings.steps for j in jobs), unit="step", disable=not enabled,
                        file=sys.stderr, dynamic_ncols=True)

    def __call__(self, msg: dict) -> None:
        if "summary" in msg:
            self.bar.set_description(f"plan {msg['job'] + 1}/{msg['jobs']}")
        elif "step" in msg:
            self.bar.update(msg["step"] + 1 - self.bar.n if self.resumable else 1)
            self.bar.set_postfix(step=f"{msg['step'] + 1}/{msg['steps']}", loss=f"{msg['loss']:.4f}",
                                 step_ms=f"{msg['time_s'] * 1e3:.1f}")

    def close(self) -> None:
        self.bar.close()


def run_plans(plans: list[Plan], settings: RunSettings, *, show_progress: bool = True, max_procs: int | None = None,
              timeout: float | None = None) -> list[RunReport]:
    """Analyze, check and launch plans (one torchrun per process count); a RunReport each."""
    jobs = []
    for plan in plans:
        spec = analyze(plan)
        check_capacity(spec, settings.device, max_procs)
        jobs.append(Job(spec=spec, settings=settings))
    reports: list[RunReport | None] = [None] * len(jobs)
    for n in sorted({j.spec.num_devices for j in jobs}):
        idx = [i for i, j in enumerate(jobs) if j.spec.num_devices == n]
        group = [jobs[i] for i in idx]
        bar = Progress(group, enabled=show_progress)
        started = datetime.now(UTC)
        try:
            raws = run_jobs(group, progress=bar, timeout=timeout)
        finally:
            bar.close()
        finished = datetime.now(UTC)
        for i, job, raw in zip(idx, group, raws, strict=True):
            reports[i] = make_report(job, raw, started, finished)
    return [r for r in reports if r is not None]


def default_device() -> str:
    return "cuda" if cuda_devices() else "cpu"


def _pct(x: float | None) -> str:
    return f"{x * 100:+.0f}%" if x is not None else "-"


def format_table(report: RunReport) -> str:
    """Predicted vs measured iteration time and peak memory per rank, with the relative errors."""
    p = report.predicted
    lines = [f"{report.plan_summary}",
             f"{'rank':>6} {'mesh':<16} {'time pred':>10} {'time meas':>10} {'err':>6} "
             f"{'mem pred':>10} {'mem meas':>10} {'err':>6}"]
    for r in report.measured.per_rank:
        coord = " ".join(f"{k}{v}" for k, v in r.coord.items()) or "-"
        lines.append(f"{r.rank:>6} {coord:<16} {p.time_s * 1e3:>7.2f} ms {r.time_s * 1e3:>7.2f} ms "
                     f"{_pct(rel_error(r.time_s, p.time_s)):>6} {format_size(p.memory_bytes):>10} "
                     f"{format_size(r.memory_bytes) if r.memory_bytes is not None else '-':>10} "
                     f"{_pct(rel_error(r.memory_bytes, p.memory_bytes)):>6}")
    m = report.measured
    lines.append(f"{'all':>6} {'':<16} {p.time_s * 1e3:>7.2f} ms {m.time_s * 1e3:>7.2f} ms {_pct(report.errors.time):>6} "
                 f"{format_size(p.memory_bytes):>10} "
                 f"{format_size(m.memory_bytes) if m.memory_bytes is not None else '-':>10} "
                 f"{_pct(report.errors.memory):>6}")
    lines.append(f"time: median of {len(m.timed_steps)} timed steps (slowest rank), spread {m.time_spread:.0%}; "
                 f"memory: peak per rank ({m.memory_method}); loss {report.losses[0]:.4f} -> {report.losses[-1]:.4f}")
    return "\n".join(lines)
