"""`paretoplan worker --api URL`: claim tasks over REST, run them, report back.

The loop: claim a task (a search or a run) -> heartbeat it from a background thread every third
of its lease, carrying progress -> post the result (a FrontierReport or a RunReport), or the
failure. A 409 from the service means the claim is over (the lease expired and another worker
took the task): the work is dropped, at the next progress report of the search or step of the run.

- A search runs `search.run_search` in this process, so searches never run in the API server.
- A run executes its Plan with `worker.elastic.run_plan` (torchrun on this machine), saving
  checkpoints to `<checkpoint dir>/run-<id>` (reported in the heartbeats; the service keeps it in
  the run's `checkpoint`). A resize order that comes back with a heartbeat is carried out at the
  next step boundary and answered; a run claimed again after its worker died resumes from the
  latest checkpoint of its run directory, re-planned (the job's request, the fastest plan within
  its budget) when this host has fewer devices.

SIGTERM or SIGINT stops the worker: the task in hand is handed back to the queue at once
(`fail` with retry) rather than waiting for its lease to expire. A run saves first, at its next
step boundary (a second signal does not wait), so the next claim goes on from there; its
torchrun and ranks are stopped on any way out (`worker.launch` kills them on any exception).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import httpx

from search import FrontierReport, InputError, NoFeasiblePlan, Plan, RunReport, SearchRequest, resized, run_search
from worker.bounded import Limits, bounded_search, task_tmpdir
from worker.client import Kind, LeaseLost, ServiceClient, ServiceError, Task
from worker.elastic import Control, Elastic, Order, RunStopped, run_plan

log = logging.getLogger("paretoplan.worker")

KINDS: tuple[Kind, ...] = ("search", "run")


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT (BaseException: no `except Exception` eats it)."""


class _Abandon(Exception):
    """The lease was lost while working: stop and drop the task."""


class Lease:
    """Heartbeats of one claim, from a background thread; progress rides along with them."""

    def __init__(self, api: str, worker_token: str | None, task: Task) -> None:
        self.client = ServiceClient(api, worker_token=worker_token, timeout=30.0)
        self.kind, self.id, self.token = task.kind, task.id, task.token
        self.interval = max(0.2, task.lease_seconds / 3)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{self.kind}-{self.id}", daemon=True)
        self.on_answer: Callable[[dict[str, Any]], None] | None = None  # what the service said back

    def progress(self, **fields: Any) -> None:
        with self._lock:
            message = fields.pop("message", None)
            if message:  # messages between two beats are kept, joined; stage and fraction: the latest
                before = self._pending.get("message")
                self._pending["message"] = (f"{before}; {message}" if before else message)[-4000:]
            self._pending.update({k: v for k, v in fields.items() if v is not None})
        self._wake.set()

    def check(self) -> None:
        """_Abandon when the lease is lost (called where the work can stop)."""
        if self.lost.is_set():
            raise _Abandon("lease lost")

    def flush(self) -> None:
        """Send what progress is pending now (before the result ends the claim)."""
        with self._lock:
            body, self._pending = self._pending, {}
        if body and not self.lost.is_set():
            try:
                self._answered(self.client.heartbeat(self.kind, self.id, self.token, **body))
            except (LeaseLost, httpx.HTTPError, ServiceError) as e:
                log.warning("last progress of %s %s not sent: %s", self.kind, self.id, e)

    def _answered(self, answer: dict[str, Any]) -> None:
        if self.on_answer is not None:
            self.on_answer(answer)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._lock:
                body, self._pending = self._pending, {}
            try:
                self._answered(self.client.heartbeat(self.kind, self.id, self.token, **body))
            except LeaseLost as e:
                log.warning("%s %s: %s", self.kind, self.id, e.detail)
                self.lost.set()
                return
            except (httpx.HTTPError, ServiceError) as e:  # the service restarting: try again next beat
                log.warning("heartbeat of %s %s failed: %s", self.kind, self.id, e)
                with self._lock:
                    self._pending = {**body, **self._pending}
            time.sleep(0.1)  # at most ~10 progress posts a second

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.client.close()


