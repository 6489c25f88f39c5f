"""A run as a sequence of launches (segments): train, stop at a step boundary, save, re-plan,
relaunch torchrun with the new world size, load resharded, go on from the same step.

One launch is `worker.launch.run_jobs` (torchrun, one job), or with `Elastic.nodes` one torchrun
agent per node (`worker.nodes.run_local_nodes`); the ranks save and load with
`worker.checkpoint`. Between launches this module decides what comes next:

- a **resize**, scripted (`Elastic.resizes`: step -> devices, as `paretoplan run --resize`) or
  ordered while the run trains (`Control.resize`, from the service through its worker): the
  launch stops after the step at hand and saves; the new plan is the order's, or `replan(devices)`
  (the job's pick rule on the frontier for that many devices); the next launch loads the
  checkpoint into the new layout. A resize no plan can serve (none fits, this host cannot run
  it) is refused with a note, and the run goes on in its layout.
- a **restart** when a rank died (killed, not an error it raised: `RunFailed.died`): from the
  last complete checkpoint in the run directory (or step 0 without one), on the devices that
  remain (`Elastic.available`; re-planned if fewer), at most `max_restarts` times.
- a **stop** (`Control.stop`, SIGTERM to the launcher): the launch saves and `RunStopped` names the
  checkpoint a later `run_plan(..., Elastic(resume=...))` goes on from.

Each checkpoint carries the launcher's history (the segments so far, the one running), so a run
resumed by another process (a worker that claimed the run after the first one died) knows what
came before. The report: one loss per step, the segments with what each resize took (save,
re-plan, restart, load), and the last segment's plan and measured figures.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from search import InputError, NoFeasiblePlan, Plan, Predicted, ResizeTimes, RunReport, Segment
from search.plans.capacity import cuda_devices
from worker import checkpoint
from worker.analyze import Unsupported, analyze
from worker.launch import Progress, RunFailed, check_capacity, make_report, measured_of, run_jobs
from worker.nodes import Rendezvous, check_nodes, run_local_nodes
from worker.spec import CheckpointSettings, ExecSpec, Job, RunSettings

Replan = Callable[[int], Plan]  # devices -> the plan to run on that many (NoFeasiblePlan / InputError if none)


@dataclass(frozen=True)
class Order:
    """A resize asked for while the run trains: the device count, and the plan when the asker
    has picked it already (the service, from a stored frontier); `id` names it to its asker."""

    devices: int
    plan: Plan | None = None
    id: int | None = None


class RunStopped(Exception):
    """The run stopped when asked (SIGTERM) after saving: resume from `checkpoint`."""

    def __init__(self, step: int, checkpoint: str) -> None:
        super().__init__(f"stopped before step {step}; checkpoint saved at {checkpoint}")
        self.step = step
        self.checkpoint = checkpoint


class Control:
    """How a run is steered from outside while it trains. `resize` and `stop` may be called from
    any thread and from a signal handler (a re-entrant lock: the handler runs on the main thread,
    which may hold it); the launch in progress sees them at its next step boundary (its stop file)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._order: Order | None = None
        self._stop: str | None = None
        self._stop_file: Path | None = None
        self.current: Plan | None = None  # the plan running now (the supervisor keeps it)
        self.answer: Callable[[Order, str], None] | None = None  # tells an order's asker what came of it

    def resize(self, order: Order) -> None:
        with self._lock:
            now = self.current
            if now is not None and order.devices == now.num_devices and order.plan in (None, now):
                # nothing to move: no stop, no save
                if self.answer is not None:
                    self.answer(order, f"already on {order.devices} devices with that plan")
                return
            self._order = order
            self._poke()

    def stop(self, reason: str) -> None:
        with self._lock:
            self._stop = reason
            self._poke()

    @property
    def stopping(self) -> str | None:
        return self._stop

    def arm(self, stop_file: Path | None) -> None:
        """The launch in progress watches `stop_file` (None: no launch is running)."""
        with self._lock:
            self._stop_file = stop_file
            self._poke()

    def take_order(self) -> Order | None:
        with self._lock:
            order, self._order = self._order, None
            return order

    def _poke(self) -> None:
        if self._stop_file is not None and (self._order is not None or self._stop is not None):
            self._stop_file.parent.mkdir(parents=True, exist_ok=True)
            self._stop_file.touch()


