"""`paretoplan worker --api URL`: claim tasks over REST, run them, report back.

The loop: claim a task (a search or a run) -> heartbeat it from a background thread every third
of its lease, carrying progress -> post the result, or the failure. A 409 from the service means
the claim is over (the lease expired and another worker took the task): the work is dropped.

- A search runs `search.plans.api.run_search` in this process, so searches never run in the API server.
- A run executes its Plan through the worker package: `worker.launch`'s entry when it has one
  (imported lazily), else the command `paretoplan run --plan FILE --steps N --report FILE` in a
  subprocess when it exists; otherwise the run fails with a message saying so.

SIGTERM or SIGINT stops the worker: the task in hand is handed back to the queue at once
(`fail` with retry) rather than waiting for its lease to expire.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from service.client import LeaseLost, ServiceClient, ServiceError

log = logging.getLogger("paretoplan.worker")

LAUNCH_ENTRIES = ("run_plan", "launch_plan", "launch")


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT (BaseException: no `except Exception` eats it)."""


class _Abandon(Exception):
    """The lease was lost while working: stop and drop the task."""


class Lease:
    """Heartbeats of one claim, from a background thread; progress rides along with them."""

    def __init__(self, api: str, worker_token: str | None, task: dict, on_lost=None) -> None:
        self.client = ServiceClient(api, worker_token=worker_token, timeout=30.0)
        self.kind, self.id, self.token = task["kind"], task["id"], task["token"]
        self.interval = max(0.2, float(task["lease_seconds"]) / 3)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._on_lost = on_lost
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{self.kind}-{self.id}", daemon=True)

    def progress(self, **fields: Any) -> None:
        with self._lock:
            message = fields.pop("message", None)
            if message:  # messages between two beats are kept, joined; stage and fraction: the latest
                before = self._pending.get("message")
                self._pending["message"] = (f"{before}; {message}" if before else message)[-4000:]
            self._pending.update({k: v for k, v in fields.items() if v is not None})
        self._wake.set()

    def flush(self) -> None:
        """Send what progress is pending now (before the result ends the claim)."""
        with self._lock:
            body, self._pending = self._pending, {}
        if body and not self.lost.is_set():
            try:
                self.client.heartbeat(self.kind, self.id, self.token, **body)
            except (LeaseLost, httpx.HTTPError, ServiceError) as e:
                log.warning("last progress of %s %s not sent: %s", self.kind, self.id, e)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._lock:
                body, self._pending = self._pending, {}
            try:
                self.client.heartbeat(self.kind, self.id, self.token, **body)
            except LeaseLost as e:
                log.warning("%s %s: %s", self.kind, self.id, e.detail)
                self.lost.set()
                if self._on_lost is not None:
                    self._on_lost()
                return
            except (httpx.HTTPError, ServiceError) as e:  # the service restarting: try again next beat
                log.warning("heartbeat of %s %s failed: %s", self.kind, self.id, e)
                with self._lock:
                    self._pending = {**body, **self._pending}
            time.sleep(0.1)  # at most ~10 progress posts a second

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.client.close()