class Agent:
    def __init__(self, api: str, *, name: str | None = None, kinds: tuple[Kind, ...] = KINDS,
                 poll_seconds: float = 1.0, worker_token: str | None = None, max_tasks: int | None = None,
                 exit_with_parent: bool = False, checkpoint_dir: str | Path | None = None) -> None:
        self.api = api.rstrip("/")
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.kinds = list(kinds)
        self.poll = poll_seconds
        self.token = worker_token
        self.max_tasks = max_tasks
        self.parent = os.getppid() if exit_with_parent else None
        self.client = ServiceClient(self.api, worker_token=worker_token)
        self.done = 0
        self._stopping = False
        self.checkpoints = Path(checkpoint_dir or os.environ.get("PARETOPLAN_CHECKPOINT_DIR")
                                or "paretoplan-checkpoints").resolve()
        self._control: Control | None = None  # of the run in hand: a first SIGTERM asks it to save and stop
        self.limits = Limits.from_env()

    # ---- the loop ------------------------------------------------------------------------------
    def serve(self) -> int:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if "search" in self.kinds:
            _warm_up()
        log.info("worker %s claiming %s from %s", self.name, "+".join(self.kinds), self.api)
        backoff = self.poll
        try:
            while not self._stopping and (self.max_tasks is None or self.done < self.max_tasks):
                if self.parent is not None and os.getppid() != self.parent:
                    log.info("the process that started this worker is gone; stopping")
                    break
                try:
                    task = self.client.claim(self.name, self.kinds)
                except (httpx.TransportError, ServiceError) as e:
                    log.warning("cannot claim from %s: %s", self.api, e)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                backoff = self.poll
                if task is None:
                    time.sleep(self.poll)
                    continue
                self.process(task)
                self.done += 1
        except Stopped:
            log.info("worker %s stopped", self.name)
        finally:
            self.client.close()
        return 0

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping = True
        name = signal.Signals(signum).name
        if self._control is not None and self._control.stopping is None:
            self._control.stop(name)  # the run saves at its next step boundary, then RunStopped
            return
        raise Stopped(name)

    def process(self, task: Task) -> None:
        log.info("claimed %s %s (attempt %s)", task.kind, task.id, task.attempt)
        with task_tmpdir(f"paretoplan-{task.kind}-{task.id}-"):  # removed however the task ends
            self._process(task)

    def _process(self, task: Task) -> None:
        try:
            with Lease(self.api, self.token, task) as lease:
                result = self._search(task, lease) if task.kind == "search" else self._run(task, lease)
            # heartbeats have stopped: the result is the last word of this claim
            if isinstance(result, FrontierReport):
                self.client.search_result(task.id, task.token, result)
            else:
                self.client.run_result(task.id, task.token, result)
                shutil.rmtree(self.checkpoints / f"run-{task.id}", ignore_errors=True)  # done: nothing resumes it
            log.info("%s %s done", task.kind, task.id)
        except (LeaseLost, _Abandon) as e:
            log.warning("%s %s dropped: the lease was lost (%s)", task.kind, task.id, e)
        except RunStopped as e:
            self._give_back(task, f"the worker was stopped; {e}", retry=True, handback=True)
        except Stopped:
            self._give_back(task, "the worker was stopped", retry=True, handback=True)
            raise
        except InputError as e:  # the request or plan is at fault: final, no retry
            self._give_back(task, str(e), input_error=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported (with its trace logged), the loop goes on
            log.error("%s %s failed:\n%s", task.kind, task.id, traceback.format_exc())
            self._give_back(task, f"{type(e).__name__}: {e}")

    def _give_back(self, task: Task, error: str, *, input_error: bool = False, retry: bool = False,
                   handback: bool = False) -> None:
        try:
            self.client.fail(task.kind, task.id, task.token, error, input_error=input_error, retry=retry,
                             handback=handback)
        except (ServiceError, httpx.HTTPError) as e:
            log.warning("could not report the failure of %s %s: %s", task.kind, task.id, e)

    # ---- searches ------------------------------------------------------------------------------
    def _search(self, task: Task, lease: Lease) -> FrontierReport:
        req = SearchRequest.model_validate(task.request)

        def progress(stage: str, fraction: float, message: str | None = None) -> None:
            lease.check()
            lease.progress(stage=stage, fraction=max(0.0, min(1.0, float(fraction))), message=message)

        report = bounded_search(req, progress, self.limits)  # a child process, killed past its limits
        lease.check()
        lease.flush()
        return report

    # ---- runs ----------------------------------------------------------------------------------
    def _run(self, task: Task, lease: Lease) -> RunReport:
        if task.plan is None or task.steps is None:
            raise RuntimeError(f"the service handed out run {task.id} without its plan and steps")
        plan, steps = Plan.model_validate(task.plan), task.steps
        lease.progress(stage="launching", fraction=0.0)
        run_dir = self.checkpoints / f"run-{task.id}"
        resume = None
        if task.checkpoint:
            if Path(task.checkpoint).is_dir():
                run_dir = resume = Path(task.checkpoint)
            else:
                lease.progress(message=f"checkpoint directory {task.checkpoint} is not reachable from this worker: "
                                       f"starting from step 0")
        control = Control()
        seen: set[int] = set()

        def on_answer(answer: dict[str, Any]) -> None:
            order = answer.get("resize")
            if order and order["id"] not in seen:
                seen.add(order["id"])
                given = Plan.model_validate(order["plan"]) if order.get("plan") else None
                control.resize(Order(devices=order["devices"], plan=given, id=order["id"]))

        def progress(step: int, total: int) -> None:
            lease.check()
            lease.progress(stage="training", step=step, fraction=min(1.0, step / max(total, 1)))

        elastic = Elastic(
            run_dir=run_dir, every=task.checkpoint_every, control=control, resume=resume,
            replan=_replanner(task.request, plan.global_batch), tag=f"a{task.attempt}-",
            on_checkpoint=lambda where, step: lease.progress(checkpoint=where, message=f"checkpoint at step {step}"),
            on_segments=lambda segs: lease.progress(
                devices=segs[-1].devices, segments=[x.model_dump(mode="json", exclude={"plan", "predicted"})
                                                    for x in segs]),
            on_note=lambda note: lease.progress(message=note),
            on_order=lambda order, outcome: lease.progress(resize_id=order.id, resize_outcome=outcome))
        lease.on_answer = on_answer
        self._control = control
        try:
            report = run_plan(plan, steps, elastic=elastic, progress=progress, timeout=self.limits.run_seconds)
        except RunStopped as e:
            lease.progress(checkpoint=str(run_dir), message=str(e))
            lease.flush()
            raise
        finally:
            self._control = None
            lease.on_answer = None
        lease.check()
        lease.flush()
        return report


def _replanner(request: dict[str, Any] | None, global_batch: int) -> Callable[[int], Plan] | None:
    """How a run of this job re-plans for another device count: the job's search for that many
    devices (the global batch it trains with kept), and the job's rule, the fastest plan within its
    memory budget."""
    if request is None:
        return None
    req = SearchRequest.model_validate(request)

    def replan(devices: int) -> Plan:
        wanted = resized(req, devices, None, None).model_copy(update={"global_batch": global_batch})
        report = run_search(wanted).report
        if report.picked is None:
            least = min((p.memory_bytes for p in report.frontier), default=0)
            within = (f" and runs within its time target of {report.time_target_s * 1e3:.2f} ms"
                      if report.time_target_s is not None else "")
            raise NoFeasiblePlan(f"no plan on {devices} devices fits the job's memory budget{within}", least)
        return Plan.model_validate(report.frontier[report.picked].plan)

    return replan


def _warm_up() -> None:
    """Import the search stack now, so the first claimed search does not pay for it under its lease."""
    import search.algorithm.ft  # noqa: F401
    import search.models.capture  # noqa: F401
    import search.models.zoo  # noqa: F401
    import search.plans.api  # noqa: F401


def main(api: str, *, name: str | None = None, kinds: str = "search,run", poll_seconds: float = 1.0,
         max_tasks: int | None = None, exit_with_parent: bool = False, checkpoint_dir: str | None = None) -> int:
    logging.basicConfig(level=os.environ.get("PARETOPLAN_LOG_LEVEL", "INFO"),
                        format="%(asctime)s worker %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    wanted = list(dict.fromkeys(k.strip() for k in kinds.split(",") if k.strip()))  # in the order given
    by_name: dict[str, Kind] = {k: k for k in KINDS}
    if not wanted or any(k not in by_name for k in wanted):
        raise InputError(f"--kinds takes search, run or both separated by commas, got {kinds!r}")
    chosen = tuple(by_name[k] for k in wanted)
    token = os.environ.get("PARETOPLAN_WORKER_TOKEN", "").strip()
    if not token:
        raise InputError("a worker needs its token: set PARETOPLAN_WORKER_TOKEN to a token with the worker scope "
                         "(paretoplan token create --scopes worker, or the service's PARETOPLAN_WORKER_TOKEN)")
    agent = Agent(api, name=name, kinds=chosen, poll_seconds=poll_seconds, max_tasks=max_tasks,
                  worker_token=token, exit_with_parent=exit_with_parent,
                  checkpoint_dir=checkpoint_dir)
    return agent.serve()