@dataclass
class Elastic:
    """How a run checkpoints, resizes and recovers (defaults: a plain run that saves only when
    stopped or resized, into a temporary run directory removed at the end)."""

    run_dir: Path | None = None
    every: int | None = None
    resizes: list[tuple[int, int]] = field(default_factory=list)  # (step, devices), scripted
    replan: Replan | None = None
    control: Control | None = None
    resume: Path | None = None  # a checkpoint, or a run directory (its latest complete checkpoint)
    max_restarts: int = 3
    available: Callable[[], int | None] | None = None  # devices this host has now; None: any count
    tag: str = ""  # prefix of this process's checkpoint names (a worker: the claim's attempt)
    on_checkpoint: Callable[[str, int], None] | None = None  # (run directory, step) after each save
    on_segments: Callable[[list[Segment]], None] | None = None  # closed segments and the running one
    on_note: Callable[[str], None] | None = None
    on_order: Callable[[Order, str], None] | None = None  # (order, outcome) once an order is applied or refused
    nodes: int = 1  # > 1: each launch runs as this many torchrun nodes on this machine (worker.nodes)
    rendezvous: Rendezvous | None = None  # this machine is one node of a gang's run (worker.gang)


def check_resizes(resizes: list[tuple[int, int]], steps: int) -> None:
    """Scripted resizes: steps strictly inside the run, increasing; device counts positive."""
    last = 0
    for step, devices in resizes:
        if not 0 < step < steps:
            raise InputError(f"--resize {step}:{devices}: the step must be between 1 and {steps - 1} "
                             f"(the run has {steps} steps)")
        if step <= last:
            raise InputError(f"--resize: steps must increase ({step} after {last})")
        if devices < 1:
            raise InputError(f"--resize {step}:{devices}: the device count must be positive")
        last = step


def _host_devices(device: str) -> Callable[[], int | None]:
    return (lambda: cuda_devices()) if device == "cuda" else (lambda: None)


def _segment(plan: Plan, spec: ExecSpec, step: int, cause: str) -> Segment:
    return Segment(from_step=step, to_step=step, devices=plan.num_devices, plan_summary=plan.summary,
                   plan=plan.model_dump(mode="json"), cause=cause, ended="running",
                   predicted=Predicted(time_s=spec.predicted_time_s, memory_bytes=spec.predicted_memory_bytes))