class Agent:
    def __init__(self, api: str, *, name: str | None = None, kinds: tuple[str, ...] = ("search", "run"),
                 poll_seconds: float = 1.0, worker_token: str | None = None, max_tasks: int | None = None,
                 exit_with_parent: bool = False) -> None:
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
        self._child: subprocess.Popen | None = None

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

    def _on_signal(self, signum, _frame) -> None:
        self._stopping = True
        if self._child is not None and self._child.poll() is None:
            _kill_group(self._child)
        raise Stopped(signal.Signals(signum).name)

    def process(self, task: dict) -> None:
        kind, task_id, token = task["kind"], task["id"], task["token"]
        log.info("claimed %s %s (attempt %s)", kind, task_id, task["attempt"])
        try:
            with Lease(self.api, self.token, task, on_lost=self._kill_child) as lease:
                result = self._search(task, lease) if kind == "search" else self._run(task, lease)
            # heartbeats have stopped: the result is the last word of this claim
            if kind == "search":
                self.client.search_result(task_id, token, result)
            else:
                self.client.run_result(task_id, token, result)
            log.info("%s %s done", kind, task_id)
        except (LeaseLost, _Abandon) as e:
            log.warning("%s %s dropped: the lease was lost (%s)", kind, task_id, e)
        except Stopped:
            self._give_back(kind, task_id, token, "the worker was stopped", retry=True)
            raise
        except Exception as e:  # noqa: BLE001 - every failure is reported, the loop goes on
            from search import InputError

            if isinstance(e, InputError):
                self._give_back(kind, task_id, token, str(e), input_error=True)
            else:
                log.error("%s %s failed:\n%s", kind, task_id, traceback.format_exc())
                self._give_back(kind, task_id, token, f"{type(e).__name__}: {e}")

    def _give_back(self, kind: str, task_id: int, token: str, error: str, **how: bool) -> None:
        try:
            self.client.fail(kind, task_id, token, error, **how)
        except (LeaseLost, ServiceError, httpx.HTTPError) as e:
            log.warning("could not report the failure of %s %s: %s", kind, task_id, e)

    # ---- searches ------------------------------------------------------------------------------
    def _search(self, task: dict, lease: Lease) -> str:
        from search import SearchRequest, run_search

        req = SearchRequest.model_validate(task["request"])

        def progress(stage: str, fraction: float, message: str | None = None) -> None:
            if lease.lost.is_set():
                raise _Abandon("lease lost")
            lease.progress(stage=stage, fraction=max(0.0, min(1.0, float(fraction))), message=message)

        outcome = run_search(req, progress=progress)
        if lease.lost.is_set():
            raise _Abandon("lease lost")
        lease.flush()
        return outcome.report.model_dump_json()

    # ---- runs ----------------------------------------------------------------------------------
    def _run(self, task: dict, lease: Lease) -> dict:
        plan, steps, checkpoint = task["plan"], int(task["steps"]), task.get("checkpoint")
        lease.progress(stage="launching", fraction=0.0)
        entry = launch_entry()
        if entry is not None:
            return _call_launch(entry, plan, steps, checkpoint, lease)
        if has_run_command():
            return self._run_subprocess(plan, steps, lease)
        raise RuntimeError("this worker cannot execute runs: worker/launch.py has no entry "
                           f"({', '.join(LAUNCH_ENTRIES)}) and `paretoplan run` does not exist yet")

    def _run_subprocess(self, plan: dict, steps: int, lease: Lease) -> dict:
        with tempfile.TemporaryDirectory(prefix="paretoplan-run-") as tmp:
            plan_path, report_path = Path(tmp) / "plan.json", Path(tmp) / "report.json"
            plan_path.write_text(json.dumps(plan))
            cmd = [sys.executable, "-m", "paretoplan", "run", "--plan", str(plan_path), "--steps", str(steps),
                   "--report", str(report_path)]
            lease.progress(stage="running", fraction=0.0, message=" ".join(cmd[1:]))
            self._child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                           start_new_session=True)
            tail: list[str] = []
            try:
                for line in self._child.stdout:
                    tail = (tail + [line.rstrip()])[-40:]
                code = self._child.wait()
            finally:
                child, self._child = self._child, None
                if child.poll() is None:
                    _kill_group(child)
            if lease.lost.is_set():
                raise _Abandon("lease lost")
            if code != 0:
                raise RuntimeError(f"`paretoplan run` exited with {code}: " + "\n".join(tail[-15:]))
            try:
                return json.loads(report_path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise RuntimeError(f"`paretoplan run` wrote no readable report: {e}") from None

    def _kill_child(self) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            _kill_group(child)


def _warm_up() -> None:
    """Import the search stack now, so the first claimed search does not pay for it under its lease."""
    import search.algorithm.ft  # noqa: F401
    import search.models.capture  # noqa: F401
    import search.models.zoo  # noqa: F401
    import search.plans.api  # noqa: F401


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def launch_entry():
    """worker.launch's entry point, imported lazily; None when there is none yet."""
    try:
        import worker.launch as launch
    except ImportError:
        return None
    for name in LAUNCH_ENTRIES:
        fn = getattr(launch, name, None)
        if callable(fn):
            return fn
    return None


def _call_launch(fn, plan: dict, steps: int, checkpoint: str | None, lease: Lease) -> dict:
    """Call worker.launch's entry with the arguments its signature names."""
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if "steps" in params:
        kwargs["steps"] = steps
    if "checkpoint" in params:
        kwargs["checkpoint"] = checkpoint
    if "progress" in params:
        def progress(step: int, total: int | None = None, **extra: Any) -> None:
            if lease.lost.is_set():
                raise _Abandon("lease lost")
            total = total or steps
            lease.progress(stage="training", step=int(step), fraction=min(1.0, step / max(total, 1)),
                           checkpoint=extra.get("checkpoint"))
        kwargs["progress"] = progress
    try:
        from search import Plan

        arg: Any = Plan.model_validate(plan)
    except Exception:  # noqa: BLE001 - an entry taking the dict is fine too
        arg = plan
    report = fn(arg, **kwargs)
    if hasattr(report, "model_dump"):
        return report.model_dump(mode="json")
    if isinstance(report, dict):
        return report
    raise RuntimeError(f"worker.launch.{fn.__name__} returned {type(report).__name__}, not a RunReport")


_RUN_COMMAND: bool | None = None


def has_run_command() -> bool:
    """Whether `paretoplan run` exists (asked once, by its --help)."""
    global _RUN_COMMAND
    if _RUN_COMMAND is None:
        r = subprocess.run([sys.executable, "-m", "paretoplan", "run", "--help"], capture_output=True, timeout=120)
        _RUN_COMMAND = r.returncode == 0
    return _RUN_COMMAND


def main(api: str, *, name: str | None = None, kinds: str = "search,run", poll_seconds: float = 1.0,
         max_tasks: int | None = None, exit_with_parent: bool = False) -> int:
    logging.basicConfig(level=os.environ.get("PARETOPLAN_LOG_LEVEL", "INFO"),
                        format="%(asctime)s worker %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    wanted = tuple(k.strip() for k in kinds.split(",") if k.strip())
    bad = [k for k in wanted if k not in ("search", "run")]
    if not wanted or bad:
        from search import InputError

        raise InputError(f"--kinds takes search, run or both separated by commas, got {kinds!r}")
    agent = Agent(api, name=name, kinds=wanted, poll_seconds=poll_seconds, max_tasks=max_tasks,
                  worker_token=os.environ.get("PARETOPLAN_WORKER_TOKEN"), exit_with_parent=exit_with_parent)
    return agent.serve()
