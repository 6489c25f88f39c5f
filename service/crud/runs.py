"""Runs: a strategy launched on workers, what they measured (the RunReport a worker posted), and
resizes ordered while they train."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, undefer

from search import InputError, RunReport, SearchRequest, confidence, format_size
from service.crud import events, jobs, resizes, searches
from service.crud.errors import Conflict, FieldError, get_or_404
from service.models import DONE, FAILED, QUEUED, RUNNING, Resize, Run, Search, Strategy, utcnow
from service.schemas import Metrics, ResizeOrder, RunOut, SegmentOut


def launch(s: Session, job_id: int, strategy_id: int | None, steps: int, checkpoint_every: int | None = None) -> Run:
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
              stage=QUEUED, checkpoint_every=checkpoint_every, devices=st.plan["num_devices"] if st.plan else None)
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
    # a run resized onto another plan is measured against that plan's prediction
    moved = run.report is not None and run.report.plan_summary != st.summary
    predicted = (Metrics(time_s=run.report.predicted.time_s, memory_bytes=run.report.predicted.memory_bytes)
                 if run.report is not None and moved else Metrics(time_s=st.time_s, memory_bytes=st.memory_bytes))
    order = pending_resize(s, run.id)
    return RunOut(id=run.id, job_id=run.job_id, strategy_id=run.strategy_id, status=run.status, steps=run.steps,
                  step=run.step, stage=run.stage, progress=run.progress, attempts=run.attempts,
                  worker=run.lease_owner, error=run.error, checkpoint=run.checkpoint,
                  checkpoint_every=run.checkpoint_every, devices=run.devices,
                  segments=[SegmentOut.model_validate(x) for x in run.segments or []],
                  resize=resizes.out(s, order) if order is not None else None,
                  predicted=predicted, measured=measured(run.report), report=run.report, created_at=run.created_at,
                  started_at=run.started_at, finished_at=run.finished_at)


# ---- resizing a running run ---------------------------------------------------------------------
def request_resize(s: Session, run_id: int, req: SearchRequest, devices: int, memory: int | None) -> Resize:
    """Order run `run_id` onto `devices`: Conflict unless it is running; a FieldError (422)
    when the stored frontier for them has no plan within the budget. The run's worker learns of it with its next
    heartbeat, moves at the next step boundary and answers (`answer_resize`)."""
    run = get(s, run_id)
    if run.status != RUNNING:
        raise Conflict(f"run {run_id} is {run.status}, not running: only a running run can be resized "
                       f"(launch a new run on the job's frontier for {devices} devices instead)")
    r = resizes.create(s, run.job_id, req, devices, memory)
    search = searches.get(s, r.search_id)
    if search.status == DONE and search.picked_index is None:
        least = f"; the leanest needs {format_size(search.least_memory_bytes)} per device" \
            if search.least_memory_bytes is not None else ""
        raise FieldError("devices", f"no plan of job {run.job_id} on {devices} devices fits its memory budget{least}")
    if search.status == FAILED and search.error_kind == "input":
        raise InputError(f"the job cannot be planned on {devices} devices: {search.error}")
    for older in s.scalars(select(Resize).where(Resize.run_id == run_id, Resize.outcome.is_(None))):
        older.outcome, older.answered_at = f"replaced by resize {r.id}", utcnow()
    r.run_id = run_id
    s.flush()
    events.add(s, "info", run_id=run_id, job_id=run.job_id,
               message=f"resize {r.id}: to {devices} devices at the next step boundary")
    return r


def pending_resize(s: Session, run_id: int) -> Resize | None:
    return s.scalars(select(Resize).where(Resize.run_id == run_id, Resize.outcome.is_(None))
                     .order_by(Resize.id.desc())).first()


def resize_order(s: Session, run_id: int) -> ResizeOrder | None:
    """The resize the run's worker is to carry out, with the plan when its frontier is known."""
    r = pending_resize(s, run_id)
    if r is None:
        return None
    search = searches.get(s, r.search_id)
    st = searches.picked(s, search, with_plan=True) if search.status == DONE else None
    request = s.scalar(select(Search.request).where(Search.id == search.id))
    return ResizeOrder(id=r.id, devices=r.devices, plan=st.plan if st is not None else None,
                       strategy_id=st.id if st is not None else None, request=request)


def answer_resize(s: Session, run_id: int, resize_id: int, outcome: str) -> None:
    """The worker carried out (or refused) resize `resize_id` of run `run_id`."""
    r = s.get(Resize, resize_id)
    if r is None or r.run_id != run_id or r.outcome is not None:
        return  # replaced meanwhile, or answered twice: nothing to record
    r.outcome, r.answered_at = outcome[:4000], utcnow()
    events.add(s, "info", run_id=run_id, job_id=r.job_id, message=f"resize {resize_id}: {outcome}")


def for_job(s: Session, job_id: int) -> list[Run]:
    jobs.get(s, job_id)
    return list(s.scalars(select(Run).where(Run.job_id == job_id).order_by(Run.id)))
