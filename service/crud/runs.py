"""Runs: a strategy launched on workers, and what they measured (the RunReport a worker posted)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from search import InputError, RunReport, confidence
from service.crud import events, jobs, searches
from service.crud.errors import Conflict, get_or_404
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
    st = get_or_404(s, Strategy, strategy_id, "strategy")
    if st.search_id not in jobs.search_ids(s, job):
        raise InputError(f"strategy {strategy_id} is not on a frontier of job {job_id}")
    run = Run(job_id=job_id, strategy_id=strategy_id, steps=steps, status=QUEUED, progress=0.0, attempts=0,
              stage=QUEUED)
    s.add(run)
    s.flush()
    events.add(s, "status", run_id=run.id, job_id=job_id, stage=QUEUED,
               message=f"run {run.id} of strategy {strategy_id} ({st.summary}) queued for a worker")
    plan = st.plan or {}
    predicted = plan.get("predicted") or {}
    # plans stored before they recorded priced_from: a plan with no estimated cost had a profile
    if predicted.get("priced_from", "catalog" if predicted.get("estimated", True) else "profile") == "catalog":
        sure = confidence("catalog", plan.get("model"), plan.get("num_devices"), via="api")
        events.add(s, "info", run_id=run.id, job_id=job_id, message=f"run {run.id}'s prediction was {sure.message}")
    return run


def get(s: Session, run_id: int) -> Run:
    return get_or_404(s, Run, run_id, "run", options=[undefer(Run.report)])


def measured(report: RunReport | None) -> Metrics | None:
    if report is None:
        return None
    return Metrics(time_s=report.measured.time_s, memory_bytes=report.measured.memory_bytes)


def out(s: Session, run: Run) -> RunOut:
    st = s.get_one(Strategy, run.strategy_id)  # a run's strategy exists (a foreign key)
    return RunOut(id=run.id, job_id=run.job_id, strategy_id=run.strategy_id, status=run.status, steps=run.steps,
                  step=run.step, stage=run.stage, progress=run.progress, attempts=run.attempts,
                  worker=run.lease_owner, error=run.error, checkpoint=run.checkpoint,
                  predicted=Metrics(time_s=st.time_s, memory_bytes=st.memory_bytes),
                  measured=measured(run.report), report=run.report, created_at=run.created_at,
                  started_at=run.started_at, finished_at=run.finished_at)


def for_job(s: Session, job_id: int) -> list[Run]:
    jobs.get(s, job_id)
    return list(s.scalars(select(Run).where(Run.job_id == job_id).order_by(Run.id)))
