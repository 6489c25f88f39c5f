"""Runs: a strategy launched on workers, and what they measured."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from search import InputError
from service.crud import events, jobs, searches
from service.crud.errors import Conflict, NotFound
from service.models import DONE, QUEUED, Run, Strategy
from service.schemas import Metrics, RunOut


def launch(s: Session, job_id: int, strategy_id: int | None, steps: int) -> Run:
    job = jobs.get(s, job_id)
    search = searches.get(s, job.search_id)
    if strategy_id is None:
        if search.status != DONE:
            raise Conflict(f"job {job_id} is still searching ({search.status}); launch when it is done")
        strategy_id = job.selected_strategy_id
        if strategy_id is None:
            picked = searches.picked(s, search)
            if picked is None:
                raise Conflict(f"no plan of job {job_id} fits its memory budget; launch one by strategy_id")
            strategy_id = picked.id
    st = s.get(Strategy, strategy_id)
    if st is None:
        raise NotFound(f"no strategy {strategy_id}")
    if st.search_id not in jobs.search_ids(s, job):
        raise InputError(f"strategy {strategy_id} is not on a frontier of job {job_id}")
    run = Run(job_id=job_id, strategy_id=strategy_id, steps=steps, status=QUEUED, progress=0.0, attempts=0,
              stage=QUEUED)
    s.add(run)
    s.flush()
    events.add(s, "status", run_id=run.id, job_id=job_id, stage=QUEUED,
               message=f"run {run.id} of strategy {strategy_id} ({st.summary}) queued for a worker")
    return run


def get(s: Session, run_id: int) -> Run:
    run = s.scalars(select(Run).where(Run.id == run_id).options(undefer(Run.report))).first()
    if run is None:
        raise NotFound(f"no run {run_id}")
    return run


def _first(d: Any, *paths: str) -> Any:
    """The first of several dotted paths present in a nested dict (RunReport's layout may grow)."""
    for path in paths:
        cur = d
        for part in path.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is not None:
            return cur
    return None


def measured(report: dict | None) -> Metrics | None:
    if not report:
        return None
    t = _first(report, "measured.time_s", "measured_time_s", "measured.step_time_s", "step_time_s")
    m = _first(report, "measured.memory_bytes", "measured_memory_bytes", "measured.peak_memory_bytes",
               "peak_memory_bytes")
    return Metrics(time_s=t, memory_bytes=int(m) if m is not None else None)


def out(s: Session, run: Run) -> RunOut:
    st = s.get(Strategy, run.strategy_id)
    return RunOut(id=run.id, job_id=run.job_id, strategy_id=run.strategy_id, status=run.status, steps=run.steps,
                  step=run.step, stage=run.stage, progress=run.progress, attempts=run.attempts,
                  worker=run.lease_owner, error=run.error, checkpoint=run.checkpoint,
                  predicted=Metrics(time_s=st.time_s, memory_bytes=st.memory_bytes),
                  measured=measured(run.report), report=run.report, created_at=run.created_at,
                  started_at=run.started_at, finished_at=run.finished_at)


def for_job(s: Session, job_id: int) -> list[Run]:
    jobs.get(s, job_id)
    return list(s.scalars(select(Run).where(Run.job_id == job_id).order_by(Run.id)))
