"""The job queue: `searches` and `runs` rows claimed by workers under a lease.

A claim is one statement on both databases:

    UPDATE t SET status='running', lease_token=..., lease_expires_at=now+lease, attempts=attempts+1
    WHERE id = (SELECT id FROM t WHERE <claimable> ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
      AND <claimable> RETURNING ...

where <claimable> is "queued, or running with an expired lease" (an expired lease is how a lost
worker's task goes back to the queue). The one dialect difference lives in that subquery:
PostgreSQL gets FOR UPDATE SKIP LOCKED, so concurrent claimers take different rows instead of
waiting on one another; SQLAlchemy renders nothing for it on SQLite, where the single UPDATE is
atomic anyway (and the write transaction is BEGIN IMMEDIATE, see service.db).

Every later call of the claimer names the token of its claim; a heartbeat, progress or result
with a token that is no longer the task's (the lease expired and someone else claimed it) is
refused with `LeaseLost`, so a task finishes exactly once. A result must also be a valid report
of the task: a RunReport posted for a run must be of that run's plan and steps (`InputError`, 422,
and nothing is stored, otherwise).

Every time here (lease expiry, heartbeat, start and finish) is read from `clock`, the real UTC
clock unless the app was made with another (tests advance one instead of sleeping past a lease).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import ColumnElement, and_, func, insert, literal, null, or_, select, update
from sqlalchemy.orm import Session, aliased

from search import FrontierReport, InputError, Plan, RunReport, SearchSummary
from service.crud import events
from service.crud.errors import Conflict
from service.db import Database
from service.models import DONE, FAILED, QUEUED, RUNNING, Clock, Job, Resize, Run, Search, Strategy, utcnow

Kind = Literal["search", "run"]
Table = type[Search] | type[Run]
TABLES: dict[Kind, Table] = {"search": Search, "run": Run}


RUN_PROGRESS = ("checkpoint", "devices", "segments")  # run columns a heartbeat may set


class LeaseLost(Conflict):
    """The claim's token is not the task's any more (or the task is not running)."""


@dataclass
class Claim:
    kind: Kind
    id: int
    token: str
    attempt: int
    lease_seconds: float
    lease_expires_at: datetime
    payload: dict[str, Any]


def _claimable(T: Table, now: datetime) -> ColumnElement[bool]:
    return or_(T.status == QUEUED, and_(T.status == RUNNING, T.lease_expires_at < now))


def _event_ids(kind: Kind, row_id: int, job_id: int | None = None) -> dict[str, int | None]:
    return {"search_id": row_id} if kind == "search" else {"run_id": row_id, "job_id": job_id}


def fail_exhausted(s: Session, kind: Kind, now: datetime, max_attempts: int) -> None:
    """Tasks whose lease expired after their last allowed attempt fail instead of running again."""
    T = TABLES[kind]
    stmt = (update(T).where(T.status == RUNNING, T.lease_expires_at < now, T.attempts >= max_attempts)
            .values(status=FAILED, error_kind="lease", finished_at=now, stage=FAILED,
                    error=literal(f"gave up after {max_attempts} attempts: every worker that claimed it stopped "
                                  "heartbeating (the last was ") + func.coalesce(T.lease_owner, "?") + literal(")"))
            .returning(T.id, T.lease_owner, Run.job_id if kind == "run" else null()))
    for row_id, owner, job_id in s.execute(stmt).all():
        events.add(s, "status", stage=FAILED, message=f"lease of {owner} expired on its last attempt; failed",
                   **_event_ids(kind, row_id, job_id))


def claim(db: Database, worker: str, kinds: list[Kind], lease_seconds: float, max_attempts: int, *,
          clock: Clock = utcnow) -> Claim | None:
    for kind in kinds:
        T = TABLES[kind]
        with db.write_session() as s:
            now = clock()
            fail_exhausted(s, kind, now, max_attempts)
            inner = aliased(T)
            pick = (select(inner.id).where(_claimable(inner, now)).order_by(inner.id).limit(1)
                    .with_for_update(skip_locked=True).scalar_subquery())
            token = uuid.uuid4().hex
            expires = now + timedelta(seconds=lease_seconds)
            stmt = (update(T).where(T.id == pick, _claimable(T, now))
                    .values(status=RUNNING, lease_owner=worker, lease_token=token, lease_expires_at=expires,
                            heartbeat_at=now, attempts=T.attempts + 1, stage="claimed",
                            started_at=now)
                    .returning(T.id, T.attempts))
            row = s.execute(stmt).first()
            if row is None:
                continue
            task_id, attempt = row
            again = f", attempt {attempt}: the previous lease expired" if attempt > 1 else ""
            payload: dict[str, Any]
            if kind == "search":
                request = s.scalar(select(Search.request).where(Search.id == task_id))
                payload = {"request": request}
                events.add(s, "status", search_id=task_id, stage=RUNNING, message=f"claimed by {worker}{again}")
            else:
                run = s.scalars(select(Run).where(Run.id == task_id)).one()
                plan = s.scalar(select(Strategy.plan).where(Strategy.id == run.strategy_id))
                request = s.scalar(select(Job.request).where(Job.id == run.job_id))
                payload = {"plan": plan, "steps": run.steps, "job_id": run.job_id, "strategy_id": run.strategy_id,
                           "request": request, "checkpoint": run.checkpoint, "checkpoint_every": run.checkpoint_every}
                events.add(s, "status", run_id=task_id, job_id=run.job_id, stage=RUNNING,
                           message=f"claimed by {worker}{again}")
            return Claim(kind, task_id, token, attempt, lease_seconds, expires, payload)
    return None


def _owned(T: Table, task_id: int, token: str) -> ColumnElement[bool]:
    return and_(T.id == task_id, T.lease_token == token, T.status == RUNNING)


def heartbeat(db: Database, kind: Kind, task_id: int, token: str, lease_seconds: float, *, stage: str | None = None,
              fraction: float | None = None, message: str | None = None, step: int | None = None,
              run: dict[str, Any] | None = None, clock: Clock = utcnow, max_hold_seconds: float | None = None) -> datetime:
    """Renew the lease (and record progress); LeaseLost when the claim is not the task's any more.
    `run`: columns of a run its worker reports (checkpoint, devices, segments). `max_hold_seconds`:
    a claim older than this is not renewed (a worker stuck in a loop that still heartbeats lets go)."""
    T = TABLES[kind]
    with db.write_session() as s:
        now = clock()
        if max_hold_seconds is not None:
            since = s.scalar(select(T.started_at).where(_owned(T, task_id, token)))
            if since is not None and (now - since).total_seconds() > max_hold_seconds:
                raise LeaseLost(f"{kind} {task_id} has been claimed for longer than the maximum hold of "
                                f"{max_hold_seconds:.0f} s: let go")
        expires = now + timedelta(seconds=lease_seconds)
        values: dict[str, Any] = {"lease_expires_at": expires, "heartbeat_at": now}
        if stage is not None:
            values["stage"] = stage
        if fraction is not None:
            values["progress"] = fraction
        if kind == "run" and step is not None:
            values["step"] = step
        if kind == "run" and run:
            values.update({k: v for k, v in run.items() if k in RUN_PROGRESS and v is not None})
        stmt = (update(T).where(_owned(T, task_id, token)).values(**values)
                .returning(T.id, Run.job_id if kind == "run" else null()))
        row = s.execute(stmt).first()
        if row is None:
            raise LeaseLost(_lost(s, T, kind, task_id))
        if stage is not None or fraction is not None or message:
            events.add(s, "progress", stage=stage, fraction=fraction, message=message,
                       **_event_ids(kind, task_id, row[1]))
        return expires


def _lost(s: Session, T: Table, kind: Kind, task_id: int) -> str:
    row = s.execute(select(T.status, T.lease_owner).where(T.id == task_id)).first()
    if row is None:
        return f"no {kind} {task_id}"
    if row[0] != RUNNING:
        return f"{kind} {task_id} is {row[0]}, not running: this claim is over"
    return f"{kind} {task_id} was claimed again (by {row[1]}) after this claim's lease expired"


def complete_search(db: Database, task_id: int, token: str, report: FrontierReport, *, clock: Clock = utcnow) -> None:
    with db.write_session() as s:
        now = clock()
        least = min((p.memory_bytes for p in report.frontier), default=None)
        summary = SearchSummary.model_validate(report.model_dump(include=set(SearchSummary.model_fields)))
        done = s.execute(update(Search).where(_owned(Search, task_id, token))
                         .values(status=DONE, stage=DONE, progress=1.0, finished_at=now, summary=summary,
                                 frontier_size=len(report.frontier), picked_index=report.picked,
                                 least_memory_bytes=least, error=None, error_kind=None)
                         .returning(Search.id)).first()
        if done is None:
            raise LeaseLost(_lost(s, Search, "search", task_id))
        rows = [dict(search_id=task_id, kind="frontier", idx=i, name=None, description=None, time_s=p.time_s,
                     memory_bytes=p.memory_bytes, summary=str(p.plan.get("summary", "")), against_frontier=None,
                     plan=p.plan) for i, p in enumerate(report.frontier)]
        rows += [dict(search_id=task_id, kind="baseline", idx=i, name=b.name, description=b.description,
                      time_s=b.time_s, memory_bytes=b.memory_bytes, summary=str(b.plan.get("summary", "")),
                      against_frontier=b.against_frontier, plan=b.plan) for i, b in enumerate(report.baselines)]
        if rows:
            s.execute(insert(Strategy), rows)
        fit = (f"fastest within the budget: #{report.picked}" if report.picked is not None
               else "no plan fits the memory budget")
        events.add(s, "status", search_id=task_id, stage=DONE, fraction=1.0,
                   message=f"done: {len(report.frontier)} Pareto-optimal plans in {report.search_seconds:.2f} s; {fit}")


def close_orders(s: Session, run_id: int, now: datetime, outcome: str) -> None:
    """Resize orders of a run that ends before its worker answered them are answered here."""
    s.execute(update(Resize).where(Resize.run_id == run_id, Resize.outcome.is_(None))
              .values(outcome=outcome, answered_at=now))


def check_answers(report: RunReport, run_id: int, steps: int, plan: dict[str, Any]) -> None:
    """InputError unless the report is of run `run_id`: its plan (`plan`, as stored; the first
    segment's when it was resized) and its steps."""
    if report.steps != steps:
        raise InputError(f"report: {report.steps} steps, but run {run_id} was launched for {steps}")
    launched = report.segments[0] if report.segments else report
    if launched.plan != Plan.model_validate(plan).model_dump(mode="json"):  # both normalised the same way
        raise InputError(f"report: its plan ({launched.plan_summary!r}) is not the plan of run {run_id}")


def complete_run(db: Database, task_id: int, token: str, report: RunReport, *, clock: Clock = utcnow) -> None:
    with db.write_session() as s:
        now = clock()
        owned = s.execute(select(Run.steps, Strategy.plan).join(Strategy, Strategy.id == Run.strategy_id)
                          .where(_owned(Run, task_id, token))).first()
        if owned is None:
            raise LeaseLost(_lost(s, Run, "run", task_id))
        steps, plan = owned
        check_answers(report, task_id, steps, plan)
        done = s.execute(update(Run).where(_owned(Run, task_id, token))
                         .values(status=DONE, stage=DONE, progress=1.0, finished_at=now, report=report,
                                 error=None, error_kind=None)
                         .returning(Run.id, Run.job_id)).first()
        if done is None:
            raise LeaseLost(_lost(s, Run, "run", task_id))
        close_orders(s, task_id, now, "not carried out: the run finished first")
        events.add(s, "status", run_id=task_id, job_id=done[1], stage=DONE, fraction=1.0, message="run finished")


def fail(db: Database, kind: Kind, task_id: int, token: str, error: str, *, input_error: bool, retry: bool,
         max_attempts: int, clock: Clock = utcnow, handback: bool = False) -> str:
    """Fail the task, or put it back in the queue when asked and attempts remain; the new status.
    `handback`: a stopping worker returns it unharmed: queued again, its claim not counted."""
    T = TABLES[kind]
    with db.write_session() as s:
        now = clock()
        attempts = s.scalar(select(T.attempts).where(_owned(T, task_id, token)))
        if attempts is None:
            raise LeaseLost(_lost(s, T, kind, task_id))
        again = handback or (retry and not input_error and attempts < max_attempts)
        status = QUEUED if again else FAILED
        values: dict[str, Any] = (
            dict(status=QUEUED, stage=QUEUED, lease_owner=None, lease_token=None, lease_expires_at=None, error=error,
                 attempts=T.attempts - 1 if handback else T.attempts)
            if again else
            dict(status=FAILED, stage=FAILED, finished_at=now, error=error, error_kind="input" if input_error else "internal"))
        stmt = (update(T).where(_owned(T, task_id, token)).values(**values)
                .returning(T.id, Run.job_id if kind == "run" else null()))
        r = s.execute(stmt).first()
        if r is None:
            raise LeaseLost(_lost(s, T, kind, task_id))
        if kind == "run" and status == FAILED:
            close_orders(s, task_id, now, "not carried out: the run failed")
        events.add(s, "status", stage=status, message=("handed back, queued again: " if handback else
                                                      "failed, queued again: " if again else "failed: ") + error,
                   **_event_ids(kind, task_id, r[1]))
        return status