class _Supervisor:
    def __init__(self, plan: Plan, settings: RunSettings, opts: Elastic, *, progress: Callable[[int, int], None] | None,
                 show_progress: bool, max_procs: int | None, timeout: float | None) -> None:
        self.plan, self.settings, self.opts = plan, settings, opts
        self.progress, self.max_procs, self.timeout = progress, max_procs, timeout
        self.show_progress = show_progress
        self.temporary = opts.run_dir is None
        self.run_dir = Path(opts.run_dir or tempfile.mkdtemp(prefix="paretoplan-run-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.control = opts.control or Control()
        self.control.answer = self._answer
        self.available = opts.available or _host_devices(settings.device)
        self.scripted = sorted(opts.resizes)
        self.segments: list[Segment] = []  # closed
        self.losses: list[float] = []
        self.times: list[float] = []
        self.step = 0
        self.resume: Path | None = None
        self.cause = "launch"
        # what the next launch's resize took before it started: save_s, replan_s, and the wall
        # time the previous launch ended (its restart is measured from there)
        self.pending: dict[str, float] = {"save_s": 0.0, "replan_s": 0.0, "since": time.time()}
        self.launches = 0
        self.started = datetime.now(UTC)

    # ---- resuming -----------------------------------------------------------------------------
    def start_from(self, where: Path) -> None:
        """Go on from a checkpoint (or a run directory's latest), as its history says."""
        path = checkpoint.latest(where) if not (where / checkpoint.META).is_file() else where
        if path is None:
            return  # nothing saved yet: from step 0
        meta = checkpoint.read_meta(path)
        hist = meta.history
        self.segments = [Segment.model_validate(s) for s in hist.get("segments", [])]
        current = hist.get("current")
        if current is not None:  # the launch that was running when this checkpoint was written
            lost = Segment.model_validate({**current, "to_step": meta.step, "ended": "failed",
                                           "error": current.get("error") or "its process was lost"})
            self.segments.append(lost)
            self.plan = Plan.model_validate(current["plan"])
        elif self.segments:
            self.plan = Plan.model_validate(self.segments[-1].plan)
        self.losses, self.times, self.step = list(meta.losses), list(meta.step_times_s), meta.step
        self.resume, self.cause = path, "restart"

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> RunReport:
        bar = Progress([Job(spec=analyze(self.plan), settings=self.settings)], enabled=self.show_progress,
                       resumable=True)
        try:
            if self.opts.resume is not None:
                self.start_from(self.opts.resume)
                self._fit_to_host()
            while True:
                outcome = self._launch(bar)
                if outcome is not None:
                    return outcome
        except RunStopped:
            self.temporary = False  # its checkpoint is what the run goes on from
            raise
        finally:
            bar.close()
            self.control.arm(None)
            if self.temporary:
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def _remaining(self) -> float | None:
        if self.timeout is None:
            return None
        left = self.timeout - (datetime.now(UTC) - self.started).total_seconds()
        if left <= 0:
            raise RunFailed(f"run exceeded its time limit of {self.timeout:.0f} s")
        return left

    def _launch(self, bar: Progress) -> RunReport | None:
        """One launch; the report when the run is done, None when another launch follows."""
        spec = analyze(self.plan)
        nodes = self.opts.rendezvous.nnodes if self.opts.rendezvous else self.opts.nodes
        check_capacity(spec, self.settings.device, self.max_procs, nodes=1 if self.opts.nodes > 1 else nodes)
        check_nodes(self.plan, nodes)
        current = _segment(self.plan, spec, self.step, self.cause)
        while True:  # a run directory resumed by another process holds its launches too
            k = self.launches
            self.launches += 1
            workdir = self.run_dir / f"launch-{self.opts.tag}{k}"
            if self.opts.rendezvous is not None:  # every node of a gang its own folder, one checkpoint tag
                workdir = workdir.with_name(f"{workdir.name}-node{self.opts.rendezvous.node_rank}")
            if not workdir.exists():
                break
        stop_at = next((s for s, _ in self.scripted if s > self.step), None)
        ck = None
        blocker = checkpoint.checkpoint_blocker(spec)
        if blocker is None:
            ck = CheckpointSettings(dir=str(self.run_dir), tag=f"{self.opts.tag}{k}-", every=self.opts.every,
                                    resume=str(self.resume) if self.resume else None, stop_at=stop_at,
                                    stop_file=str(workdir / "stop"), history=self._history(current))
        elif self.resume is not None or stop_at is not None or self.opts.every:
            raise Unsupported(f"checkpoints of {blocker} are not supported yet: resize and --checkpoint-every need "
                              "another plan")
        job = Job(spec=spec, settings=self.settings.model_copy(update={"checkpoint": ck}))
        self._announce([*self.segments, current])

        def on_line(msg: dict) -> None:
            if "saved" in msg:
                if self.opts.on_checkpoint:
                    self.opts.on_checkpoint(str(self.run_dir), int(msg["at"]))
                return
            bar(msg)
            if self.progress is not None and "step" in msg:
                self.progress(msg["step"] + 1, msg["steps"])

        self.control.current = self.plan
        self.control.arm(workdir / "stop" if ck else None)
        try:
            if self.opts.nodes > 1:
                raw = run_local_nodes([job], self.opts.nodes, workdir=workdir, run_id=f"{workdir.name}-{id(self)}",
                                      progress=on_line, timeout=self._remaining())[0]
            else:
                raw = run_jobs([job], workdir=workdir, progress=on_line, timeout=self._remaining(),
                               rendezvous=self.opts.rendezvous)[0]
        except RunFailed as e:
            self.control.arm(None)
            self._after_failure(current, e)
            return None
        self.control.arm(None)
        return self._after_launch(job, raw, current)

    def _history(self, current: Segment) -> dict[str, Any]:
        return {"segments": [s.model_dump(mode="json") for s in self.segments],
                "current": current.model_dump(mode="json")}

    def _announce(self, segments: list[Segment]) -> None:
        if self.opts.on_segments:
            self.opts.on_segments(segments)

    def _answer(self, order: Order, outcome: str) -> None:
        if self.opts.on_order and order.id is not None:
            self.opts.on_order(order, outcome)

    def _note(self, message: str) -> None:
        if self.opts.on_note:
            self.opts.on_note(message)

    # ---- between launches ---------------------------------------------------------------------
    def _resize_times(self, raw: dict[str, Any] | None) -> ResizeTimes | None:
        if self.cause == "launch" and self.resume is None:
            return None
        p = self.pending
        load_s = restart_s = 0.0
        if raw is not None:
            records = [r["checkpoints"] for r in raw["ranks"] if r.get("checkpoints")]
            load_s = max((r["load"]["s"] for r in records if "load" in r), default=0.0)
            ready = max((r["ready_at"] for r in records if "ready_at" in r), default=p["since"])
            restart_s = max(0.0, ready - load_s - p["since"] - p["replan_s"])
        return ResizeTimes(save_s=p["save_s"], replan_s=p["replan_s"], restart_s=restart_s, load_s=load_s)

    def _after_launch(self, job: Job, raw: dict[str, Any], current: Segment) -> RunReport | None:
        first = raw.get("first_step", 0)
        measured = measured_of(job, raw)
        self.losses = self.losses[:first] + raw["losses"]
        self.times = self.times[:first] + measured.step_times_s
        end = first + len(raw["losses"])
        stopped = raw.get("stopped")
        closed = current.model_copy(update={
            "to_step": end, "ended": "finished" if stopped is None else "resize",
            "resize_s": self._resize_times(raw), "time_s": measured.time_s, "memory_bytes": measured.memory_bytes})
        if stopped is None:
            self.segments.append(closed)
            self._announce(self.segments)
            finished = datetime.now(UTC)
            return make_report(job, raw, self.started, finished, losses=self.losses, step_times_s=self.times,
                               segments=self.segments,
                               restarts=sum(s.cause == "restart" for s in self.segments))
        saved = [r["checkpoints"]["saves"][-1] for r in raw["ranks"] if (r.get("checkpoints") or {}).get("saves")]
        save_s = max(s["s"] for s in saved)
        since = max(s["done_at"] for s in saved)
        path = Path(stopped["checkpoint"])
        self.step, self.resume = stopped["step"], path
        order = self.control.take_order()
        if stopped["why"] == "stop_at":
            devices = next(d for s, d in self.scripted if s == self.step)
            order = Order(devices=devices)
        elif order is None:  # asked to stop (SIGTERM), not to resize
            self.segments.append(closed.model_copy(update={"ended": "stopped"}))
            checkpoint.annotate(path, {"segments": [s.model_dump(mode="json") for s in self.segments],
                                       "current": None})
            self._announce(self.segments)
            raise RunStopped(self.step, str(path))
        self.segments.append(closed)
        started = time.time()
        new_plan, outcome = self._plan_for(order)
        self.pending = {"save_s": save_s, "replan_s": time.time() - started, "since": since}
        self.plan, self.cause = new_plan, "resize"
        # a resume from this checkpoint (this process may die before the next one saves) takes the new layout
        nxt = _segment(self.plan, analyze(self.plan), self.step, self.cause)
        checkpoint.annotate(path, self._history(nxt))
        self._answer(order, outcome)
        if self.control.stopping:  # a SIGTERM during the resize: stop here, resumable from this checkpoint
            raise RunStopped(self.step, str(path))
        return None

    def _plan_for(self, order: Order) -> tuple[Plan, str]:
        """The plan to move to for `order`, or the current one when no plan can serve it (with a note)."""
        try:
            plan = order.plan
            if plan is None:
                if self.opts.replan is None:
                    raise InputError("this run has no way to re-plan (no job request to search)")
                plan = self.opts.replan(order.devices)
            if plan.num_devices != order.devices:
                raise InputError(f"the plan found is for {plan.num_devices} devices, not {order.devices}")
            check_capacity(analyze(plan), self.settings.device, self.max_procs)
            available = self.available()
            if available is not None and order.devices > available:
                raise Unsupported(f"this host has {available} devices")
        except (InputError, NoFeasiblePlan) as e:
            note = (f"resize to {order.devices} devices refused at step {self.step}: {e}; going on with "
                    f"{self.plan.num_devices} devices")
            self._note(note)
            return self.plan, f"refused: {e}"
        self._note(f"step {self.step}: resized to {order.devices} devices: {plan.summary}")
        return plan, f"resized to {order.devices} devices"

    def _after_failure(self, current: Segment, e: RunFailed) -> None:
        failed_at = time.time()
        restarts = sum(s.cause == "restart" for s in self.segments) + (current.cause == "restart")
        if not e.died or restarts >= self.opts.max_restarts:
            raise e
        latest = checkpoint.latest(self.run_dir)
        if latest is None:  # nothing saved: from the start
            step, losses, times = 0, [], []
            self.segments = []
        else:
            meta = checkpoint.read_meta(latest)
            step, losses, times = meta.step, list(meta.losses), list(meta.step_times_s)
        self.segments.append(current.model_copy(update={"to_step": step, "ended": "failed", "error": str(e),
                                                        "resize_s": self._resize_times(None)}))
        self._note(f"{e}: restarting from {'step 0' if latest is None else f'the checkpoint at step {step}'}")
        self.step, self.losses, self.times, self.resume, self.cause = step, losses, times, latest, "restart"
        started = time.time()
        self._fit_to_host()
        self.pending = {"save_s": 0.0, "replan_s": time.time() - started, "since": failed_at}
        self._announce(self.segments)

    def _fit_to_host(self) -> None:
        """Re-plan for the devices this host has when it has fewer than the plan's."""
        available = self.available()
        if available is None or available >= self.plan.num_devices:
            return
        if self.opts.replan is None:
            raise RunFailed(f"the plan needs {self.plan.num_devices} devices, {available} remain, and this run "
                            f"cannot re-plan")
        self.plan = self.opts.replan(available)
        self._note(f"re-planned for the {available} devices that remain: {self.plan.summary}")


def run_plan(plan: Plan | dict, steps: int = 20, *, settings: RunSettings | None = None,
             elastic: Elastic | None = None, progress: Callable[[int, int], None] | None = None,
             show_progress: bool = False, max_procs: int | None = None, timeout: float | None = None) -> RunReport:
    """Run one Plan on this machine and return its RunReport (the entry of `paretoplan run` and of
    the service's worker): `progress(step, total)` after every step; `elastic` says how it
    checkpoints, resizes and recovers (RunStopped when it was asked to stop)."""
    from worker.launch import default_device

    plan = plan if isinstance(plan, Plan) else Plan.model_validate(plan)
    st = settings or RunSettings(steps=steps, device=default_device())
    opts = elastic or Elastic()
    check_resizes(opts.resizes, st.steps)
    nodes = opts.rendezvous.nnodes if opts.rendezvous else opts.nodes
    check_capacity(analyze(plan), st.device, max_procs, nodes=1 if opts.nodes > 1 else nodes)
    check_nodes(plan, nodes)
    return _Supervisor(plan, st, opts, progress=progress, show_progress=show_progress, max_procs=max_procs,
                       timeout=timeout).run()
